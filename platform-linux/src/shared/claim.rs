//! Claims of client memory on a card that reaches memory by physical address (the PCI
//! card): the client pins and translates its memory itself (its own page map) and tells the
//! daemon each range and its bus address ([`super::proto::Request::Claim`]); the daemon
//! believes none of it until the client's page map, which it opened when the client said
//! hello, shows those frames at those pages.
//!
//! A claim is checked over whole pages of the card's size (the pages its page-table
//! entries name, and [`super::mux::MuxClient`] lets an entry name any page a mapping
//! touches): every base page of them must be present with the frame the claim implies.
//! The daemon checks the claims again now and then ([`audit`], a budget of pages at a
//! time): a client that unmaps memory it still claims, so that the kernel may give its
//! frames to another process, is dropped.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Page-map entry bits: present, and the frame number.
const PRESENT: u64 = 1 << 63;
const PFN_MASK: u64 = (1 << 55) - 1;
/// Entries read by one `pread`.
const BATCH: u64 = 8192;

/// Why a claim is refused.
#[derive(Debug)]
pub enum Refusal {
    /// The range is empty, wraps, or its bus address does not keep its offset in a page.
    Malformed(String),
    /// The page map cannot be read (the client has gone).
    Unreadable(io::Error),
    /// The page map hides frame numbers from the daemon (it lacks CAP_SYS_ADMIN).
    Hidden,
    /// A page is not where the claim says: not present, or another frame.
    False {
        /// The client's page.
        va: u64,
        /// The frame the claim implies (bus address).
        claimed: u64,
        /// What the page map shows (`None`: not present).
        found: Option<u64>,
    },
}

impl Refusal {
    /// The errno the client is told.
    pub fn errno(&self) -> i32 {
        match self {
            Refusal::Malformed(_) => libc::EINVAL,
            Refusal::Unreadable(e) => e.raw_os_error().unwrap_or(libc::ESRCH),
            Refusal::Hidden => libc::EACCES,
            Refusal::False { .. } => libc::EPERM,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Malformed(why) => write!(f, "{why}"),
            Refusal::Unreadable(e) => write!(f, "the client's page map: {e}"),
            Refusal::Hidden => write!(
                f,
                "the client's page map hides frame numbers from the daemon (it needs \
                 CAP_SYS_ADMIN, as the card's owner has)"
            ),
            Refusal::False {
                va,
                claimed,
                found: Some(found),
            } => write!(
                f,
                "the page at {va:#x} is frame {found:#x}, not {claimed:#x} as claimed"
            ),
            Refusal::False {
                va,
                claimed,
                found: None,
            } => write!(
                f,
                "the page at {va:#x} is not present (claimed at {claimed:#x})"
            ),
        }
    }
}

/// The pages of `page` bytes (a power of two) that `[va, va + len)` touches, as the
/// client's first page, the bus address of that page and the bytes of all of them.
pub fn pages(va: u64, len: u64, dev: u64, page: u64) -> Result<(u64, u64, u64), Refusal> {
    let end = va
        .checked_add(len)
        .filter(|&e| len > 0 && e <= 1 << 47)
        .ok_or_else(|| Refusal::Malformed(format!("{len} bytes at {va:#x}")))?;
    if dev % page != va % page || dev.checked_add(len).is_none() {
        return Err(Refusal::Malformed(format!(
            "bus address {dev:#x} for {va:#x}: not at the same offset in a page of {page} bytes"
        )));
    }
    let first = va - va % page;
    let last = end.div_ceil(page) * page;
    Ok((first, dev - va % page, last - first))
}

/// Checks that every base page (`base` bytes) of the `page`-byte pages `[va, va + len)`
/// touches has, in `pagemap`, the frame its claimed bus address `dev` implies.
pub fn verify(
    pagemap: &File,
    va: u64,
    len: u64,
    dev: u64,
    page: u64,
    base: u64,
) -> Result<(), Refusal> {
    let (first, dev_first, bytes) = pages(va, len, dev, page.max(base))?;
    let count = bytes / base;
    let mut buf = Vec::new();
    let mut done = 0u64;
    while done < count {
        let n = (count - done).min(BATCH);
        buf.resize(n as usize * 8, 0);
        let vpn = first / base + done;
        pagemap
            .read_exact_at(&mut buf, vpn * 8)
            .map_err(Refusal::Unreadable)?;
        for (i, e) in buf.chunks_exact(8).enumerate() {
            let e = u64::from_le_bytes(e.try_into().expect("8 bytes"));
            let k = done + i as u64;
            let claimed = dev_first + k * base;
            let at = first + k * base;
            if e & PRESENT == 0 {
                return Err(Refusal::False {
                    va: at,
                    claimed,
                    found: None,
                });
            }
            let pfn = e & PFN_MASK;
            if pfn == 0 {
                return Err(Refusal::Hidden);
            }
            if pfn * base != claimed {
                return Err(Refusal::False {
                    va: at,
                    claimed,
                    found: Some(pfn * base),
                });
            }
        }
        done += n;
    }
    Ok(())
}

/// How far an [`audit`] got.
#[derive(Debug)]
pub enum Audit {
    /// Every claim still holds.
    Done,
    /// The budget ran out before the claim at this bus address.
    Stopped {
        /// Where to go on.
        at: u64,
    },
    /// The claim at `dev` no longer holds.
    Failed {
        /// Its bus address.
        dev: u64,
        /// Why.
        why: Refusal,
    },
}

/// Checks claims of a client again, in order (`maps`: bus address, va, len), while
/// `budget` (base pages read) lasts. An unreadable page map (the client is going) is not a
/// finding.
pub fn audit(
    pagemap: &File,
    maps: impl IntoIterator<Item = (u64, u64, u64)>,
    page: u64,
    base: u64,
    budget: &mut u64,
) -> Audit {
    for (dev, va, len) in maps {
        if *budget == 0 {
            return Audit::Stopped { at: dev };
        }
        let cost = pages(va, len, dev, page.max(base)).map_or(1, |(_, _, b)| b / base);
        *budget = budget.saturating_sub(cost);
        match verify(pagemap, va, len, dev, page, base) {
            Ok(()) | Err(Refusal::Unreadable(_)) => {}
            Err(why) => return Audit::Failed { dev, why },
        }
    }
    Audit::Done
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 4096;
    const PAGE: u64 = 8 * BASE;

    /// A stand-in page map: 64 base pages, page `i` at frame `frame(i)` (0: not present).
    fn pagemap(frame: impl Fn(u64) -> u64) -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pagemap");
        let mut bytes = Vec::new();
        for i in 0..64u64 {
            let f = frame(i);
            let e = if f == 0 { 0 } else { PRESENT | f };
            bytes.extend_from_slice(&e.to_le_bytes());
        }
        std::fs::write(&path, bytes).unwrap();
        let f = File::open(&path).unwrap();
        (dir, f)
    }

    #[test]
    fn a_true_claim_passes_and_a_false_one_is_refused_with_eperm() {
        // Pages 8..16 (one card page) are frames 0x1000.. in order; pages 16..24 too, but
        // for page 20; the rest elsewhere.
        let (_d, pm) = pagemap(|i| match i {
            8..16 => 0x1000 + i - 8,
            20 => 0x3000,
            16..24 => 0x2000 + i - 16,
            _ => 0x50 + i,
        });
        let dev = 0x1000 * BASE;
        // The whole card page, and a part of it (checked over the whole page).
        verify(&pm, 8 * BASE, PAGE, dev, PAGE, BASE).unwrap();
        verify(&pm, 9 * BASE + 5, 100, dev + BASE + 5, PAGE, BASE).unwrap();
        // Another process's frames: the claim names frames the client does not have.
        let e = verify(&pm, 8 * BASE, PAGE, dev + PAGE, PAGE, BASE).unwrap_err();
        assert_eq!(e.errno(), libc::EPERM, "{e}");
        assert!(e.to_string().contains("not"), "{e}");
        // A range whose card page is not contiguous in frames.
        let e = verify(&pm, 16 * BASE, 10, 0x2000 * BASE, PAGE, BASE).unwrap_err();
        assert_eq!(e.errno(), libc::EPERM, "{e}");
    }

    #[test]
    fn absent_hidden_and_malformed_claims_are_refused() {
        let (_d, absent) = pagemap(|i| if i == 3 { 0 } else { 0x100 + i });
        let e = verify(&absent, 0, PAGE, 0x100 * BASE, PAGE, BASE).unwrap_err();
        assert!(matches!(e, Refusal::False { found: None, .. }), "{e}");
        // A page map read without CAP_SYS_ADMIN: present, frame 0.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pagemap");
        std::fs::write(&path, [PRESENT.to_le_bytes(); 64].concat()).unwrap();
        let hidden = File::open(&path).unwrap();
        let e = verify(&hidden, 0, BASE, 0, PAGE, BASE).unwrap_err();
        assert_eq!(e.errno(), libc::EACCES, "{e}");
        let (_d2, pm) = pagemap(|i| 0x100 + i);
        for (va, len, dev) in [(0, 0, 0), (u64::MAX - 4, 10, 0), (BASE, BASE, BASE + 1)] {
            let e = verify(&pm, va, len, dev, PAGE, BASE).unwrap_err();
            assert_eq!(e.errno(), libc::EINVAL, "{e}");
        }
        // Past the end of the stand-in (a client that has gone reads as nothing).
        let e = verify(&pm, 1 << 30, BASE, 1 << 30, PAGE, BASE).unwrap_err();
        assert!(matches!(e, Refusal::Unreadable(_)), "{e}");
    }

    #[test]
    fn an_audit_finds_a_claim_whose_frames_changed_and_keeps_to_its_budget() {
        let (_d, pm) = pagemap(|i| 0x200 + i);
        let good = (0x200 * BASE, 0, PAGE);
        let moved = (0x900 * BASE, PAGE, PAGE);
        let gone = (0, 1 << 30, BASE);
        let mut budget = 100;
        assert!(matches!(
            audit(&pm, [good, gone], PAGE, BASE, &mut budget),
            Audit::Done
        ));
        assert_eq!(budget, 100 - 8 - 8);
        match audit(&pm, [good, moved], PAGE, BASE, &mut budget) {
            Audit::Failed { dev, why } => assert_eq!((dev, why.errno()), (moved.0, libc::EPERM)),
            other => panic!("{other:?}"),
        }
        // A budget of one card page checks the first claim, stops before the second.
        let mut budget = 8;
        match audit(&pm, [good, moved], PAGE, BASE, &mut budget) {
            Audit::Stopped { at } => assert_eq!(at, moved.0),
            other => panic!("{other:?}"),
        }
    }
}
