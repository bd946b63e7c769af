//! Command ring descriptors (core/src/desc/cmd.rs, pgt.rs): 32 bytes as a request (what the
//! emulated card reads from the driver) and as a response (what the driver reads from the
//! card), then the PGT staging rules and entries of an UpdatePGT with the bytes after it.
#![no_main]

use bluerdma_core::desc::cmd::{CmdRequest, CmdResponse};
use bluerdma_core::desc::pgt;
use bluerdma_fuzz::{check_desc_bits, descs};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some([d]) = descs::<1>(data) else {
        return;
    };
    if let Ok((req, user_data)) = CmdRequest::decode(&d) {
        let _ = req.validate();
        check_desc_bits(
            "command request",
            &[d],
            &(req, user_data),
            &[req.encode(user_data)],
            |x| CmdRequest::decode(&x[0]).ok(),
        );
        if let CmdRequest::UpdatePgt(u) = req {
            let _ = u.check_staging();
            let rest = &data[32..];
            match pgt::staged_entries(rest, u.entry_count) {
                Ok(entries) => {
                    let n = entries.count();
                    assert_eq!(n, u.entry_count as usize, "staged entries");
                }
                Err(_) => assert!(
                    rest.len() < u.entry_count as usize * 8,
                    "staged entries refused"
                ),
            }
        }
    }
    if let Ok(resp) = CmdResponse::decode(&d) {
        check_desc_bits("command response", &[d], &resp, &[resp.encode()], |x| {
            CmdResponse::decode(&x[0]).ok()
        });
    }
});
