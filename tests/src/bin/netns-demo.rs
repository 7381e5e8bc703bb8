//! `netns-demo`: the README's main job. Real network namespaces, Debian's `bridge` plugin
//! delegating to `ipkeep`, one pod deleted and rebuilt: it gets its IP back and is reachable.
//! Needs root. Exits non-zero if any expectation fails.

use std::process::ExitCode;

fn main() -> ExitCode {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("netns-demo needs root (it creates network namespaces); run it with sudo");
        return ExitCode::FAILURE;
    }
    let ipkeep = ipkeep_tests::ipkeep_bin();
    let Some(dir) = ipkeep.parent() else {
        eprintln!("cannot tell where {} lives", ipkeep.display());
        return ExitCode::FAILURE;
    };
    let data = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cannot create a state directory: {e}");
            return ExitCode::FAILURE;
        }
    };
    match ipkeep_tests::demo::run(dir, data.path(), &mut std::io::stdout()) {
        Ok(r) if r.before == r.after && r.bystander != r.before => {
            println!("OK: web-0 kept {} across delete and rebuild.", r.after);
            ExitCode::SUCCESS
        }
        Ok(r) => {
            eprintln!(
                "FAILED: web-0 had {} and came back with {}",
                r.before, r.after
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
