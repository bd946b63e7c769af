//! `cargo xtask sim`: two emulated NICs in this process on the UDP link, the scenarios of
//! `bluerdma_sim::scenarios` run against them, a summary table; exits non-zero on any
//! mismatch. `--help` lists the options.

use std::process::ExitCode;

use bluerdma_sim::scenarios::{self, Command, ProgressLine, SCENARIOS, USAGE};

fn main() -> ExitCode {
    let options = match Command::parse(std::env::args().skip(1)) {
        Ok(Command::Run(options)) => options,
        Ok(Command::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Command::List) => {
            for s in SCENARIOS {
                println!("{:<40} {:?} links", s.name, s.links);
            }
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("sim: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut progress = ProgressLine::stdout();
    match scenarios::run(&options, &mut |event| progress.show(event)) {
        Ok(summary) => {
            println!("\n{summary}");
            if summary.failed() == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("sim: {e}");
            ExitCode::FAILURE
        }
    }
}
