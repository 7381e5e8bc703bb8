//! What every binary's `/metrics` carries besides its own metrics: `<prefix>_build_info` (the
//! version, as a label) and the standard `process_*` metrics that Go's and Python's clients
//! export, which prometheus-client has no collector for: read from `/proc/self` at each scrape
//! by the parsers below (pure, tested with kernel text) and [`ProcessCollector`].

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// The release of every ipkeep binary (one workspace version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Registers the process collector on `root` (unprefixed, as Prometheus names them) and
/// `<prefix>_build_info{version}` on a sub-registry with `prefix`, which it returns for the
/// binary's own metrics.
pub fn binary_registry<'a>(root: &'a mut Registry, prefix: &str) -> &'a mut Registry {
    root.register_collector(Box::new(ProcessCollector));
    let registry = root.sub_registry_with_prefix(prefix);
    registry.register(
        "build",
        "The running binary's release (always 1; the version is a label)",
        Info::new(vec![("version", VERSION)]),
    );
    registry
}

/// Linux reports the times of `/proc/<pid>/stat` in clock ticks of `USER_HZ`, which is 100 on
/// every architecture (the kernel's ABI; `sysconf(_SC_CLK_TCK)` says the same).
const USER_HZ: f64 = 100.0;

/// What `/proc/self/stat` says about this process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    /// User plus system CPU time, in seconds.
    pub cpu_seconds: f64,
    /// Start, in seconds after boot.
    pub started_after_boot: f64,
}

/// Parses `/proc/self/stat`; `None` if it is not in the kernel's format. The command name (field
/// 2) is in parentheses and may itself hold spaces and parentheses: the fields are counted
/// from the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = text.get(text.rfind(')')? + 1..)?;
    // Fields 3 onwards: state is field 3, utime 14, stime 15, starttime 22.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    let ticks = field(14)?.checked_add(field(15)?)?;
    Some(Stat {
        cpu_seconds: ticks as f64 / USER_HZ,
        started_after_boot: field(22)? as f64 / USER_HZ,
    })
}

/// What `/proc/self/status` says: resident and virtual memory in bytes, and threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Status {
    /// `VmRSS`, in bytes.
    pub resident_bytes: u64,
    /// `VmSize`, in bytes.
    pub virtual_bytes: u64,
    /// `Threads`.
    pub threads: u64,
}

/// Parses `/proc/self/status` (lines `Key:\tvalue [kB]`); missing keys read as 0.
pub fn parse_status(text: &str) -> Status {
    let mut status = Status::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let mut words = value.split_whitespace();
        let Some(n) = words.next().and_then(|n| n.parse::<u64>().ok()) else {
            continue;
        };
        let scale = if words.next() == Some("kB") { 1024 } else { 1 };
        match key {
            "VmRSS" => status.resident_bytes = n.saturating_mul(scale),
            "VmSize" => status.virtual_bytes = n.saturating_mul(scale),
            "Threads" => status.threads = n,
            _ => {}
        }
    }
    status
}

/// The boot time (`btime` of `/proc/stat`), in seconds since the Unix epoch.
pub fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft limit on open files (`Max open files` of `/proc/self/limits`); `None` when it is
/// unlimited or missing.
pub fn parse_max_open_files(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|soft| soft.parse().ok())
}

/// The `process_*` metrics, read from `/proc/self` at each scrape; a file that cannot be read
/// or parsed leaves its metrics out of that scrape.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessCollector;

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: f64) -> std::fmt::Result {
    let g = ConstGauge::new(value);
    g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        if let Some(stat) = read("/proc/self/stat").as_deref().and_then(parse_stat) {
            let cpu = ConstCounter::new(stat.cpu_seconds);
            cpu.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                cpu.metric_type(),
            )?)?;
            if let Some(boot) = read("/proc/stat").as_deref().and_then(parse_boot_time) {
                gauge(
                    &mut encoder,
                    "process_start_time_seconds",
                    "Start time of the process since unix epoch in seconds",
                    boot as f64 + stat.started_after_boot,
                )?;
            }
        }
        if let Some(status) = read("/proc/self/status").as_deref().map(parse_status) {
            gauge(
                &mut encoder,
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                status.resident_bytes as f64,
            )?;
            gauge(
                &mut encoder,
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                status.virtual_bytes as f64,
            )?;
            gauge(
                &mut encoder,
                "process_threads",
                "Number of OS threads in the process",
                status.threads as f64,
            )?;
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            gauge(
                &mut encoder,
                "process_open_fds",
                "Number of open file descriptors",
                fds.count() as f64,
            )?;
        }
        if let Some(max) = read("/proc/self/limits")
            .as_deref()
            .and_then(parse_max_open_files)
        {
            gauge(
                &mut encoder,
                "process_max_fds",
                "Maximum number of open file descriptors",
                max as f64,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        // A command name with a space and a parenthesis, as a process may name itself.
        let line = "4242 (ipkeep (x) agent) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 75 0 0 20 0 9 0 123456 987654321 4321 18446744073709551615";
        let stat = parse_stat(line).expect("a stat line");
        assert_eq!(stat.cpu_seconds, 3.25);
        assert_eq!(stat.started_after_boot, 1234.56);
        assert_eq!(parse_stat("no parenthesis 1 2 3"), None);
        assert_eq!(parse_stat("1 (short) S 1 2"), None);
    }

    #[test]
    fn status_limits_and_boot_time_parse_as_the_kernel_writes_them() {
        let status =
            "Name:\tipkeep-agent\nVmSize:\t  123456 kB\nVmRSS:\t   20480 kB\nThreads:\t7\n";
        assert_eq!(
            parse_status(status),
            Status {
                resident_bytes: 20480 * 1024,
                virtual_bytes: 123456 * 1024,
                threads: 7
            }
        );
        assert_eq!(parse_status("garbage"), Status::default());
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \nMax cpu time              unlimited            unlimited            seconds   \nMax open files            65536                524288               files     \n";
        assert_eq!(parse_max_open_files(limits), Some(65536));
        assert_eq!(
            parse_max_open_files(
                "Max open files            unlimited            unlimited            files"
            ),
            None
        );
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1764300000\nprocesses 9\n"),
            Some(1_764_300_000)
        );
    }

    #[test]
    fn this_process_exports_build_info_and_its_process_metrics() {
        let mut root = Registry::default();
        let registry = binary_registry(&mut root, "ipkeep_test");
        registry.register(
            "things",
            "Things",
            prometheus_client::metrics::counter::Counter::<u64>::default(),
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &root).expect("encode");
        for series in [
            &format!("ipkeep_test_build_info{{version=\"{VERSION}\"}} 1"),
            "ipkeep_test_things_total 0",
            "# TYPE process_cpu_seconds counter",
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_start_time_seconds ",
            "process_open_fds ",
            "process_max_fds ",
            "process_threads ",
        ] {
            assert!(text.contains(series), "no {series:?} in:\n{text}");
        }
        assert!(!text.contains("ipkeep_test_process"), "{text}");
    }
}
