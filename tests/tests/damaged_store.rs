//! A store file damaged behind ipkeep's back (a bad sector, a bit flip, a truncation, an
//! operator's mistake) is refused loudly, by the plugin as by the agent: a command either fails
//! with a CNI error that names the database, or it works on data that is exactly what was
//! committed. Never a crash, never an answer built on wrong data; and an agent that refused a
//! store says so on `/readyz`.

use std::collections::BTreeMap;
use std::path::Path;

use ipkeep_tests::agent::{Agent, AgentOptions};
use ipkeep_tests::{Invocation, PluginOutput, Rng, admin_command, ipkeep_bin, with_agent_socket};

fn conf(data: &Path) -> String {
    format!(
        r#"{{"cniVersion":"1.0.0","name":"dmg","ipam":{{"type":"ipkeep","dataDir":"{}","agentSocket":"","retention":"1h","ranges":[[{{"subnet":"10.93.0.0/24"}}]]}}}}"#,
        data.display()
    )
}

fn pod(i: usize) -> String {
    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=db;K8S_POD_NAME=pod-{i}")
}

/// `ipkeep list --json` of `data`, as lease JSON by address, or why it failed.
fn leases(data: &Path) -> Result<BTreeMap<String, serde_json::Value>, String> {
    let out = admin_command(data)
        .args(["list", "--json", "--network", "dmg", "--data-dir"])
        .arg(data)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
    Ok(list["leases"]
        .as_array()
        .map(|ls| {
            ls.iter()
                .map(|l| (l["ip"].as_str().unwrap_or("").to_string(), l.clone()))
                .collect()
        })
        .unwrap_or_default())
}

#[derive(Debug, Clone, Copy)]
enum Damage {
    Flip(u64, u8),
    Zero(u64, u64),
    Truncate(u64),
}

fn damage(file: &Path, d: Damage) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(file)
        .expect("open the store file");
    match d {
        Damage::Flip(at, mask) => {
            let mut b = [0u8];
            f.read_exact_at(&mut b, at).expect("read");
            f.write_all_at(&[b[0] ^ mask], at).expect("write");
        }
        Damage::Zero(at, len) => f.write_all_at(&vec![0; len as usize], at).expect("zero"),
        Damage::Truncate(len) => f.set_len(len).expect("truncate"),
    }
}

/// How one command on a damaged copy ended; `Err` is a failure of ipkeep.
fn judge(
    out: &PluginOutput,
    clean: &BTreeMap<String, serde_json::Value>,
    data: &Path,
) -> Result<&'static str, String> {
    if out.stderr.contains("panicked") || out.stdout.contains("internal error") {
        return Err(format!("crashed: {out:?}"));
    }
    match out.code {
        Some(1) => {
            let msg = out.json()["msg"].as_str().unwrap_or("").to_string();
            if msg.contains("database") || msg.contains("record") {
                Ok("refused")
            } else {
                Err(format!(
                    "refused without saying the store is damaged: {out:?}"
                ))
            }
        }
        Some(0) => {
            let now = leases(data).map_err(|e| format!("acknowledged, then unreadable: {e}"))?;
            let wrong: Vec<&String> = clean
                .keys()
                .filter(|ip| now.get(*ip) != clean.get(*ip))
                .collect();
            if wrong.is_empty() {
                Ok("intact")
            } else {
                Err(format!("acknowledged on silently wrong data: {wrong:?}"))
            }
        }
        other => Err(format!("exit {other:?}: {out:?}")),
    }
}

#[test]
fn a_damaged_store_is_refused_loudly_by_the_plugin_and_the_agent() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let clean_dir = tmp.path().join("clean");
    let conf_clean = conf(&clean_dir);
    for i in 0..40 {
        let out = Invocation::new("ADD", &format!("c{i}"))
            .args(&pod(i))
            .run(&ipkeep_bin(), &conf_clean);
        assert!(out.ok(), "{out:?}");
        if i % 3 == 0 {
            let del = Invocation::new("DEL", &format!("c{i}"))
                .args(&pod(i))
                .run(&ipkeep_bin(), &conf_clean);
            assert!(del.ok(), "{del:?}");
        }
    }
    let clean = leases(&clean_dir).expect("the clean store lists");
    let file = clean_dir.join("dmg/leases.redb");
    let len = std::fs::metadata(&file).expect("store file").len();
    let mut rng = Rng::from_env("damaged_store");
    let mut trials: Vec<Damage> = Vec::new();
    for _ in 0..20 {
        trials.push(Damage::Flip(rng.below(len), 1 << rng.below(8)));
    }
    for _ in 0..10 {
        trials.push(Damage::Zero(rng.below(len / 4096) * 4096, 4096));
    }
    for _ in 0..6 {
        trials.push(Damage::Truncate(rng.below(len)));
    }
    let mut tally: BTreeMap<&str, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    for (t, d) in trials.iter().enumerate() {
        for through_agent in [false, true] {
            let data = tmp.path().join(format!("t{t}-{through_agent}"));
            let net = data.join("dmg");
            std::fs::create_dir_all(&net).expect("dir");
            std::fs::copy(&file, net.join("leases.redb")).expect("copy");
            damage(&net.join("leases.redb"), *d);
            let agent = through_agent.then(|| Agent::start(&data, AgentOptions::default()));
            let conf = match &agent {
                Some(a) => with_agent_socket(&conf(&data), a.socket()),
                None => conf(&data),
            };
            let out = Invocation::new("ADD", "newcomer")
                .args(&pod(999))
                .run(&ipkeep_bin(), &conf);
            // A store the agent refused leaves it not ready, so the node's probes say so.
            let health = agent.as_ref().map(|a| a.get("/readyz"));
            drop(agent);
            match judge(&out, &clean, &data) {
                Ok("refused") if health.as_ref().is_some_and(|h| !h.contains(" 503 ")) => {
                    failures.push(format!(
                        "{d:?}: the agent refused the store but says it is healthy: {health:?}"
                    ));
                }
                Ok(kind) => *tally.entry(kind).or_default() += 1,
                Err(why) => failures.push(format!("{d:?} (agent: {through_agent}): {why}")),
            }
        }
    }
    eprintln!("{} damaged copies: {tally:?}", 2 * trials.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(tally.get("refused").copied().unwrap_or(0) > 0, "{tally:?}");
}
