//! The device list's parsers against arbitrary input: no text (inline or file form) makes
//! them panic, every error names where it is, and entries written from random valid fields
//! (backends and options included) parse back to those fields.

use std::net::Ipv4Addr;

use bluerdma_linux::devices::{BackendSpec, DeviceList};
use proptest::prelude::*;

/// Text made of the characters the syntax gives meaning to, and some others.
fn syntaxish() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            Just("="),
            Just(","),
            Just("+"),
            Just(";"),
            Just("@"),
            Just(":"),
            Just("/"),
            Just(" "),
            Just("\n"),
            Just("#"),
            Just("rtl"),
            Just("pci"),
            Just("blue0"),
            Just("127.0.0.1"),
            Just("02:00:00:00:00:01"),
            Just("0000:3b:00.0"),
            Just("oob"),
            Just("root"),
            Just("udmabuf"),
            Just("7701"),
            Just("é"),
            Just("\u{0}"),
        ],
        0..24,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #[test]
    fn no_text_makes_the_parsers_panic(text in syntaxish(), raw in ".{0,64}") {
        for t in [&text, &raw] {
            if let Err(e) = DeviceList::parse_inline(t) {
                prop_assert!(e.to_string().starts_with("BLUERDMA_DEVICES"), "{e}");
            }
            if let Err(e) = DeviceList::parse_file(t, "d.conf") {
                prop_assert!(e.to_string().starts_with("d.conf"), "{e}");
            }
        }
    }

    #[test]
    fn written_entries_parse_back(
        n in 1usize..5,
        kinds in proptest::collection::vec(0u8..3, 5),
        ports in proptest::collection::vec((1u16.., 1u16..), 5),
        oob in proptest::option::of(1u16..),
    ) {
        let entries: Vec<String> = (0..n)
            .map(|i| {
                let ip = Ipv4Addr::new(127, 0, 20, i as u8 + 1);
                let mut e = format!("blue{i}={ip}");
                match kinds[i] {
                    1 => e.push_str(&format!("+rtl:{}/{}", ports[i].0, ports[i].1)),
                    2 => e.push_str(&format!("+pci:0000:3b:00.{i};root=/tmp/card{i}")),
                    _ => {}
                }
                if let Some(p) = oob {
                    e.push_str(&format!(";oob=127.0.21.{}:{p}", i + 1));
                }
                e
            })
            .collect();
        let list = DeviceList::parse_inline(&entries.join(",")).unwrap();
        prop_assert_eq!(list.entries().len(), n);
        for (i, e) in list.entries().iter().enumerate() {
            prop_assert_eq!(e.ip, Ipv4Addr::new(127, 0, 20, i as u8 + 1));
            match (&e.backend, kinds[i]) {
                (BackendSpec::Rtl(r), 1) => {
                    prop_assert_eq!((r.csr_port, r.dma_port), ports[i]);
                }
                (BackendSpec::Pci(p), 2) => {
                    prop_assert_eq!(p.selector.map(|s| format!("{s:?}")).is_some(), true);
                    let root = format!("/tmp/card{i}");
                    prop_assert_eq!(p.root.as_deref(), Some(std::path::Path::new(&root)));
                }
                (BackendSpec::Emulated, 0) => {}
                (other, k) => prop_assert!(false, "kind {k} parsed as {other:?}"),
            }
            prop_assert_eq!(e.options.oob.and_then(|o| o.port), oob);
        }
    }
}
