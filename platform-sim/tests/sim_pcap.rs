//! A captured multi-packet WRITE decodes as RoCE v2 in tshark with the opcodes and PSNs the
//! card put on the wire (issue B: "a captured pcap of a multi-packet WRITE decodes in
//! tshark"). Without tshark the test says so and passes; the frames are still checked with
//! the core's own parser.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use bluerdma_core::mtu::Pmtu;
use bluerdma_core::wire::{RdmaOpcode, RocePacket};
use bluerdma_sim::link::PcapSink;
use bluerdma_sim::scenarios::testbed::{pcap_frames, Testbed, TestbedConfig, ALL_ACCESS, CARD_IPS};

const PMTU: usize = 1024;
const FIRST_PSN: u32 = 0x40;

/// A unique file in the temporary directory, removed when dropped.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Captures a WRITE of exactly three PMTU-1024 packets from blue0 to blue1.
fn capture_three_packet_write() -> TempFile {
    let file = TempFile(
        std::env::temp_dir().join(format!("bluerdma-sim-pcap-{}.pcap", std::process::id())),
    );
    let sink = PcapSink::create(&file.0).unwrap();
    let mut config = TestbedConfig::new(0);
    config.capture = Some(sink.clone());
    let mut bed = Testbed::start(config).unwrap();
    let qp = bed.connect(ALL_ACCESS, Pmtu::Mtu1024).unwrap();
    let len = 3 * PMTU;
    let src = bed.register(0, len, ALL_ACCESS, |i| i as u8).unwrap();
    let dst = bed.register(1, len + PMTU, ALL_ACCESS, |_| 0).unwrap();
    let aligned = (PMTU - (dst.va % PMTU as u64) as usize) % PMTU;
    bed.post(0, &[qp.write(&src, 0, &dst, aligned, len, FIRST_PSN)])
        .unwrap();
    assert!(
        bed.settle(Duration::from_millis(20), Duration::from_secs(5)),
        "every frame arrived"
    );
    assert_eq!(&bed.bytes(&dst)[aligned..aligned + len], bed.bytes(&src));
    drop(bed);
    sink.flush().unwrap();
    file
}

#[test]
fn captured_write_decodes_with_the_expected_opcodes_and_psns() {
    let file = capture_three_packet_write();
    let bytes = std::fs::read(&file.0).unwrap();
    let to_blue1: Vec<(RdmaOpcode, u32)> = pcap_frames(&bytes)
        .into_iter()
        .filter(|f| f.get(30..34) == Some(&CARD_IPS[1].octets()[..]))
        .map(|f| {
            let (packet, _) = RocePacket::parse_frame(f).expect("a RoCE frame");
            (packet.headers.bth.opcode, packet.headers.bth.psn)
        })
        .collect();
    assert_eq!(
        to_blue1,
        vec![
            (RdmaOpcode::WriteFirst, FIRST_PSN),
            (RdmaOpcode::WriteMiddle, FIRST_PSN + 1),
            (RdmaOpcode::WriteLast, FIRST_PSN + 2),
        ],
        "the capture holds the three packets, as the core parses them"
    );

    let tshark = Command::new("tshark")
        .args(["-r"])
        .arg(&file.0)
        .args(["-d", "udp.port==4791,infiniband", "-Y", "ip.dst==127.0.0.2"])
        .args([
            "-T",
            "fields",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "infiniband.bth.psn",
        ])
        .output();
    let output = match tshark {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("SKIPPED: tshark not installed");
            return;
        }
        Err(e) => panic!("cannot run tshark: {e}"),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let decoded: Vec<(u32, u32)> = stdout
        .lines()
        .map(|line| {
            let mut fields = line.split('\t').map(|f| f.trim().parse::<u32>());
            match (fields.next(), fields.next()) {
                (Some(Ok(op)), Some(Ok(psn))) => (op, psn),
                _ => panic!("tshark did not decode the BTH: {line:?}"),
            }
        })
        .collect();
    assert_eq!(
        decoded,
        vec![(6, FIRST_PSN), (7, FIRST_PSN + 1), (8, FIRST_PSN + 2)],
        "tshark decodes WRITE_FIRST, WRITE_MIDDLE, WRITE_LAST with consecutive PSNs"
    );
}
