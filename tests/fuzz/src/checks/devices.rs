//! The device-list target: a file or environment value a user writes
//! (platform-linux/src/devices.rs).

use bluerdma_linux::devices::DeviceList;

fn mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn check(list: &DeviceList, how: &str) {
    let mut file = String::new();
    let mut inline = Vec::new();
    for e in list.entries() {
        file.push_str(&format!("{} {} {}\n", e.name, e.ip, mac(&e.mac.0)));
        inline.push(format!("{}={}@{}", e.name, e.ip, mac(&e.mac.0)));
    }
    let inline = inline.join(",");
    assert_eq!(
        DeviceList::parse_file(&file, "again").as_ref(),
        Ok(list),
        "{how}: written as the file {file:?}"
    );
    assert_eq!(
        DeviceList::parse_inline(&inline).as_ref(),
        Ok(list),
        "{how}: written inline as {inline:?}"
    );
    for (i, e) in list.entries().iter().enumerate() {
        assert_eq!(list.get(&e.name), Some(e));
        assert_eq!(list.get(&format!("uverbs{i}")), Some(e));
        assert_eq!(list.by_ip(e.ip), Some(e));
    }
}

/// The device list (platform-linux/src/devices.rs), read from a file or from the inline
/// `BLUERDMA_DEVICES` value. A list that parses in either form is written out again in
/// both forms, and each parses to the same list.
pub fn devices(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(list) = DeviceList::parse_file(text, "fuzz") {
        check(&list, "file");
    }
    if let Ok(list) = DeviceList::parse_inline(text) {
        check(&list, "inline");
    }
}
