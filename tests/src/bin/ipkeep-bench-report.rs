//! `ipkeep-bench-report`: the bench scripts' statistics and tables (`ipkeep_tests::bench::report`).

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        print!("{}", ipkeep_tests::bench::report::USAGE);
        return ExitCode::SUCCESS;
    }
    match ipkeep_tests::bench::report::run(&args, &mut std::io::stdin()) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ipkeep-bench-report: {e}");
            ExitCode::FAILURE
        }
    }
}
