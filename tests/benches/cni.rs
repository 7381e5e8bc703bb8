//! `cargo bench -p ipkeep-tests --bench cni`: whole-process wall time of CNI operations, ipkeep
//! against Debian's host-local, both measured in the same run on fresh data directories.
//!
//! Every operation is one plugin process, timed from spawn to exit (stdin written, stdout and
//! stderr read), exactly what a container runtime pays. Scenarios:
//!
//! 1. `sequential`: ADD+DEL cycles against an empty /16 (1,000 ops).
//! 2. `parallel-16`: the same 1,000 ops spread over 16 threads, each with its own containers;
//!    per-op wall time and total throughput.
//! 3. `prefilled-1k`: 200 ADD+DEL cycles against a store that already holds 1,000 leases.
//! 4. `prefilled-60k`: the same against 60,000 leases.
//!
//! plus `VERSION` runs of both binaries, the cost of starting and ending a process at all.
//!
//! In the sequential scenarios the two plugins alternate cycle by cycle (and which one goes
//! first alternates too), so a change in machine load hits both alike; the parallel scenario
//! runs them back to back. ipkeep runs with `IPKEEP_TIMING=1`, and the phases it reports are
//! averaged; `start+exit` is wall time minus ipkeep's own `total_us`.
//!
//! `IPKEEP_BENCH_SCALE` (float, default 1.0) multiplies every op count (not the pre-fill sizes);
//! `IPKEEP_BENCH_DIR` chooses where the data directories are created (default: the temp dir).
//! `IPKEEP_BENCH_REUSE_COOLDOWN` sets ipkeep's `ipam.reuseCooldown` (default: the plugin's, 5m),
//! to measure what the cooldown costs.
//! With `IPKEEP_BENCH_AGENT=1`, ipkeep goes through an `ipkeep-agent` started for each
//! scenario's data directory (an agent serves its own data directory only); the run fails if
//! any command fell back to the plugin process, and reports the agent's peak memory. The
//! pre-filled ipkeep stores hold *held* addresses (deleted pods', with their PersistentPodState),
//! the agent's heaviest case. Any operation that fails aborts the run with the plugin's output.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ipkeep_ipam::{DiskStore, NetworkDir, RangeSet, RangeSpec, StoreRead};
use ipkeep_tests::agent::{Agent, AgentOptions};
use ipkeep_tests::bench::{Summary, Table, ratio};
use ipkeep_tests::{Invocation, PluginOutput, ipkeep_bin, reference_plugin, store};
use tempfile::TempDir;

const NETWORK: &str = "bench";
const SUBNET: &str = "10.10.0.0/16";
const WORKERS: usize = 16;
const WARMUP_CYCLES: usize = 3;
const PREFILL_CHUNK: usize = 5_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Ipkeep,
    HostLocal,
}

#[derive(Debug, Clone)]
struct Plugin {
    name: &'static str,
    bin: PathBuf,
    kind: Kind,
    /// ipkeep through this agent socket (`IPKEEP_BENCH_AGENT=1`).
    agent_socket: Option<PathBuf>,
}

impl Plugin {
    fn conf(&self, data_dir: &Path) -> String {
        let ty = match self.kind {
            Kind::Ipkeep => "ipkeep",
            Kind::HostLocal => "host-local",
        };
        let mut conf = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "ipam": {
                "type": ty,
                "dataDir": data_dir.to_str().expect("data dir is UTF-8"),
                "ranges": [[{ "subnet": SUBNET }]],
            },
        });
        if let Some(socket) = &self.agent_socket {
            conf["ipam"]["agentSocket"] = socket.to_str().expect("socket is UTF-8").into();
        }
        if let (Kind::Ipkeep, Ok(cooldown)) =
            (self.kind, std::env::var("IPKEEP_BENCH_REUSE_COOLDOWN"))
        {
            conf["ipam"]["reuseCooldown"] = cooldown.into();
        }
        conf.to_string()
    }
}

/// ipkeep's `IPKEEP_TIMING` line, in microseconds.
#[derive(Debug, Clone, Copy, Default)]
struct Phases {
    parse: u64,
    lock: u64,
    open: u64,
    alloc_commit: u64,
    total: u64,
}

fn parse_timing(stderr: &str) -> Option<Phases> {
    let line = stderr.lines().find(|l| l.starts_with("ipkeep-timing"))?;
    let mut p = Phases::default();
    let mut saw_total = false;
    for field in line.split_whitespace().skip(1) {
        let (key, value) = field.split_once('=')?;
        let value: u64 = value.parse().ok()?;
        match key {
            "parse_us" => p.parse = value,
            "lock_us" => p.lock = value,
            "open_us" => p.open = value,
            "alloc_commit_us" => p.alloc_commit = value,
            "total_us" => {
                p.total = value;
                saw_total = true;
            }
            _ => {}
        }
    }
    saw_total.then_some(p)
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    command: &'static str,
    wall: Duration,
    phases: Option<Phases>,
}

/// Runs one plugin process and checks that it succeeded; any failure aborts the benchmark.
fn run_op(plugin: &Plugin, command: &'static str, container_id: &str, conf: &str) -> Sample {
    let mut cmd = Invocation::new(command, container_id).command(&plugin.bin);
    if plugin.kind == Kind::Ipkeep {
        cmd.env("IPKEEP_TIMING", "1");
    }
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", plugin.bin.display()));
    if let Some(mut stdin) = child.stdin.take() {
        // A plugin that does not read stdin (VERSION) may have closed it already.
        let _ = stdin.write_all(conf.as_bytes());
    }
    let output = child.wait_with_output().expect("wait for plugin");
    let wall = started.elapsed();
    let out = PluginOutput::from(output);
    let fail = |why: &str| -> ! {
        panic!(
            "{} {command} {container_id} failed ({why}): exit {:?}\nstdout: {}\nstderr: {}",
            plugin.name, out.code, out.stdout, out.stderr
        )
    };
    if !out.ok() {
        fail("non-zero exit");
    }
    if command == "ADD" && out.ips().len() != 1 {
        fail("expected exactly one address");
    }
    let phases = match (plugin.kind, command) {
        (Kind::Ipkeep, "ADD" | "DEL") => {
            Some(parse_timing(&out.stderr).unwrap_or_else(|| fail("no ipkeep-timing line")))
        }
        _ => None,
    };
    Sample {
        command,
        wall,
        phases,
    }
}

/// One plugin's samples in one scenario and the wall time they took together.
#[derive(Debug, Default)]
struct Run {
    samples: Vec<Sample>,
    elapsed: Duration,
}

impl Run {
    fn walls(&self, command: Option<&str>) -> Vec<Duration> {
        self.samples
            .iter()
            .filter(|s| command.is_none_or(|c| s.command == c))
            .map(|s| s.wall)
            .collect()
    }

    fn ops_per_sec(&self) -> f64 {
        self.samples.len() as f64 / self.elapsed.as_secs_f64()
    }
}

/// The shared statistics, in milliseconds.
fn stats(walls: &[Duration]) -> Summary {
    Summary::of_ms(walls).expect("no samples")
}

/// Mean of ipkeep's phases over the samples that reported them, in milliseconds:
/// `[parse, lock, open, alloc_commit, rest, total, wall, wall - total]`, where `rest` is the
/// part of `total` outside the named phases (mostly closing the database).
fn phase_means(samples: &[Sample]) -> [f64; 8] {
    let mut sums = [0f64; 8];
    let mut n = 0usize;
    for s in samples {
        let Some(p) = s.phases else { continue };
        n += 1;
        let wall_us = s.wall.as_secs_f64() * 1e6;
        let named = p.parse + p.lock + p.open + p.alloc_commit;
        let values = [
            p.parse as f64,
            p.lock as f64,
            p.open as f64,
            p.alloc_commit as f64,
            p.total as f64 - named as f64,
            p.total as f64,
            wall_us,
            wall_us - p.total as f64,
        ];
        for (sum, v) in sums.iter_mut().zip(values) {
            *sum += v;
        }
    }
    sums.map(|s| s / n.max(1) as f64 / 1e3)
}

/// Median and p99 of one phase, in milliseconds.
fn phase_spread(samples: &[Sample], phase: fn(&Phases) -> u64) -> Option<Summary> {
    let values: Vec<Duration> = samples
        .iter()
        .filter_map(|s| s.phases.as_ref().map(|p| Duration::from_micros(phase(p))))
        .collect();
    (!values.is_empty()).then(|| stats(&values))
}

#[derive(Debug)]
struct Scenario {
    name: String,
    what: String,
    ops: usize,
    /// `[ipkeep, host-local]`.
    runs: [Run; 2],
}

fn scale() -> f64 {
    match std::env::var("IPKEEP_BENCH_SCALE") {
        Err(_) => 1.0,
        Ok(s) => {
            let v: f64 = s
                .parse()
                .unwrap_or_else(|_| panic!("IPKEEP_BENCH_SCALE={s:?} is not a number"));
            assert!(v.is_finite() && v > 0.0, "IPKEEP_BENCH_SCALE must be > 0");
            v
        }
    }
}

fn scaled(n: usize, scale: f64) -> usize {
    ((n as f64 * scale).round() as usize).max(1)
}

fn fresh_dir(label: &str) -> TempDir {
    let prefix = format!("ipkeep-bench-{label}-");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix);
    match std::env::var_os("IPKEEP_BENCH_DIR") {
        Some(parent) => builder.tempdir_in(parent),
        None => builder.tempdir(),
    }
    .expect("create a data directory")
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// `plugins` for a scenario whose ipkeep data directory is `dir`: with `IPKEEP_BENCH_AGENT`,
/// ipkeep goes through an agent started for that directory (returned, to be checked with
/// [`agent_done`]).
fn for_scenario(plugins: &[Plugin; 2], dir: &Path) -> ([Plugin; 2], Option<Agent>) {
    let mut plugins = plugins.clone();
    if std::env::var_os("IPKEEP_BENCH_AGENT").is_none() {
        return (plugins, None);
    }
    let agent = Agent::start(dir, AgentOptions::default());
    plugins[0].agent_socket = Some(agent.socket().to_path_buf());
    (plugins, Some(agent))
}

/// `(VmHWM, VmRSS)` of a process, in MiB.
fn memory_of(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| {
                l.strip_prefix(key)?
                    .trim()
                    .strip_suffix("kB")?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(0.0)
            / 1024.0
    };
    (kib("VmHWM:"), kib("VmRSS:"))
}

/// After a scenario through an agent: no command fell back (else the numbers would not be the
/// agent's), and the agent's peak and current memory.
fn agent_done(agent: Option<Agent>, dir: &Path, label: &str, memory: &mut Vec<(String, f64, f64)>) {
    let Some(agent) = agent else {
        return;
    };
    let fallbacks = dir.join(NETWORK).join("fallbacks");
    assert!(
        !fallbacks.exists(),
        "{label}: commands fell back to the plugin process ({}); the agent's log:\n{}",
        std::fs::read_to_string(&fallbacks)
            .unwrap_or_default()
            .trim(),
        agent.log().join("\n")
    );
    let (peak, now) = memory_of(agent.pid());
    println!("  ipkeep-agent memory: peak {peak:.1} MiB, now {now:.1} MiB");
    memory.push((label.to_string(), peak, now));
}

fn cycle(plugin: &Plugin, container_id: &str, conf: &str, into: &mut Vec<Sample>) {
    into.push(run_op(plugin, "ADD", container_id, conf));
    into.push(run_op(plugin, "DEL", container_id, conf));
}

/// ADD+DEL cycles, the two plugins alternating cycle by cycle.
fn sequential(plugins: &[Plugin; 2], dirs: &[&Path; 2], cycles: usize, tag: &str) -> [Run; 2] {
    let confs = [plugins[0].conf(dirs[0]), plugins[1].conf(dirs[1])];
    let mut scratch = Vec::new();
    for w in 0..WARMUP_CYCLES {
        for k in 0..2 {
            cycle(
                &plugins[k],
                &format!("{tag}-warm{w}"),
                &confs[k],
                &mut scratch,
            );
        }
    }
    let mut runs: [Run; 2] = Default::default();
    for i in 0..cycles {
        let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
        for k in order {
            let cid = format!("{tag}-{i:06}");
            cycle(&plugins[k], &cid, &confs[k], &mut runs[k].samples);
        }
    }
    for run in &mut runs {
        run.elapsed = run.samples.iter().map(|s| s.wall).sum();
    }
    runs
}

/// `cycles` ADD+DEL cycles spread over [`WORKERS`] threads, each with its own containers.
fn parallel(plugin: &Plugin, dir: &Path, cycles: usize) -> Run {
    let conf = plugin.conf(dir);
    let mut scratch = Vec::new();
    for w in 0..WARMUP_CYCLES {
        cycle(plugin, &format!("par-warm{w}"), &conf, &mut scratch);
    }
    let conf = conf.as_str();
    let started = Instant::now();
    let samples = std::thread::scope(|s| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let n = cycles / WORKERS + usize::from(w < cycles % WORKERS);
                s.spawn(move || {
                    let mut samples = Vec::with_capacity(2 * n);
                    for i in 0..n {
                        cycle(plugin, &format!("par-w{w:02}-{i:05}"), conf, &mut samples);
                    }
                    samples
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|h| h.join().expect("worker thread"))
            .collect::<Vec<_>>()
    });
    Run {
        samples,
        elapsed: started.elapsed(),
    }
}

fn prefill_ip(i: usize) -> IpAddr {
    // 10.10.0.1 is the gateway; allocation starts at .2 in both plugins.
    store::nth_ip(Ipv4Addr::new(10, 10, 0, 2), i)
}

fn range_set() -> RangeSet {
    RangeSet::from_specs(&[RangeSpec {
        subnet: Some(SUBNET.into()),
        ..Default::default()
    }])
    .expect("bench range set")
}

fn open_ipkeep_store(data_dir: &Path) -> DiskStore {
    let lock = NetworkDir::new(data_dir, NETWORK)
        .expect("network name")
        .lock(Duration::from_secs(30))
        .expect("lock the bench network");
    DiskStore::open(lock, &Default::default()).expect("open the bench store")
}

/// Writes `n` held leases (deleted pods' addresses, kept forever) straight into ipkeep's
/// store, in a few large commits, with the round-robin cursor on the last one.
fn prefill_ipkeep(data_dir: &Path, n: usize) {
    let set = range_set();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let leases = (0..n)
        .map(|i| store::held_lease(prefill_ip(i), i, "bench", now))
        .collect();
    store::write(data_dir, NETWORK, leases, PREFILL_CHUNK, |last| {
        last.last_reserved = vec![(set.to_string(), prefill_ip(n - 1))];
        last.range_sets =
            Some(serde_json::to_string(std::slice::from_ref(&set)).expect("range sets JSON"));
    });
    let count = open_ipkeep_store(data_dir)
        .all()
        .expect("read back the pre-fill")
        .len();
    assert_eq!(count, n, "ipkeep pre-fill");
}

/// Writes `n` reservation files the way host-local does.
fn prefill_host_local(data_dir: &Path, n: usize) {
    let dir = data_dir.join(NETWORK);
    std::fs::create_dir_all(&dir).expect("host-local network dir");
    for i in 0..n {
        std::fs::write(
            dir.join(prefill_ip(i).to_string()),
            format!("pre-{i:06}\r\neth0"),
        )
        .expect("write reservation");
    }
    std::fs::write(
        dir.join("last_reserved_ip.0"),
        prefill_ip(n - 1).to_string(),
    )
    .expect("write last_reserved_ip.0");
}

/// How many addresses a plugin's store holds.
fn lease_count(plugin: &Plugin, data_dir: &Path) -> usize {
    match plugin.kind {
        // The agent holds the store open: ask it.
        Kind::Ipkeep if plugin.agent_socket.is_some() => {
            let socket = plugin.agent_socket.as_deref().expect("socket");
            let out = std::process::Command::new(&plugin.bin)
                .arg("--agent-socket")
                .arg(socket)
                .args(["list", "--json", "--network", NETWORK, "--data-dir"])
                .arg(data_dir)
                .output()
                .expect("ipkeep list");
            assert!(out.status.success(), "ipkeep list: {out:?}");
            let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
            list["leases"].as_array().map_or(0, Vec::len)
        }
        Kind::Ipkeep => open_ipkeep_store(data_dir)
            .all()
            .expect("read leases")
            .len(),
        Kind::HostLocal => std::fs::read_dir(data_dir.join(NETWORK))
            .expect("read host-local dir")
            .filter_map(Result::ok)
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .is_some_and(|n| n.parse::<IpAddr>().is_ok())
            })
            .count(),
    }
}

/// `(apparent bytes, allocated bytes)` of a tree, like `du --apparent-size` and `du`.
fn dir_size(path: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return (0, 0);
    };
    let own = (meta.len(), meta.blocks() * 512);
    if !meta.is_dir() {
        return own;
    }
    std::fs::read_dir(path)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| dir_size(&e.path()))
                .fold(own, |(a, b), (c, d)| (a + c, b + d))
        })
        .unwrap_or(own)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

fn print_sizes(when: &str, dirs: &[TempDir; 2]) {
    let [(ia, id), (ha, hd)] = dirs.each_ref().map(|d| dir_size(d.path()));
    println!(
        "  data dirs {when}: ipkeep {:.1} MiB ({:.1} MiB on disk), host-local {:.1} MiB ({:.1} MiB on disk)",
        mib(ia),
        mib(id),
        mib(ha),
        mib(hd)
    );
}

fn print_scenario(s: &Scenario) {
    println!("\n== {} — {} ({} ops per plugin)", s.name, s.what, s.ops);
    let mut st = [None, None];
    for (k, run) in s.runs.iter().enumerate() {
        let all = stats(&run.walls(None));
        st[k] = Some(all);
        let mut by_cmd = String::new();
        for c in ["ADD", "DEL"] {
            let walls = run.walls(Some(c));
            if !walls.is_empty() {
                let _ = write!(by_cmd, "  {c} median {:.2}", stats(&walls).median);
            }
        }
        println!(
            "  {:<10} n={:<5} median {:>7.2} ms  p90 {:>7.2}  p99 {:>7.2}  mean {:>7.2}  {:>7.1} ops/s{by_cmd}",
            if k == 0 { "ipkeep" } else { "host-local" },
            run.samples.len(),
            all.median,
            all.p90,
            all.p99,
            all.mean,
            run.ops_per_sec(),
        );
    }
    if let [Some(a), Some(b)] = st {
        println!(
            "  ratio ipkeep/host-local: median {}  p99 {}",
            ratio(a.median, Some(b.median)),
            ratio(a.p99, Some(b.p99))
        );
    }
    for c in [None, Some("ADD"), Some("DEL")] {
        let samples: Vec<Sample> = s.runs[0]
            .samples
            .iter()
            .filter(|x| c.is_none_or(|c| x.command == c))
            .copied()
            .collect();
        if samples.iter().all(|x| x.phases.is_none()) {
            continue;
        }
        let m = phase_means(&samples);
        println!(
            "  ipkeep phases {:<4} (mean ms): parse {:.3}  lock {:.3}  open {:.3}  alloc_commit {:.3}  rest/close {:.3}  total {:.3} | wall {:.3}  start+exit {:.3}",
            c.unwrap_or("all"),
            m[0],
            m[1],
            m[2],
            m[3],
            m[4],
            m[5],
            m[6],
            m[7]
        );
    }
    let samples = &s.runs[0].samples;
    let spreads = [
        ("lock", phase_spread(samples, |p| p.lock)),
        ("open", phase_spread(samples, |p| p.open)),
        ("alloc_commit", phase_spread(samples, |p| p.alloc_commit)),
        ("total", phase_spread(samples, |p| p.total)),
    ];
    let mut line = String::new();
    for (name, spread) in spreads {
        if let Some(st) = spread {
            let _ = write!(
                line,
                "  {name} {:.2}/{:.2}/{:.2}",
                st.median, st.p90, st.p99
            );
        }
    }
    if !line.is_empty() {
        println!("  ipkeep phase median/p90/p99 (ms):{line}");
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing else of note. Only
    // run when asked for a benchmark, so `cargo test --all-targets` stays quick.
    if !std::env::args().any(|a| a == "--bench") {
        println!("cni benchmark: run with `cargo bench -p ipkeep-tests --bench cni`");
        return;
    }
    let Some(host_local) = reference_plugin("host-local") else {
        return;
    };
    let scale = scale();
    let through_agent = std::env::var_os("IPKEEP_BENCH_AGENT").is_some();
    let mut memory: Vec<(String, f64, f64)> = Vec::new();
    let plugins = [
        Plugin {
            name: "ipkeep",
            bin: ipkeep_bin(),
            kind: Kind::Ipkeep,
            agent_socket: None,
        },
        Plugin {
            name: "host-local",
            bin: host_local,
            kind: Kind::HostLocal,
            agent_socket: None,
        },
    ];
    println!(
        "ipkeep path: {}",
        if through_agent {
            "through an ipkeep-agent per scenario (release build, --no-kubernetes)"
        } else {
            "plugin process opens the store itself"
        }
    );
    let load_start = load();
    println!("ipkeep:     {}", plugins[0].bin.display());
    println!("host-local: {}", plugins[1].bin.display());
    println!(
        "scale {scale}; cores {}; load average at start {load_start}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let bench_started = Instant::now();
    let mut scenarios = Vec::new();

    // 0. Floor: a process that does nothing but answer VERSION.
    {
        let n = scaled(200, scale);
        let dir = fresh_dir("version");
        let confs = plugins.each_ref().map(|p| p.conf(dir.path()));
        for _ in 0..10 {
            for (p, conf) in plugins.iter().zip(&confs) {
                run_op(p, "VERSION", "version", conf);
            }
        }
        let mut runs: [Run; 2] = Default::default();
        for i in 0..n {
            let order = if i % 2 == 0 { [0, 1] } else { [1, 0] };
            for k in order {
                runs[k]
                    .samples
                    .push(run_op(&plugins[k], "VERSION", "version", &confs[k]));
            }
        }
        for run in &mut runs {
            run.elapsed = run.samples.iter().map(|s| s.wall).sum();
        }
        let s = Scenario {
            name: "version".into(),
            what: "CNI_COMMAND=VERSION, the cost of a process at all".into(),
            ops: n,
            runs,
        };
        print_scenario(&s);
        scenarios.push(s);
    }

    // 1. Sequential ADD+DEL on an empty /16.
    {
        let cycles = scaled(500, scale);
        let dirs = [fresh_dir("seq-ipkeep"), fresh_dir("seq-hl")];
        let (plugins, agent) = for_scenario(&plugins, dirs[0].path());
        let runs = sequential(&plugins, &[dirs[0].path(), dirs[1].path()], cycles, "seq");
        for (p, d) in plugins.iter().zip(&dirs) {
            assert_eq!(lease_count(p, d.path()), 0, "{} left leases", p.name);
        }
        agent_done(agent, dirs[0].path(), "sequential", &mut memory);
        let s = Scenario {
            name: "sequential".into(),
            what: "ADD+DEL cycles, empty /16".into(),
            ops: 2 * cycles,
            runs,
        };
        print_scenario(&s);
        print_sizes("after", &dirs);
        scenarios.push(s);
    }

    // 2. 16 threads, the same number of ops.
    {
        let cycles = scaled(500, scale);
        let mut runs: [Run; 2] = Default::default();
        for (k, run) in runs.iter_mut().enumerate() {
            let dir = fresh_dir(&format!("par-{}", plugins[k].name));
            let (scenario_plugins, agent) = for_scenario(&plugins, dir.path());
            let p = &scenario_plugins[k];
            *run = parallel(p, dir.path(), cycles);
            assert_eq!(lease_count(p, dir.path()), 0, "{} left leases", p.name);
            if k == 0 {
                agent_done(agent, dir.path(), "parallel-16", &mut memory);
            }
        }
        let s = Scenario {
            name: "parallel-16".into(),
            what: format!(
                "{WORKERS} threads of ADD+DEL cycles, empty /16; ops/s = total throughput"
            ),
            ops: 2 * cycles,
            runs,
        };
        print_scenario(&s);
        scenarios.push(s);
    }

    // 3./4. Pre-filled stores.
    for (label, entries) in [("prefilled-1k", 1_000), ("prefilled-60k", 60_000)] {
        let cycles = scaled(200, scale);
        let dirs = [
            fresh_dir(&format!("{label}-ipkeep")),
            fresh_dir(&format!("{label}-hl")),
        ];
        let t = Instant::now();
        prefill_ipkeep(dirs[0].path(), entries);
        let t_ipkeep = t.elapsed();
        let t = Instant::now();
        prefill_host_local(dirs[1].path(), entries);
        let t_hl = t.elapsed();
        let (ik_apparent, ik_disk) = dir_size(dirs[0].path());
        let (hl_apparent, hl_disk) = dir_size(dirs[1].path());
        println!(
            "\n{label}: pre-filled {entries} leases — ipkeep store {:.1} MiB ({:.1} MiB on disk) in {:.1} s, host-local dir {:.1} MiB ({:.1} MiB on disk) in {:.1} s",
            mib(ik_apparent),
            mib(ik_disk),
            t_ipkeep.as_secs_f64(),
            mib(hl_apparent),
            mib(hl_disk),
            t_hl.as_secs_f64(),
        );
        let (plugins, agent) = for_scenario(&plugins, dirs[0].path());
        let runs = sequential(&plugins, &[dirs[0].path(), dirs[1].path()], cycles, label);
        for (p, d) in plugins.iter().zip(&dirs) {
            assert_eq!(
                lease_count(p, d.path()),
                entries,
                "{} store after {label}",
                p.name
            );
        }
        agent_done(agent, dirs[0].path(), label, &mut memory);
        let s = Scenario {
            name: label.into(),
            what: format!("ADD+DEL cycles, {entries} leases already in the /16"),
            ops: 2 * cycles,
            runs,
        };
        print_scenario(&s);
        print_sizes("after", &dirs);
        scenarios.push(s);
    }

    let load_end = load();
    println!(
        "\nfinished in {:.0} s; load average at start {load_start}, at end {load_end}",
        bench_started.elapsed().as_secs_f64()
    );
    println!("\n### Wall time per operation (ms), spawn to exit\n");
    let mut walls = Table::new(&[
        "scenario",
        ">ops/plugin",
        ">ipkeep median",
        ">ipkeep p90",
        ">ipkeep p99",
        ">host-local median",
        ">host-local p90",
        ">host-local p99",
        ">ratio median",
        ">ratio p99",
        ">ipkeep ops/s",
        ">host-local ops/s",
    ]);
    for s in &scenarios {
        let a = stats(&s.runs[0].walls(None));
        let b = stats(&s.runs[1].walls(None));
        let percentiles = ["median", "p90", "p99"];
        let mut row = vec![s.name.clone(), s.ops.to_string()];
        row.extend(a.cells(&percentiles, 2));
        row.extend(b.cells(&percentiles, 2));
        row.extend([
            ratio(a.median, Some(b.median)),
            ratio(a.p99, Some(b.p99)),
            format!("{:.0}", s.runs[0].ops_per_sec()),
            format!("{:.0}", s.runs[1].ops_per_sec()),
        ]);
        walls.row(row);
    }
    print!("{walls}");
    println!("\n### ipkeep phases (mean ms per op, ADD and DEL together)\n");
    let mut phases = Table::new(&[
        "scenario",
        ">parse",
        ">lock wait",
        ">store open",
        ">alloc+commit",
        ">rest (close)",
        ">total (in process)",
        ">wall",
        ">process start+exit",
    ]);
    for s in scenarios.iter().filter(|s| s.name != "version") {
        let m = phase_means(&s.runs[0].samples);
        let mut row = vec![s.name.clone()];
        row.extend(m.iter().map(|v| format!("{v:.3}")));
        phases.row(row);
    }
    print!("{phases}");
    println!("\nload average: start {load_start}, end {load_end}");
}
