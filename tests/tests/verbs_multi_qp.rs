//! 64 QP pairs between two emulated NICs at once, each with its own MRs, posting chains of
//! interleaved WRITEs and READs from several threads: every byte lands in its own QP's
//! memory, and each QP's completions come in posting order on a CQ the 64 QPs share.

use std::collections::HashMap;
use std::time::Duration;

use bluerdma_core::engine::{SendOp, WcOpcode, WcStatus, WorkCompletion};
use bluerdma_linux::Mr;
use bluerdma_tests::{
    assert_bytes_eq, assert_untouched, fill_pattern, two_devices_from, wr, ALL, NEAR_WRAP,
};

const QPS: usize = 64;
/// WRs per QP: WRITE, READ, WRITE, READ, ...
const WRS: usize = 8;
const THREADS: usize = 4;

/// One QP's buffers: `local` on the requester, `remote` on the responder. Each is two
/// halves of `half` bytes: the first is written (local -> remote), the second read (remote
/// -> local).
struct Buffers {
    local: Mr,
    remote: Mr,
    half: usize,
    /// Length of one WR's segment.
    seg: usize,
}

/// Where WRITE `i` starts in both MRs and where READ `i` starts locally and remotely: a
/// different odd offset on each side, so a swapped address cannot go unnoticed.
const W_OFF: usize = 3;
const R_LOCAL_OFF: usize = 1;
const R_REMOTE_OFF: usize = 5;

fn chain(k: usize, b: &Buffers) -> Vec<bluerdma_core::engine::SendWr> {
    (0..WRS)
        .map(|j| {
            let id = (k * 100 + j) as u64;
            let i = j / 2;
            if j % 2 == 0 {
                let at = W_OFF + i * b.seg;
                wr(id, SendOp::Write, &b.local, at, b.seg, &b.remote, at)
            } else {
                let (l, r) = (
                    b.half + R_LOCAL_OFF + i * b.seg,
                    b.half + R_REMOTE_OFF + i * b.seg,
                );
                wr(id, SendOp::Read, &b.local, l, b.seg, &b.remote, r)
            }
        })
        .collect()
}

#[test]
fn sixty_four_qp_pairs_with_interleaved_writes_and_reads() {
    // Every connection starts on the wire 16 PSNs before the 24-bit wrap, so all 64 QPs'
    // traffic crosses it (the PSNs each QP exchanges below are the application's labels).
    let (a, b) = two_devices_from(NEAR_WRAP);
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq().unwrap(), b.create_cq().unwrap());
    let mut pairs = Vec::new();
    for k in 0..QPS {
        let qa = pa.create_qp(&ca, &ca).unwrap();
        let qb = pb.create_qp(&cb, &cb).unwrap();
        // Spread the PSNs the application exchanges: they are labels (ibv_query_qp's
        // numbering); on the wire every connection starts at the devices' NEAR_WRAP.
        let (psn_a, psn_b) = if k % 8 == 7 {
            (0xFF_FFF0 - k as u32, 0xFF_FF80 + k as u32)
        } else {
            (k as u32 * 0x1_F001, 0x7F_0000 - k as u32 * 777)
        };
        qa.connect(qb.endpoint(psn_b), psn_a, 14, 7).unwrap();
        qb.connect(qa.endpoint(psn_a), psn_b, 14, 7).unwrap();
        // Segments of 16 KiB + a few bytes, different for every QP.
        let seg = (16 << 10) + 7 * k + 1;
        let half = R_REMOTE_OFF + 4 * seg + 16;
        let mut local = pa.alloc_mr(2 * half, ALL).unwrap();
        let mut remote = pb.alloc_mr(2 * half, ALL).unwrap();
        fill_pattern(&mut local.bytes_mut().unwrap()[..half], k as u32, 0);
        fill_pattern(&mut remote.bytes_mut().unwrap()[half..], 1000 + k as u32, 0);
        pairs.push((
            qa,
            qb,
            Buffers {
                local,
                remote,
                half,
                seg,
            },
        ));
    }
    let qpn_to_k: HashMap<u32, usize> = pairs
        .iter()
        .enumerate()
        .map(|(k, (qa, _, _))| (qa.qpn().get(), k))
        .collect();

    // Several threads post at once, each its share of the QPs.
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let pairs = &pairs;
            s.spawn(move || {
                for k in (t..QPS).step_by(THREADS) {
                    let (qa, _, bufs) = &pairs[k];
                    // SAFETY: the MRs outlive the completions, which are awaited below
                    // before anything is read or dropped.
                    unsafe { qa.post_send(&chain(k, bufs)) }.unwrap();
                }
            });
        }
    });

    let wc = ca.wait(QPS * WRS, Duration::from_secs(20)).unwrap();
    assert_eq!(
        wc.len(),
        QPS * WRS,
        "every WR completes\n{}\n{}",
        a.dump(),
        b.dump()
    );
    let mut per_qp: Vec<Vec<WorkCompletion>> = vec![Vec::new(); QPS];
    for w in &wc {
        let k = *qpn_to_k
            .get(&w.qp_num)
            .unwrap_or_else(|| panic!("completion for an unknown QP: {w:?}"));
        per_qp[k].push(*w);
    }
    for (k, got) in per_qp.iter().enumerate() {
        let want: Vec<_> = (0..WRS)
            .map(|j| {
                let op = if j % 2 == 0 {
                    WcOpcode::RdmaWrite
                } else {
                    WcOpcode::RdmaRead
                };
                ((k * 100 + j) as u64, WcStatus::Success, op)
            })
            .collect();
        let got: Vec<_> = got.iter().map(|w| (w.wr_id, w.status, w.opcode)).collect();
        assert_eq!(
            got,
            want,
            "QP {k}: completions in posting order\n{}\n{}",
            a.dump(),
            b.dump()
        );
    }
    let mut none = [WorkCompletion::EMPTY; 4];
    assert_eq!(
        cb.poll(&mut none).unwrap(),
        0,
        "plain WRITEs and READs complete nothing on the responder"
    );

    for (k, (_, _, bufs)) in pairs.iter().enumerate() {
        let (l, r) = (bufs.local.bytes().unwrap(), bufs.remote.bytes().unwrap());
        let (h, n) = (bufs.half, 4 * bufs.seg);
        assert_bytes_eq(
            &format!("QP {k}: written"),
            &r[W_OFF..W_OFF + n],
            &l[W_OFF..W_OFF + n],
        );
        assert_untouched(&format!("QP {k}: before the writes"), &r[..W_OFF]);
        assert_untouched(&format!("QP {k}: after the writes"), &r[W_OFF + n..h]);
        assert_bytes_eq(
            &format!("QP {k}: read"),
            &l[h + R_LOCAL_OFF..h + R_LOCAL_OFF + n],
            &r[h + R_REMOTE_OFF..h + R_REMOTE_OFF + n],
        );
        assert_untouched(&format!("QP {k}: before the reads"), &l[h..h + R_LOCAL_OFF]);
        assert_untouched(
            &format!("QP {k}: after the reads"),
            &l[h + R_LOCAL_OFF + n..],
        );
    }
}
