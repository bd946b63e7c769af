//! Tests of the codec (`codec.rs`).

use super::*;

#[test]
fn record_fields_in_place() {
    let wr = RecvWr {
        wr_id: 0x0102_0304_0506_0708,
        addr: 0x0000_7F12_3460_0040,
        length: 0x0001_0000,
        lkey: 0x001F_FEA6,
        qpn: 0x0123AB,
    };
    let bytes = wr.to_bytes().unwrap();
    assert_eq!(bytes[..8], [1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(bytes[24..], [0, 0x01, 0x23, 0xAB, 0, 0, 0, 0]);
    assert_eq!(RecvWr::parse(&bytes), Ok((wr, &[][..])));
}

#[test]
fn record_refuses_garbage() {
    let mut bytes = RecvWr::default().to_bytes().unwrap();
    bytes[31] = 1;
    assert_eq!(
        RecvWr::parse(&bytes),
        Err(OobError::ReservedNotZero {
            message: OobMessageKind::RecvWr,
            offset: 28,
            value: 1
        })
    );
    bytes[31] = 0;
    bytes[24] = 0x80;
    assert_eq!(
        RecvWr::parse(&bytes),
        Err(OobError::QpnOutOfRange { qpn: 0x8000_0000 })
    );
    assert_eq!(
        RecvWr::parse(&bytes[..31]),
        Err(OobError::Truncated {
            message: OobMessageKind::RecvWr,
            needed: 32,
            available: 31
        })
    );
}

#[test]
fn too_short_record_fields_in_place_and_dispatch_by_kind() {
    let rec = RecvTooShort {
        wr_id: 0x0102_0304_0506_0708,
        send_len: 0x0000_0065,
        qpn: 0x0123AB,
    };
    let bytes = rec.to_bytes().unwrap();
    assert_eq!(bytes[..8], [1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(bytes[8..16], [0; 8]);
    assert_eq!(bytes[16..24], [0, 0, 0, 0x65, 0, 0, 0, 0]);
    assert_eq!(bytes[24..], [0, 0x01, 0x23, 0xAB, 0, 0, 0, 1]);
    assert_eq!(RecvTooShort::parse(&bytes), Ok((rec, &[][..])));
    assert_eq!(
        Record::parse(&bytes),
        Ok((Record::RecvTooShort(rec), &[][..]))
    );
    let wr = RecvWr::default();
    let wr_bytes = Record::RecvWr(wr).to_bytes().unwrap();
    assert_eq!(Record::parse(&wr_bytes), Ok((Record::RecvWr(wr), &[][..])));
    // The receive-WR parser still sees the kind as its zero field.
    assert!(matches!(
        RecvWr::parse(&bytes),
        Err(OobError::ReservedNotZero { offset: 28, .. })
    ));
}

#[test]
fn too_short_record_refuses_garbage() {
    let good = RecvTooShort::default().to_bytes().unwrap();
    for at in [8, 15, 20, 23] {
        let mut bytes = good;
        bytes[at] = 0x40;
        assert!(
            matches!(
                Record::parse(&bytes),
                Err(OobError::ReservedNotZero {
                    message: OobMessageKind::RecvTooShort,
                    ..
                })
            ),
            "byte {at}"
        );
    }
    let mut bytes = good;
    bytes[24] = 1;
    assert_eq!(
        Record::parse(&bytes),
        Err(OobError::QpnOutOfRange { qpn: 0x0100_0000 })
    );
    let mut bytes = good;
    bytes[28] = 0x80;
    let err = Record::parse(&bytes).unwrap_err();
    assert_eq!(err, OobError::UnknownRecordKind { kind: 0x8000_0001 });
    extern crate std;
    use std::string::ToString;
    assert!(err
        .to_string()
        .starts_with("OOB record of unknown kind 0x80000001"));
    assert!(matches!(
        Record::parse(&good[..31]),
        Err(OobError::Truncated { needed: 32, .. })
    ));
}

#[test]
fn records_refuse_to_encode_a_wide_qpn() {
    let qpn = 0x0100_0000;
    let wide = [
        Record::RecvWr(RecvWr {
            qpn,
            ..RecvWr::default()
        }),
        Record::RecvTooShort(RecvTooShort {
            qpn,
            ..RecvTooShort::default()
        }),
    ];
    for r in wide {
        assert_eq!(r.to_bytes(), Err(OobError::QpnOutOfRange { qpn }), "{r:?}");
    }
}

#[test]
fn hello_checks_magic_then_version_and_keeps_unknown_capabilities() {
    let hello = Hello {
        capabilities: Capabilities::from_bits_retain(0x8000_0001),
        device_ip: Ipv4Addr::new(17, 34, 51, 10),
        nonce: *b"0123456789abcdef",
    };
    let bytes = hello.to_bytes();
    assert_eq!(Hello::parse(&bytes), Ok((hello, &[][..])));

    assert_eq!(
        Hello::parse(b"GET / HTTP/1.1\r\n"),
        Err(OobError::BadMagic { found: *b"GET " })
    );
    assert_eq!(
        Hello::parse(b"X"),
        Err(OobError::BadMagic {
            found: [b'X', 0, 0, 0]
        })
    );
    assert!(matches!(
        Hello::parse(b"BRD"),
        Err(OobError::Truncated {
            needed: 32,
            available: 3,
            ..
        })
    ));
    assert_eq!(bytes[16..], *b"0123456789abcdef");
    // A version-1 hello (16 bytes, no nonce) is named by its version, not as short.
    let mut v1 = bytes;
    v1[5] = 1;
    let err = Hello::parse(&v1[..16]).unwrap_err();
    assert_eq!(err, OobError::UnsupportedVersion { theirs: 1, ours: 2 });
    extern crate std;
    use std::string::ToString;
    assert_eq!(
        err.to_string(),
        "peer speaks OOB protocol version 1, this driver speaks version 2"
    );
    let mut reserved = bytes;
    reserved[7] = 1;
    assert!(matches!(
        Hello::parse(&reserved[..8]),
        Err(OobError::ReservedNotZero { offset: 6, .. })
    ));
}

#[test]
fn proof_is_32_opaque_bytes() {
    let bytes = [7u8; 40];
    assert_eq!(Proof::parse(&bytes), Ok((Proof([7; 32]), &bytes[32..])));
    assert_eq!(Proof([7; 32]).to_bytes(), [7; 32]);
    assert_eq!(
        Proof::parse(&bytes[..31]),
        Err(OobError::Truncated {
            message: OobMessageKind::Proof,
            needed: 32,
            available: 31
        })
    );
}
