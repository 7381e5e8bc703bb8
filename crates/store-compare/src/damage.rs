//! `damage`: what each store does with a file damaged behind its back (a bad sector, a bit flip,
//! an operator's mistake). A clean store is copied, one byte at a random offset of one of its
//! files is changed, and a command runs on the copy — once opened as the plugin opens it (redb:
//! no checksum pass) and once as the agent does (redb: every page's checksum verified on open).
//! Each trial ends in one of: refused with an error, panicked, acknowledged with the data intact,
//! or acknowledged with data that differs from what was committed (silently wrong).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::backend::{Backend, NETWORK, Opener};
use crate::child::{self, Exit};
use crate::rng::Rng;
use crate::workload::{self, Action, Dump};

/// Outcomes of one opener.
#[derive(Debug, Default, Serialize)]
pub struct Outcomes {
    /// Refused with an error (class: count).
    pub refused: BTreeMap<String, usize>,
    /// Panicked (exit 101) or died of a signal.
    pub crashed: usize,
    /// Acknowledged, and every lease read back equals the clean store's.
    pub intact: usize,
    /// Acknowledged, but a lease read back differs from, or is missing from, the clean store.
    pub silently_wrong: usize,
    /// Acknowledged, but reading every lease back afterwards failed (a record no longer
    /// decodes).
    pub unreadable_after: usize,
    /// …of which the reader panicked (exit 101).
    pub panicked_after: usize,
    /// redb, plugin open: after the acknowledged commit, the agent's checksum pass accepts the
    /// file although its data differs from what was committed (the commit rewrote the damaged
    /// page with a fresh checksum).
    pub laundered: usize,
    /// Examples of crashes and silently wrong data.
    pub examples: Vec<String>,
}

/// One backend.
#[derive(Debug, Default, Serialize)]
pub struct Stats {
    /// The backend.
    pub backend: String,
    /// Trials (one changed byte each).
    pub trials: usize,
    /// Leases in the clean store.
    pub leases: u32,
    /// Opened as the plugin opens it.
    pub plugin: Outcomes,
    /// Opened as the agent opens it.
    pub agent: Outcomes,
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

fn files(dir: &Path, out: &mut Vec<(std::path::PathBuf, u64)>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        match entry.metadata() {
            Ok(m) if m.is_dir() => files(&path, out),
            Ok(m) if m.len() > 0 && !path.ends_with("lock") => out.push((path, m.len())),
            _ => {}
        }
    }
}

fn leases_of(dump: &Dump) -> BTreeMap<std::net::IpAddr, String> {
    dump.leases
        .iter()
        .filter(|l| l.owner.container_id != "damaged")
        .map(|l| (l.ip, serde_json::to_string(l).unwrap_or_default()))
        .collect()
}

fn same(reference: &Dump, after: &Dump) -> bool {
    leases_of(reference) == leases_of(after)
}

fn diff(reference: &Dump, after: &Dump) -> String {
    let (before, now) = (leases_of(reference), leases_of(after));
    before
        .iter()
        .find(|(ip, l)| now.get(*ip) != Some(*l))
        .map(|(ip, l)| {
            format!(
                "{ip} was {l}, reads {}",
                now.get(ip).map_or("nothing", String::as_str)
            )
        })
        .or_else(|| {
            now.iter()
                .find(|(ip, _)| !before.contains_key(*ip))
                .map(|(ip, l)| format!("{ip} appeared: {l}"))
        })
        .unwrap_or_default()
}

fn read_back(backend: Backend, data: &Path, opener: Opener) -> anyhow::Result<Dump> {
    let mut cmd = child::dump_command(backend, data, None);
    if opener == Opener::Agent {
        cmd.arg("--opener").arg("agent");
    }
    let run = child::run(cmd, None, Duration::from_secs(60))?;
    Ok(
        serde_json::from_str(run.stdout.trim()).unwrap_or_else(|_| Dump {
            error: Some(run.describe()),
            ..Dump::default()
        }),
    )
}

/// Runs `trials` damaged copies per backend; writes `damage.<backend>.json`.
pub fn run(
    backends: &[Backend],
    work: &Path,
    results: &Path,
    trials: usize,
    leases: u32,
) -> anyhow::Result<Vec<Stats>> {
    let mut rng = Rng::new(11);
    let mut out = Vec::new();
    for &b in backends {
        let clean = work.join(format!("damage-{b}-clean"));
        let _ = std::fs::remove_dir_all(&clean);
        std::fs::create_dir_all(&clean)?;
        workload::fill(b, &clean, leases)?;
        for i in 0..20 {
            let run = child::run(
                child::op_command(b, &clean, Action::Add, &format!("d{i}"), &format!("d{i}")),
                None,
                Duration::from_secs(60),
            )?;
            anyhow::ensure!(run.ack().is_some(), "setting up: {}", run.describe());
        }
        let reference = read_back(b, &clean, Opener::Plugin)?;
        anyhow::ensure!(reference.ok, "the clean store does not read back");
        let mut candidates = Vec::new();
        files(&clean.join(NETWORK), &mut candidates);
        let total: u64 = candidates.iter().map(|(_, len)| len).sum();
        let mut stats = Stats {
            backend: b.name().into(),
            trials,
            leases,
            ..Stats::default()
        };
        for trial in 0..trials {
            // A file chosen by size, an offset, a non-zero change.
            let mut at = rng.next_u64() % total.max(1);
            let (file, offset) = candidates
                .iter()
                .find_map(|(p, len)| {
                    if at < *len {
                        Some((p.clone(), at))
                    } else {
                        at -= len;
                        None
                    }
                })
                .unwrap_or_else(|| (candidates[0].0.clone(), 0));
            let mask = (rng.below(255) + 1) as u8;
            let relative = file.strip_prefix(&clean)?.to_path_buf();
            for opener in [Opener::Plugin, Opener::Agent] {
                let copy = work.join(format!("damage-{b}-trial"));
                let _ = std::fs::remove_dir_all(&copy);
                copy_dir(&clean, &copy)?;
                let target = copy.join(&relative);
                let mut bytes = std::fs::read(&target)?;
                bytes[offset as usize] ^= mask;
                std::fs::write(&target, bytes)?;
                let mut cmd = child::op_command(b, &copy, Action::Add, "damaged", "damaged");
                if opener == Opener::Agent {
                    cmd.arg("--opener").arg("agent");
                }
                let run = child::run(cmd, None, Duration::from_secs(60))?;
                let o = match opener {
                    Opener::Plugin => &mut stats.plugin,
                    Opener::Agent => &mut stats.agent,
                };
                let what = format!(
                    "trial {trial}: {} byte {offset} ^= {mask:#04x}",
                    relative.display()
                );
                match (run.exit, run.ack(), run.error()) {
                    (_, Some(_), _) => {
                        let after = read_back(b, &copy, Opener::Plugin)?;
                        if opener == Opener::Plugin && b == Backend::Redb {
                            // Did the commit launder the damage: does the checksum pass now
                            // accept a file whose data is not what was committed?
                            let verified = read_back(b, &copy, Opener::Agent)?;
                            if verified.ok && !same(&reference, &verified) {
                                o.laundered += 1;
                                if o.examples.len() < 8 {
                                    o.examples.push(format!("{what}: acknowledged; then the agent's checksum pass accepts the file, whose data differs: {}", diff(&reference, &verified)));
                                }
                            }
                        }
                        if !after.ok {
                            o.unreadable_after += 1;
                            if after
                                .error
                                .as_deref()
                                .is_some_and(|e| e.starts_with("panicked"))
                            {
                                o.panicked_after += 1;
                            }
                            if o.examples.len() < 8 {
                                o.examples.push(format!(
                                    "{what}: acknowledged, then reading every lease fails: {}",
                                    after.error.as_deref().unwrap_or("?")
                                ));
                            }
                            continue;
                        }
                        if same(&reference, &after) {
                            o.intact += 1;
                        } else {
                            o.silently_wrong += 1;
                            if o.examples.len() < 8 {
                                o.examples.push(format!(
                                    "{what}: acknowledged, then {}",
                                    diff(&reference, &after)
                                ));
                            }
                        }
                    }
                    (Exit::Code(2), None, Some((class, _))) => {
                        *o.refused.entry(class.to_string()).or_default() += 1
                    }
                    _ => {
                        o.crashed += 1;
                        if o.examples.len() < 8 {
                            o.examples.push(format!("{what}: {}", run.describe()));
                        }
                    }
                }
            }
        }
        eprintln!(
            "damage {b}: plugin open: {} intact, {} silently wrong, {} crashed, refused {:?}; agent open: {} intact, {} silently wrong, {} crashed, refused {:?}",
            stats.plugin.intact,
            stats.plugin.silently_wrong,
            stats.plugin.crashed,
            stats.plugin.refused,
            stats.agent.intact,
            stats.agent.silently_wrong,
            stats.agent.crashed,
            stats.agent.refused
        );
        std::fs::write(
            results.join(format!("damage.{b}.json")),
            serde_json::to_vec_pretty(&stats)?,
        )?;
        out.push(stats);
    }
    Ok(out)
}
