//! CI's short soak (issue C item 5): random WRITEs, READs and WRITE_WITH_IMMs on 64 QPs
//! with 5 % link loss, duplication and reordering, every byte verified. (The fixed verbs
//! scenarios of `cargo xtask sim` move up to 16 MiB each; they run there, in release mode.)

use std::time::Duration;

use bluerdma_linux::scenarios::{run, Options};

#[test]
fn short_soak_with_link_faults_verifies_every_byte() {
    let opts = Options {
        port: 0,
        faults: Some("drop=0.05,dup=0.01,reorder=0.01,seed=11".parse().unwrap()),
        soak: Some(Duration::from_secs(3)),
        seed: 11,
        perf: false,
        in_memory: true,
        scenarios: false,
        devices: None,
        scale: Default::default(),
    };
    let rows = run(&opts, &mut |_| {}).expect("scenarios start");
    let failed: Vec<_> = rows.iter().filter(|r| !r.ok).collect();
    assert!(failed.is_empty(), "{:#?}", failed);
    let soak = rows
        .iter()
        .find(|r| r.name.starts_with("soak"))
        .expect("a soak row");
    assert!(soak.notes.contains("every byte verified"), "{}", soak.notes);
}
