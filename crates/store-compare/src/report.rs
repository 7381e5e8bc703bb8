//! `report`: one markdown table (rows = checks, columns = backends) from the JSON files the
//! checks wrote, then the raw numbers.

use std::path::Path;

use serde_json::Value;

use crate::backend::Backend;

fn load(results: &Path, check: &str, b: Backend) -> Option<Value> {
    let text = std::fs::read_to_string(results.join(format!("{check}.{b}.json"))).ok()?;
    serde_json::from_str(&text).ok()
}

fn u(v: &Value, path: &str) -> u64 {
    v.pointer(path).and_then(Value::as_u64).unwrap_or(0)
}

fn f(v: &Value, path: &str) -> f64 {
    v.pointer(path).and_then(Value::as_f64).unwrap_or(0.0)
}

fn verdict(pass: bool) -> &'static str {
    if pass { "**PASS**" } else { "**FAIL**" }
}

fn torture(v: &Value) -> (String, String) {
    let kills = u(v, "/kills");
    let failed = u(v, "/next_op_failed");
    let bricked = u(v, "/bricked");
    let violations = u(v, "/violations");
    let unkilled = u(v, "/unkilled_failures");
    let pass = failed == 0 && bricked == 0 && violations == 0 && unkilled == 0 && kills > 0;
    let mut cell = format!(
        "{} {kills} kills ({} while creating); next command failed after {failed}; unusable stores {bricked}; violations {violations}",
        verdict(pass),
        u(v, "/kills_creating")
    );
    if let Some(ex) = v.pointer("/failure_examples/0").and_then(Value::as_str) {
        cell.push_str(&format!(
            "; e.g. `{}`",
            ex.chars().take(90).collect::<String>()
        ));
    }
    let time = format!(
        "{:.0} s, {} processes; command after a kill: median {:.1} ms, max {:.0} ms",
        f(v, "/wall_s"),
        u(v, "/processes"),
        f(v, "/next_op_median_ms"),
        f(v, "/next_op_max_ms")
    );
    (cell, time)
}

fn enospc(v: &Value) -> String {
    let failures = u(v, "/failures");
    let unclean = u(v, "/unclean");
    let after = u(v, "/open_after_free_failed");
    let violations = u(v, "/violations");
    let never = u(v, "/never_succeeded");
    let final_ok = v
        .pointer("/final_ok")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let pass = unclean == 0 && after == 0 && violations == 0 && never == 0 && final_ok;
    let other: u64 = v
        .pointer("/clean_other")
        .and_then(Value::as_object)
        .map(|m| m.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0);
    let full_failed: u64 = v
        .pointer("/open_while_full_failed")
        .and_then(Value::as_object)
        .map(|m| m.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0);
    format!(
        "{} {} commands through {failures} ENOSPC failures: {} clean no-space, {other} other clean errors, {unclean} unclean; opens while full {}/{}; does not open after freeing space {after}; violations {violations}; final check {}",
        verdict(pass),
        u(v, "/commands"),
        u(v, "/clean_nospace"),
        u(v, "/opens_while_full"),
        u(v, "/opens_while_full") + full_failed,
        if final_ok { "ok" } else { "failed" }
    )
}

fn durability(v: &Value, names: bool) -> String {
    let Some(scenarios) = v.pointer("/scenarios").and_then(Value::as_array) else {
        return "-".into();
    };
    let key = if names {
        "names_durable"
    } else {
        "data_durable"
    };
    let pass = !scenarios.is_empty() && scenarios.iter().all(|s| s[key].as_bool().unwrap_or(false));
    let mut notes = Vec::new();
    for s in scenarios {
        let list = if names {
            &s["unsynced_names"]
        } else {
            &s["unsynced"]
        };
        let items: Vec<&str> = list
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if !items.is_empty() {
            notes.push(format!(
                "{}: {}",
                s["name"].as_str().unwrap_or("?"),
                items.join("; ")
            ));
        }
    }
    if notes.is_empty() {
        let what = if names {
            "every new name's directory fsync'd"
        } else {
            "fsync/fdatasync after the last write, before the ACK"
        };
        format!("{} {what} (create, ADD, DEL)", verdict(pass))
    } else {
        format!("{} {}", verdict(pass), notes.join(" / "))
    }
}

fn damage(v: &Value, opener: &str) -> String {
    let refused: u64 = v
        .pointer(&format!("/{opener}/refused"))
        .and_then(Value::as_object)
        .map(|m| m.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0);
    format!(
        "{} trials: {refused} refused with an error, {} acknowledged with silently wrong data, {} acknowledged then reading every lease fails ({} of them by a panic), {} crashed (panic/signal), {} unaffected{}",
        u(v, "/trials"),
        u(v, &format!("/{opener}/silently_wrong")),
        u(v, &format!("/{opener}/unreadable_after")),
        u(v, &format!("/{opener}/panicked_after")),
        u(v, &format!("/{opener}/crashed")),
        u(v, &format!("/{opener}/intact")),
        match u(v, &format!("/{opener}/laundered")) {
            0 => String::new(),
            n => format!(
                "; in {n} the commit laundered the damage (the agent's checksum pass then accepts wrong data)"
            ),
        }
    )
}

fn size_of(v: &Value, leases: u64) -> Option<&Value> {
    v.pointer("/sizes")?
        .as_array()?
        .iter()
        .find(|s| u(s, "/leases") == leases)
}

fn dist(v: Option<&Value>, key: &str) -> String {
    match v {
        Some(s) if u(s, &format!("/{key}/n")) > 0 => format!(
            "{:.1} / {:.1} ms",
            f(s, &format!("/{key}/median_ms")),
            f(s, &format!("/{key}/p99_ms"))
        ),
        _ => "-".into(),
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

/// Prints the table and the raw numbers.
pub fn print(results: &Path) -> anyhow::Result<()> {
    let backends = Backend::ALL;
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    let mut row = |name: &str, cell: &dyn Fn(Backend) -> String| {
        rows.push((
            name.to_string(),
            backends.iter().map(|b| cell(*b)).collect(),
        ));
    };
    let get = |check: &str, b: Backend| load(results, check, b);
    row(
        "SIGKILL at random moments (lock, open, creation, commit, close); the next command must succeed; store checked against every ACK",
        &|b| get("torture", b).map_or("-".into(), |v| torture(&v).0),
    );
    row("torture wall time", &|b| {
        get("torture", b).map_or("-".into(), |v| torture(&v).1)
    });
    row("the same with 60,000 held leases in the store", &|b| {
        get("torture-60k", b).map_or("-".into(), |v| torture(&v).0)
    });
    row("torture (60k) wall time", &|b| {
        get("torture-60k", b).map_or("-".into(), |v| torture(&v).1)
    });
    row(
        "ENOSPC at every page written (tmpfs, private mount namespace)",
        &|b| get("enospc", b).map_or("-".into(), |v| enospc(&v)),
    );
    row(
        "acknowledged commit durable (strace: fsync/fdatasync of the written file before the ACK)",
        &|b| get("durability", b).map_or("-".into(), |v| durability(&v, false)),
    );
    row(
        "new files/renames inside the network directory durable (strace: directory fsync before the ACK)",
        &|b| get("durability", b).map_or("-".into(), |v| durability(&v, true)),
    );
    row(
        "the network directory's own mkdir (NetworkDir::lock, shared) followed by an fsync of the data dir",
        &|b| {
            get("durability", b)
                .and_then(|v| {
                    v.pointer("/scenarios")?
                        .as_array()?
                        .iter()
                        .find_map(|s| s["network_dir_synced"].as_bool())
                })
                .map_or(
                    "-".into(),
                    |synced| if synced { "yes".into() } else { "no".into() },
                )
        },
    );
    row(
        "damaged file (one random byte changed), command opened as the plugin does (redb: no checksum pass)",
        &|b| get("damage", b).map_or("-".into(), |v| damage(&v, "plugin")),
    );
    row(
        "the same, opened as the node agent does (redb: every page's checksum verified on open)",
        &|b| get("damage", b).map_or("-".into(), |v| damage(&v, "agent")),
    );
    let sizes: Vec<u64> = backends
        .iter()
        .filter_map(|b| get("measure", *b))
        .flat_map(|v| {
            v.pointer("/sizes")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(|s| u(s, "/leases")).collect::<Vec<_>>())
                .unwrap_or_default()
        })
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    for &n in &sizes {
        row(
            &format!("per-process lock+open at {n} leases (median / p99)"),
            &|b| get("measure", b).map_or("-".into(), |v| dist(size_of(&v, n), "open")),
        );
        row(
            &format!("per-process ADD or DEL incl. commit at {n} leases (median / p99)"),
            &|b| get("measure", b).map_or("-".into(), |v| dist(size_of(&v, n), "op")),
        );
        row(
            &format!("per-process command, spawn to exit, at {n} leases (median / p99)"),
            &|b| get("measure", b).map_or("-".into(), |v| dist(size_of(&v, n), "process")),
        );
    }
    if let Some(&n) = sizes.last() {
        row(
            &format!("lock+open after a SIGKILL of an opener, at {n} leases (median / p99)"),
            &|b| get("measure", b).map_or("-".into(), |v| dist(size_of(&v, n), "open_after_crash")),
        );
        row(
            &format!("store on disk at {n} leases (after fill → after the per-process commands)"),
            &|b| {
                get("measure", b)
                    .and_then(|v| {
                        size_of(&v, n).map(|s| {
                            format!(
                                "{} → {}",
                                mib(u(s, "/disk_bytes_after_fill")),
                                mib(u(s, "/disk_bytes_after_ops"))
                            )
                        })
                    })
                    .unwrap_or_else(|| "-".into())
            },
        );
        row(
            &format!("agent: peak RSS (VmHWM), store open with {n} held leases, 1,000 ADD/DEL"),
            &|b| {
                get("measure", b)
                    .and_then(|v| {
                        let runs = v.pointer("/agent")?.as_array()?.clone();
                        let peak = runs.iter().map(|r| u(r, "/hwm_end_kib")).max()?;
                        let open = runs.iter().map(|r| u(r, "/hwm_after_open_kib")).max()?;
                        Some(format!(
                            "{} (after open {})",
                            mib(peak * 1024),
                            mib(open * 1024)
                        ))
                    })
                    .unwrap_or_else(|| "-".into())
            },
        );
        row(
            &format!("agent: open (redb: checksum of every page) and one command, at {n} leases"),
            &|b| {
                get("measure", b)
                    .and_then(|v| {
                        let runs = v.pointer("/agent")?.as_array()?.clone();
                        let mid = |key: &str| {
                            let mut all: Vec<f64> = runs.iter().map(|r| f(r, key)).collect();
                            all.sort_by(f64::total_cmp);
                            all.get(all.len() / 2).copied().unwrap_or(0.0)
                        };
                        Some(format!(
                            "open {:.2} s; command median {:.2} ms, p99 {:.2} ms (median of {} runs)",
                            mid("/open_s"),
                            mid("/op_median_us") / 1e3,
                            mid("/op_p99_us") / 1e3,
                            runs.len()
                        ))
                    })
                    .unwrap_or_else(|| "-".into())
            },
        );
    }
    println!("| check | {} |", backends.map(Backend::name).join(" | "));
    println!("|---|{}", "---|".repeat(backends.len()));
    for (name, cells) in &rows {
        println!("| {name} | {} |", cells.join(" | "));
    }
    println!();
    println!("## Raw numbers ({})", results.display());
    for check in [
        "torture",
        "torture-60k",
        "enospc",
        "durability",
        "damage",
        "measure",
    ] {
        for b in backends {
            if let Some(v) = get(check, b) {
                println!(
                    "\n### {check} {b}\n```json\n{}\n```",
                    serde_json::to_string_pretty(&v)?
                );
            }
        }
    }
    Ok(())
}
