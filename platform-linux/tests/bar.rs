//! BAR0 register access against a regular file standing in for `resource0`: a register
//! write lands little-endian at its offset in the file, a value written into the file is
//! what the register reads, and bad files give errors that say why.

use std::fs;
use std::os::unix::fs::FileExt;

use bluerdma_core::platform::RegisterAccess;
use bluerdma_core::regs::{Counter, Reg, RingId, RingReg, DECODED_CHANNELS};
use bluerdma_linux::bar::{Bar0, MIN_BAR0_LEN};

fn reg(ring: RingId, r: RingReg) -> Reg {
    ring.reg(r, DECODED_CHANNELS).expect("decoded register")
}

#[test]
fn registers_map_to_their_offsets_little_endian() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("resource0");
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    file.set_len(0x10000).unwrap();
    let bar = Bar0::map(&path).unwrap();
    assert_eq!(bar.len(), 0x10000);

    let head = reg(RingId::CmdRequest, RingReg::Head);
    bar.write32(head, 0x1234_5678);
    let base_hi = reg(RingId::SimpleNicRx, RingReg::BaseHi);
    bar.write32(base_hi, 0xDEAD_BEEF);
    let mut word = [0u8; 4];
    file.read_exact_at(&mut word, 0x108).unwrap();
    assert_eq!(word, [0x78, 0x56, 0x34, 0x12]);
    file.read_exact_at(&mut word, 0x154).unwrap();
    assert_eq!(word, [0xEF, 0xBE, 0xAD, 0xDE]);
    // Nothing else was touched.
    let all = fs::read(&path).unwrap();
    let nonzero: Vec<usize> = (0..all.len()).filter(|&i| all[i] != 0).collect();
    assert_eq!(
        nonzero,
        [0x108, 0x109, 0x10A, 0x10B, 0x154, 0x155, 0x156, 0x157]
    );

    // The "card" updates a counter and a tail; reads see it.
    file.write_all_at(&7u32.to_le_bytes(), 0x408).unwrap();
    file.write_all_at(&0x1FFFu32.to_le_bytes(), 0x11C).unwrap();
    assert_eq!(bar.read32(Counter::InvalidMrKey.reg()), 7);
    assert_eq!(bar.read32(reg(RingId::CmdResponse, RingReg::Tail)), 0x1FFF);
    assert_eq!(bar.read32(head), 0x1234_5678);
}

#[test]
fn the_smallest_bar_holds_every_decoded_register() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("resource0");
    fs::File::create(&path)
        .unwrap()
        .set_len(MIN_BAR0_LEN as u64)
        .unwrap();
    let bar = Bar0::map(&path).unwrap();
    for off in (0..0x1_0000u32).step_by(4) {
        if let Some(r) = Reg::decode(off, DECODED_CHANNELS) {
            bar.write32(r, off);
            assert_eq!(bar.read32(r), off, "register {off:#x}");
        }
    }
}

#[test]
fn short_and_missing_files_are_refused_with_reasons() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short");
    fs::write(&short, [0u8; 64]).unwrap();
    let e = Bar0::map(&short).err().unwrap().to_string();
    assert!(
        e.contains("64 bytes") && e.contains("smaller than the register map"),
        "{e}"
    );
    let e = Bar0::map(&dir.path().join("nothing"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("cannot open BAR0") && e.contains("bluerdma-doctor"),
        "{e}"
    );
}
