//! Engines sharing one card through table windows (`DeviceConfig::windows`): each hands out
//! QP indices, MR indices and page-table ranges only inside its own windows, finds its
//! objects again by their QPN or key, and refuses the other engine's. The engines run
//! against a fake card that answers every command at once and records what it was told,
//! which is what the daemon multiplexing their rings onto one card would forward.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::ptr::NonNull;
use std::rc::Rc;

use bluerdma_core::addr::{DeviceAddr, PageSize, VirtAddr};
use bluerdma_core::desc::cmd::{CmdRequest, CmdResponse};
use bluerdma_core::desc::{AccessFlags, RawDesc, DESC_SIZE};
use bluerdma_core::engine::{
    CqSlot, Device, DeviceConfig, EarlyRecv, MrSlot, QpCaps, QpSlot, QpTimers, RecvEntry, Slices,
    Storage, TableWindows, VerbsError, WorkCompletion, Wqe,
};
use bluerdma_core::keys::{MrKey, Qpn, MR_TABLE_LEN, QP_TABLE_LEN};
use bluerdma_core::mac::MacAddr;
use bluerdma_core::oob::AtomicOp;
use bluerdma_core::platform::{
    DmaAllocator, DmaBuffer, MemoryResolver, NoOob, Platform, PlatformError, RegisterAccess,
};
use bluerdma_core::qp::QpType;
use bluerdma_core::regs::{Reg, RingId, DECODED_CHANNELS};
use bluerdma_core::ring::{RingRegs, RING_LEN};
use bluerdma_core::time::Instant;

/// The registers of ring `id`.
fn ring(id: RingId) -> RingRegs {
    RingRegs::of(id, DECODED_CHANNELS).unwrap()
}

/// A card that executes nothing: it answers each command as the driver rings the doorbell
/// (successful, body echoed), records it, and reports every host-to-card ring as fetched.
#[derive(Default)]
struct Card {
    regs: RefCell<HashMap<u16, u32>>,
    /// Command requests fetched and responses written, free-running.
    fetched: Cell<u32>,
    responded: Cell<u32>,
    commands: RefCell<Vec<CmdRequest>>,
}

impl Card {
    fn reg(&self, r: Reg) -> u32 {
        self.regs.borrow().get(&r.offset()).copied().unwrap_or(0)
    }

    fn base(&self, r: RingRegs) -> u64 {
        u64::from(self.reg(r.base_lo)) | u64::from(self.reg(r.base_hi)) << 32
    }

    /// Executes the command requests up to the new head `head`.
    fn serve(&self, head: u32) {
        let (req, resp) = (
            self.base(ring(RingId::CmdRequest)),
            self.base(ring(RingId::CmdResponse)),
        );
        let len = u32::from(RING_LEN);
        let mut at = self.fetched.get();
        while at % (2 * len) != head {
            let slot = (req + u64::from(at % len) * DESC_SIZE as u64) as *const RawDesc;
            // SAFETY: the command ring is a live buffer of `HeapDma` (device address = CPU
            // address) of RING_LEN slots, programmed by the open device; the driver wrote
            // this slot before its doorbell, on this thread.
            let d = unsafe { slot.read_volatile() };
            let (cmd, _tag) = CmdRequest::decode(&d).expect("the engine sent a bad command");
            self.commands.borrow_mut().push(cmd);
            let n = self.responded.get();
            let out = (resp + u64::from(n % len) * DESC_SIZE as u64) as *mut RawDesc;
            // SAFETY: as above, the response ring; the engine consumes every response before
            // it sends the next command, so the slot is free.
            unsafe { out.write_volatile(CmdResponse::echo(&d).encode()) };
            self.responded.set(n + 1);
            at += 1;
        }
        self.fetched.set(at);
    }
}

#[derive(Clone, Default)]
struct CardRegs(Rc<Card>);

impl RegisterAccess for CardRegs {
    fn read32(&self, reg: Reg) -> u32 {
        // The tail of a host-to-card ring: everything up to the head was fetched.
        for id in [RingId::CmdRequest, RingId::Send(0), RingId::SimpleNicTx] {
            let r = ring(id);
            if reg == r.tail {
                return self.0.reg(r.head);
            }
        }
        self.0.reg(reg)
    }

    fn write32(&self, reg: Reg, value: u32) {
        self.0.regs.borrow_mut().insert(reg.offset(), value);
        if reg == ring(RingId::CmdRequest).head {
            self.0.serve(value);
        }
    }
}

/// Zeroed heap memory at device address = CPU address.
#[derive(Default)]
struct HeapDma {
    live: RefCell<HashMap<usize, Layout>>,
}

// SAFETY: `alloc_zeroed` memory of the asked size and alignment, distinct per allocation,
// valid until `free` deallocates it; the "device" (the fake card) uses CPU addresses.
unsafe impl DmaAllocator for HeapDma {
    fn alloc(&self, len: usize, align: usize) -> Result<DmaBuffer, PlatformError> {
        let oom = PlatformError::OutOfMemory { requested: len };
        let layout = Layout::from_size_align(len.max(1), align).map_err(|_| oom)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc_zeroed(layout) }).ok_or(oom)?;
        self.live.borrow_mut().insert(ptr.as_ptr() as usize, layout);
        // SAFETY: valid for `len` bytes until freed; device address = CPU address.
        Ok(unsafe { DmaBuffer::new(ptr, DeviceAddr(ptr.as_ptr() as u64), len) })
    }

    unsafe fn free(&self, buf: DmaBuffer) {
        if let Some(layout) = self
            .live
            .borrow_mut()
            .remove(&(buf.cpu().as_ptr() as usize))
        {
            // SAFETY: allocated by `alloc` with this layout; the caller uses it no more.
            unsafe { dealloc(buf.cpu().as_ptr(), layout) }
        }
    }
}

/// Memory that is never touched: pins succeed, pages translate to their own addresses.
struct Mem;

impl MemoryResolver for Mem {
    fn pin(&mut self, _va: VirtAddr, _len: usize, _write: bool) -> Result<(), PlatformError> {
        Ok(())
    }
    fn unpin(&mut self, _va: VirtAddr, _len: usize) {}
    fn translate(
        &mut self,
        va: VirtAddr,
        page: PageSize,
        out: &mut [DeviceAddr],
    ) -> Result<(), PlatformError> {
        for (k, e) in out.iter_mut().enumerate() {
            *e = DeviceAddr(page.base_of(va.0) + k as u64 * page.bytes());
        }
        Ok(())
    }
    fn atomic(&mut self, _va: VirtAddr, _op: AtomicOp) -> Result<u64, PlatformError> {
        Err(PlatformError::Unsupported)
    }
    fn write(&mut self, _va: VirtAddr, _bytes: &[u8]) -> Result<(), PlatformError> {
        Err(PlatformError::Unsupported)
    }
}

struct Fake;

impl Platform for Fake {
    type Regs = CardRegs;
    type Dma = HeapDma;
    type Mem = Mem;
    type Oob = NoOob;
}

struct VecStorage {
    qps: Vec<QpSlot>,
    wqes: Vec<Wqe>,
    timers: Vec<QpTimers>,
    cqs: Vec<CqSlot>,
    cqes: Vec<WorkCompletion>,
    mrs: Vec<MrSlot>,
    recvs: Vec<RecvEntry>,
    early: Vec<EarlyRecv>,
}

impl VecStorage {
    /// Room for `qps` QPs of 4 send and 4 receive WRs, and `mrs` MRs.
    fn new(qps: usize, mrs: usize) -> Self {
        VecStorage {
            qps: vec![QpSlot::default(); qps],
            wqes: vec![Wqe::default(); qps * 8],
            timers: vec![QpTimers::default(); qps],
            cqs: vec![CqSlot::default(); 2],
            cqes: vec![WorkCompletion::EMPTY; 64],
            mrs: vec![MrSlot::default(); mrs],
            recvs: vec![RecvEntry::default(); qps * 16],
            early: vec![EarlyRecv::default(); 4],
        }
    }
}

impl Storage for VecStorage {
    fn slices(&mut self) -> Slices<'_> {
        Slices {
            qps: &mut self.qps,
            wqes: &mut self.wqes,
            timers: &mut self.timers,
            cqs: &mut self.cqs,
            cqes: &mut self.cqes,
            mrs: &mut self.mrs,
            recvs: &mut self.recvs,
            early: &mut self.early,
        }
    }
}

/// A clock that moves 1 us per reading.
fn clock() -> impl FnMut() -> Instant {
    let mut t = 0;
    move || {
        t += 1_000;
        Instant(t)
    }
}

/// An engine on its own fake card, with a PD and a CQ.
struct Engine {
    dev: Device<Fake, VecStorage>,
    card: Rc<Card>,
    pd: u32,
    cq: u32,
    clock: Box<dyn FnMut() -> Instant>,
}

const SMALL_QP: QpCaps = QpCaps {
    max_send_wr: 4,
    max_recv_wr: 4,
    read_responses: 0,
};

/// The address of the `n`-th test MR (never touched: `Mem` only pretends).
fn va(n: u64) -> VirtAddr {
    VirtAddr(0x10_0000_0000 + n * 0x1_0000_0000)
}

fn config(windows: TableWindows, page: PageSize) -> DeviceConfig {
    let mut cfg = DeviceConfig::new(MacAddr([2, 0, 0, 0, 0, 1]), [10, 0, 0, 1].into());
    cfg.windows = windows;
    cfg.page_size = page;
    cfg
}

fn open(cfg: DeviceConfig, storage: VecStorage) -> Result<Engine, (VerbsError, Rc<Card>)> {
    let regs = CardRegs::default();
    let card = regs.0.clone();
    let mut clock = clock();
    let mut dev =
        match Device::<Fake, _>::open(regs, HeapDma::default(), Mem, storage, cfg, &mut clock) {
            Ok(dev) => dev,
            Err(e) => return Err((e, card)),
        };
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(16).unwrap();
    Ok(Engine {
        dev,
        card,
        pd,
        cq,
        clock: Box::new(clock),
    })
}

fn engine(windows: TableWindows, qps: usize, mrs: usize) -> Engine {
    open(config(windows, PageSize::Size2M), VecStorage::new(qps, mrs))
        .map_err(|(e, _)| e)
        .unwrap()
}

impl Engine {
    fn create_qp(&mut self) -> Result<Qpn, VerbsError> {
        self.dev.create_qp(
            self.pd,
            self.cq,
            self.cq,
            QpType::Rc,
            SMALL_QP,
            &mut self.clock,
        )
    }

    fn reg_mr(&mut self, n: u64, len: u64) -> Result<MrKey, VerbsError> {
        self.dev.reg_mr(
            self.pd,
            va(n),
            len,
            AccessFlags::LOCAL_WRITE,
            &mut self.clock,
        )
    }

    /// The page-table entries the card was told to write, one range per UpdatePgt.
    fn pgt_writes(&self) -> Vec<Range<u32>> {
        self.card
            .commands
            .borrow()
            .iter()
            .filter_map(|c| match c {
                CmdRequest::UpdatePgt(u) => Some(u.start_index..u.start_index + u.entry_count),
                _ => None,
            })
            .collect()
    }

    /// The QPNs of the ManageQp commands and the keys of the UpdateMrTable commands.
    fn card_handles(&self) -> (Vec<Qpn>, Vec<MrKey>) {
        let (mut qpns, mut keys) = (Vec::new(), Vec::new());
        for c in self.card.commands.borrow().iter() {
            match c {
                CmdRequest::ManageQp(m) => qpns.push(m.qpn),
                CmdRequest::UpdateMrTable(u) => keys.push(u.mr_key),
                _ => {}
            }
        }
        (qpns, keys)
    }
}

const PAGE_2M: u64 = 2 << 20;

#[test]
fn the_whole_card_keeps_todays_numbering() {
    assert_eq!(
        DeviceConfig::new(MacAddr([2, 0, 0, 0, 0, 1]), [10, 0, 0, 1].into()).windows,
        TableWindows::WHOLE
    );
    let mut e = engine(TableWindows::WHOLE, 4, 4);
    // QP index 1 and MR index 1 first (0 is reserved in both), then 2; the key bytes are
    // the engine's key sequence from its seed 0x5A.
    let qp1 = e.create_qp().unwrap();
    let mr1 = e.reg_mr(0, 4096).unwrap();
    let qp2 = e.create_qp().unwrap();
    let mr2 = e.reg_mr(1, 4096).unwrap();
    assert_eq!(
        [qp1.get(), mr1.get(), qp2.get(), mr2.get()],
        [0x00_01B7, 0x00_0106, 0x00_0238, 0x00_02AD]
    );
    // The first MR's page table starts at entry 0.
    assert_eq!(e.pgt_writes()[0], 0..1);
}

#[test]
fn engines_on_split_windows_hand_out_disjoint_qpns_keys_and_page_tables() {
    let windows = [
        TableWindows::split(2, 0).unwrap(),
        TableWindows::split(2, 1).unwrap(),
    ];
    let mut engines: Vec<Engine> = windows.iter().map(|w| engine(w.clone(), 8, 8)).collect();
    let mut handed = Vec::new();
    for (k, e) in engines.iter_mut().enumerate() {
        let qpns: Vec<Qpn> = (0..5).map(|_| e.create_qp().unwrap()).collect();
        // One page, three pages, and one across a page boundary (2 pages).
        let mut keys = vec![
            e.reg_mr(0, 4096).unwrap(),
            e.reg_mr(1, 3 * PAGE_2M).unwrap(),
        ];
        let straddle = VirtAddr(va(2).0 + PAGE_2M - 100);
        keys.push(
            e.dev
                .reg_mr(e.pd, straddle, 200, AccessFlags::LOCAL_WRITE, &mut e.clock)
                .unwrap(),
        );
        keys.push(e.dev.alloc_mw(e.pd).unwrap());
        // The engine finds what it handed out again through its window.
        for q in &qpns {
            assert_eq!(e.dev.query_qp(*q).unwrap().qpn, *q);
        }
        // Its first QP and MR are at the start of its windows.
        assert_eq!(qpns[0].index(), windows[k].qp_index.start);
        assert_eq!(keys[0].index(), windows[k].mr_index.start);
        handed.push((qpns, keys));
    }
    for (k, e) in engines.iter().enumerate() {
        let (mine, other) = (&windows[k], &windows[1 - k]);
        let (qpns, keys) = &handed[k];
        let (card_qpns, card_keys) = e.card_handles();
        for q in qpns.iter().chain(&card_qpns) {
            assert!(mine.contains_qpn(*q) && !other.contains_qpn(*q), "{q:?}");
        }
        for key in keys.iter().chain(&card_keys) {
            assert!(
                mine.contains_mr_key(*key) && !other.contains_mr_key(*key),
                "{key:?}"
            );
        }
        let pgt = e.pgt_writes();
        assert_eq!(pgt.iter().map(|r| r.len()).sum::<usize>(), 1 + 3 + 2);
        for r in &pgt {
            assert!(
                mine.contains_pgt(r.clone()) && !other.contains_pgt(r.clone()),
                "{r:?}"
            );
        }
        assert_eq!(pgt[0].start, mine.pgt.start);
    }
    // Disjoint on the card: no QP index, MR index or page-table entry is used twice.
    let qp_indices: HashSet<u32> = handed
        .iter()
        .flat_map(|h| h.0.iter().map(|q| q.index()))
        .collect();
    let mr_indices: HashSet<u32> = handed
        .iter()
        .flat_map(|h| h.1.iter().map(|k| k.index()))
        .collect();
    assert_eq!((qp_indices.len(), mr_indices.len()), (10, 8));
    let entries: Vec<u32> = engines
        .iter()
        .flat_map(|e| e.pgt_writes())
        .flatten()
        .collect();
    assert_eq!(entries.iter().collect::<HashSet<_>>().len(), entries.len());

    // A handle of the other engine's window is foreign here, even where its storage slot
    // would hold an object of this engine.
    let (b_qpn, b_key) = (handed[1].0[0], handed[1].1[0]);
    let a = &mut engines[0];
    assert_eq!(
        a.dev.query_qp(b_qpn).err(),
        Some(VerbsError::NoSuchObject {
            what: "QP",
            handle: b_qpn.get()
        })
    );
    assert_eq!(
        a.dev.dereg_mr(b_key, &mut a.clock),
        Err(VerbsError::NoSuchObject {
            what: "MR",
            handle: b_key.get()
        })
    );
    // Its own go and come back at the same indices (other key bytes).
    let (a_qpn, a_key) = (handed[0].0[0], handed[0].1[1]);
    a.dev.destroy_qp(a_qpn, &mut a.clock).unwrap();
    a.dev.dereg_mr(a_key, &mut a.clock).unwrap();
    let (qpn, key) = (a.create_qp().unwrap(), a.reg_mr(9, 3 * PAGE_2M).unwrap());
    assert_eq!((qpn.index(), key.index()), (a_qpn.index(), a_key.index()));
    assert_ne!((qpn, key), (a_qpn, a_key));
    assert_eq!(
        a.pgt_writes().last().unwrap().start,
        windows[0].pgt.start + 1
    );
}

#[test]
fn exhausting_a_qp_window_fails_as_exhausting_the_qp_table() {
    let out = Err(VerbsError::OutOfResources {
        what: "queue pairs",
    });
    // The card's table: storage for more QPs than the card has.
    let mut whole = engine(TableWindows::WHOLE, QP_TABLE_LEN as usize + 1, 2);
    let all: Vec<Qpn> = (0..QP_TABLE_LEN - 1)
        .map(|_| whole.create_qp().unwrap())
        .collect();
    assert_eq!(all.last().unwrap().index(), QP_TABLE_LEN - 1);
    assert_eq!(whole.create_qp(), out);
    // A window of three, with storage for eight.
    let windows = TableWindows {
        qp_index: 700..703,
        ..TableWindows::WHOLE
    };
    let mut e = engine(windows.clone(), 8, 2);
    let got: Vec<u32> = (0..3).map(|_| e.create_qp().unwrap().index()).collect();
    assert_eq!(got, [700, 701, 702]);
    assert_eq!(e.create_qp(), out);
    // Storage smaller than the window bounds it the same way.
    let mut small = engine(TableWindows::split(2, 1).unwrap(), 2, 2);
    small.create_qp().unwrap();
    small.create_qp().unwrap();
    assert_eq!(small.create_qp(), out);
}

#[test]
fn exhausting_an_mr_window_fails_as_exhausting_the_mr_table() {
    let out = Err(VerbsError::OutOfResources { what: "MR table" });
    let mut whole = engine(TableWindows::WHOLE, 1, MR_TABLE_LEN as usize + 1);
    // Windows take MR-table entries without a command to the card: all but the last.
    for _ in 0..MR_TABLE_LEN - 2 {
        whole.dev.alloc_mw(whole.pd).unwrap();
    }
    let last = whole.reg_mr(0, 4096).unwrap();
    assert_eq!(last.index(), MR_TABLE_LEN - 1);
    assert_eq!(whole.reg_mr(1, 4096), out);
    assert_eq!(whole.dev.alloc_mw(whole.pd), out);

    let windows = TableWindows {
        mr_index: 50..52,
        ..TableWindows::WHOLE
    };
    let mut e = engine(windows, 1, 8);
    assert_eq!(e.reg_mr(0, 4096).unwrap().index(), 50);
    assert_eq!(e.dev.alloc_mw(e.pd).unwrap().index(), 51);
    assert_eq!(e.reg_mr(1, 4096), out);
    assert_eq!(e.dev.alloc_mw(e.pd), out);
}

#[test]
fn exhausting_a_page_table_window_fails_as_exhausting_the_page_table() {
    let out = Err(VerbsError::OutOfResources { what: "page table" });
    let page = 4096u64;
    let open4k = |windows| {
        open(config(windows, PageSize::Size4K), VecStorage::new(1, 8))
            .map_err(|(e, _)| e)
            .unwrap()
    };
    // More pages than the card's page table has.
    let mut whole = open4k(TableWindows::WHOLE);
    assert_eq!(whole.reg_mr(0, (131_072 + 1) * page), out);
    // A window of 100 entries: 60, then 60 more do not fit, 40 do.
    let windows = TableWindows {
        pgt: 1000..1100,
        ..TableWindows::WHOLE
    };
    let mut e = open4k(windows.clone());
    e.reg_mr(0, 60 * page).unwrap();
    assert_eq!(e.reg_mr(1, 60 * page), out);
    e.reg_mr(2, 40 * page).unwrap();
    assert_eq!(e.reg_mr(3, page), out);
    let pgt = e.pgt_writes();
    assert_eq!((pgt[0].start, pgt.last().unwrap().end), (1000, 1100));
    assert!(pgt.iter().all(|r| windows.contains_pgt(r.clone())));
}

#[test]
fn open_refuses_windows_that_are_empty_or_leave_the_card() {
    let whole = TableWindows::WHOLE;
    let bad = [
        TableWindows {
            qp_index: 0..10,
            ..whole.clone()
        },
        TableWindows {
            qp_index: 5..5,
            ..whole.clone()
        },
        TableWindows {
            qp_index: 1000..1025,
            ..whole.clone()
        },
        TableWindows {
            mr_index: 0..1,
            ..whole.clone()
        },
        TableWindows {
            mr_index: 8000..8193,
            ..whole.clone()
        },
        TableWindows {
            pgt: 7..7,
            ..whole.clone()
        },
        TableWindows {
            pgt: 131_000..131_073,
            ..whole.clone()
        },
    ];
    for w in bad {
        let expected = w.validate().unwrap_err();
        assert!(
            matches!(expected, VerbsError::InvalidArgument { .. }),
            "{w:?}"
        );
        match open(config(w.clone(), PageSize::Size2M), VecStorage::new(1, 1)) {
            Ok(_) => panic!("{w:?} opened"),
            Err((e, card)) => {
                assert_eq!(e, expected, "{w:?}");
                assert!(card.regs.borrow().is_empty(), "{w:?}: the card was touched");
            }
        }
    }
    assert_eq!(whole.validate(), Ok(()));
}
