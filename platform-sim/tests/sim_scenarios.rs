//! The scenario runner of `cargo xtask sim`, on a free port: every clean-link scenario
//! passes, and with 5 % drop the fault rows pass (counters plausible, replay identical).

use bluerdma_sim::scenarios::{self, Event, Options};

fn run(options: &Options) -> scenarios::Summary {
    let mut started = 0;
    let summary = scenarios::run(options, &mut |event| {
        if let Event::Started { .. } = event {
            started += 1;
        }
    })
    .unwrap();
    assert_eq!(started, summary.rows.len(), "one progress event per row");
    summary
}

#[test]
fn every_clean_scenario_passes() {
    let summary = run(&Options {
        port: 0,
        ..Options::default()
    });
    assert!(summary.rows.len() >= 10);
    assert_eq!(summary.failed(), 0, "\n{summary}");
}

#[test]
fn fault_rows_pass_and_replay_from_the_seed() {
    let summary = run(&Options {
        port: 0,
        faults: Some(
            "drop=0.05,dup=0.01,reorder=0.01,corrupt=0.01"
                .parse()
                .unwrap(),
        ),
        seed: Some(7),
        ..Options::default()
    });
    let names: Vec<&str> = summary.rows.iter().map(|r| r.scenario).collect();
    assert_eq!(names, ["faulty WRITE traffic", "replay from the seed"]);
    assert_eq!(summary.failed(), 0, "\n{summary}");
}
