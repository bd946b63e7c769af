//! Send ring descriptors (core/src/desc/send.rs): Seg0 and Seg1 as the emulated card reads
//! them from the driver's send ring.
#![no_main]

use bluerdma_core::desc::send::{SendRequest, SendSeg0, SendSeg1};
use bluerdma_core::desc::RawDesc;
use bluerdma_fuzz::{check_desc_bits, descs};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some([a, b]) = descs::<2>(data) else {
        if let Some([a]) = descs::<1>(data) {
            let _ = SendSeg0::decode(&a);
            let _ = SendSeg1::decode(&a);
        }
        return;
    };
    let Ok(req) = SendRequest::decode(&a, &b) else {
        return;
    };
    let [e0, e1] = req.encode();
    let (mut s0, mut s1) = (RawDesc::ZERO, RawDesc::ZERO);
    req.encode_into(&mut s0, &mut s1);
    assert_eq!([s0, s1], [e0, e1], "encode_into differs from encode");
    check_desc_bits("send request", &[a, b], &req, &[e0, e1], |x| {
        SendRequest::decode(&x[0], &x[1]).ok()
    });
});
