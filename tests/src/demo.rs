//! The node side of a rebuild without a cluster, for the network-namespace test
//! (`tests/tests/netns.rs`): Debian's real `bridge` plugin delegating IPAM to `ipkeep`, in real
//! network namespaces, one pod deleted and rebuilt under the same name.
//!
//! Everything lives in throwaway namespaces: a "node" namespace holds the bridge, so the host's
//! own network is never touched, and every namespace is removed even when a step fails.

use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::{DEBIAN_CNI_DIR, Netns};

/// What the demonstration observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoReport {
    /// web-0's address before it was deleted.
    pub before: String,
    /// web-0's address after it was rebuilt with a new sandbox.
    pub after: String,
    /// The address of a pod created while web-0 was gone.
    pub bystander: String,
}

struct Cluster {
    node: Netns,
    conf: String,
    cni_path: String,
    bridge: PathBuf,
    suffix: String,
}

impl Cluster {
    fn cni(
        &self,
        command: &str,
        pod: &str,
        sandbox: &str,
        netns: &Netns,
    ) -> Result<String, String> {
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=demo;K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={sandbox};K8S_POD_UID=uid-{sandbox}"
        );
        let mut child = Command::new("ip")
            .args(["netns", "exec", self.node.name()])
            .arg(&self.bridge)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("CNI_COMMAND", command)
            .env("CNI_CONTAINERID", sandbox)
            .env("CNI_NETNS", netns.path())
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", &self.cni_path)
            .env("CNI_ARGS", args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run the bridge plugin: {e}"))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(self.conf.as_bytes())
                .map_err(|e| e.to_string())?;
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(format!(
                "bridge {command} for {pod} failed: {stdout}{}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(stdout)
    }

    fn add(&self, pod: &str, sandbox: &str, netns: &Netns) -> Result<String, String> {
        let out = self.cni("ADD", pod, sandbox, netns)?;
        let json: serde_json::Value = serde_json::from_str(&out)
            .map_err(|e| format!("bridge result is not JSON ({e}): {out}"))?;
        json["ips"][0]["address"]
            .as_str()
            .and_then(|a| a.split('/').next())
            .map(str::to_string)
            .ok_or_else(|| format!("no address in the result: {out}"))
    }

    fn pod_netns(&self, pod: &str, generation: u32) -> Netns {
        Netns::new(&format!("ik-{pod}-{generation}-{}", self.suffix))
    }
}

fn ping(from: &Netns, to: &str) -> bool {
    from.exec("ping", &["-c", "1", "-W", "2", to])
        .status
        .success()
}

/// The IPv4 address configured on the pod's eth0, as the kernel reports it.
fn address_in(netns: &Netns) -> String {
    let out = netns.exec("ip", &["-4", "-o", "addr", "show", "dev", "eth0"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut words = text.split_whitespace();
    match words.by_ref().find(|w| *w == "inet").and(words.next()) {
        Some(addr) => format!("eth0 inet {addr} in the pod's namespace"),
        None => format!("no IPv4 address on eth0: {text}"),
    }
}

/// Runs the scenario, narrating to `out`. `ipkeep_dir` holds the `ipkeep` binary; `data_dir`
/// is the plugin's state directory.
pub fn run(ipkeep_dir: &Path, data_dir: &Path, out: &mut dyn Write) -> Result<DemoReport, String> {
    let bridge = Path::new(DEBIAN_CNI_DIR).join("bridge");
    if !bridge.exists() {
        return Err(format!(
            "{} is missing: install containernetworking-plugins",
            bridge.display()
        ));
    }
    let suffix = std::process::id().to_string();
    let cluster = Cluster {
        node: Netns::new(&format!("ik-node-{suffix}")),
        conf: format!(
            r#"{{"cniVersion":"1.0.0","name":"ipkeep-demo","type":"bridge","bridge":"ikbr0","isGateway":true,"ipMasq":false,
"runtimeConfig":{{"io.kubernetes.cri.pod-annotations":{{"ipkeep.dev/ip-retention":"1h","ipkeep.dev/persistent-pod-state":"web"}}}},
"ipam":{{"type":"ipkeep","dataDir":"{}","ranges":[[{{"subnet":"10.123.0.0/24","rangeStart":"10.123.0.2","rangeEnd":"10.123.0.4"}}]],"routes":[{{"dst":"0.0.0.0/0"}}]}}}}"#,
            data_dir.display()
        ),
        cni_path: format!("{}:{DEBIAN_CNI_DIR}", ipkeep_dir.display()),
        bridge,
        suffix,
    };
    let say = |out: &mut dyn Write, line: String| {
        let _ = writeln!(out, "{line}");
    };
    say(
        out,
        format!(
            "node namespace {} with bridge ikbr0, range 10.123.0.2-10.123.0.4 (three addresses), retention 1h",
            cluster.node.name()
        ),
    );

    let web0 = cluster.pod_netns("web-0", 1);
    let web1 = cluster.pod_netns("web-1", 1);
    let before = cluster.add("web-0", "sandbox-a", &web0)?;
    let peer = cluster.add("web-1", "sandbox-b", &web1)?;
    say(
        out,
        format!(
            "ADD  demo/web-0 (sandbox-a) -> {before}   [{}]",
            address_in(&web0)
        ),
    );
    say(out, format!("ADD  demo/web-1 (sandbox-b) -> {peer}"));
    if !ping(&web1, &before) || !ping(&web0, &peer) {
        return Err("the two pods cannot ping each other over the bridge".into());
    }
    say(
        out,
        format!("ping web-1 -> web-0 ({before}) ok, web-0 -> web-1 ({peer}) ok"),
    );

    cluster.cni("DEL", "web-0", "sandbox-a", &web0)?;
    drop(web0);
    say(
        out,
        format!(
            "DEL  demo/web-0 (sandbox-a); its namespace is gone; {before} is held for demo/web-0"
        ),
    );
    let list = Command::new(ipkeep_dir.join("ipkeep"))
        .args(["list", "--network", "ipkeep-demo", "--data-dir"])
        .arg(data_dir)
        .output()
        .map_err(|e| format!("ipkeep list: {e}"))?;
    say(
        out,
        format!(
            "\n$ ipkeep list --network ipkeep-demo\n{}",
            String::from_utf8_lossy(&list.stdout)
        ),
    );

    let web2 = cluster.pod_netns("web-2", 1);
    let bystander = cluster.add("web-2", "sandbox-c", &web2)?;
    say(
        out,
        format!(
            "ADD  demo/web-2 (sandbox-c) -> {bystander}   (a new pod does not get the held address)"
        ),
    );
    // A real rebuild takes seconds. Linux ignores ARP updates for an entry refreshed less than
    // `locktime` (1 s) ago, so without this pause web-1 would keep web-0's old MAC address
    // and ignore the gratuitous ARP the bridge plugin sends for the new sandbox.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let rebuilt = cluster.pod_netns("web-0", 2);
    let after = cluster.add("web-0", "sandbox-d", &rebuilt)?;
    say(
        out,
        format!("ADD  demo/web-0 (sandbox-d, new namespace) -> {after}"),
    );
    // Same IP, new MAC address. Debian's bridge plugin (1.1.1) sends no gratuitous ARP, so
    // peers would keep the old MAC until their neighbour entry expires (up to ~45 s); the
    // rebuilt pod announces itself, as newer bridge plugins and most CNIs do.
    let garp = rebuilt.exec("arping", &["-U", "-c", "1", "-I", "eth0", &after]);
    if !garp.status.success() && garp.status.code() != Some(1) {
        return Err(format!(
            "arping failed: {}",
            String::from_utf8_lossy(&garp.stderr)
        ));
    }
    say(
        out,
        format!("     web-0 announced {after} with a gratuitous ARP (new MAC, same IP)"),
    );
    if !ping(&web1, &after) {
        let neigh = web1.exec("ip", &["neigh", "show"]);
        return Err(format!(
            "web-1 cannot reach the rebuilt web-0 at {after} (web-1's neighbour table: {})",
            String::from_utf8_lossy(&neigh.stdout).trim()
        ));
    }
    say(out, format!("ping web-1 -> rebuilt web-0 ({after}) ok"));

    // A late DEL from the first sandbox must not take the address from the new one.
    let gone = Netns::new(&format!("ik-stale-{}", cluster.suffix));
    cluster.cni("DEL", "web-0", "sandbox-a", &gone)?;
    if !ping(&web1, &after) {
        return Err("a late DEL of the old sandbox broke the rebuilt pod".into());
    }
    say(
        out,
        "late DEL of sandbox-a changed nothing; web-0 still reachable".into(),
    );

    for (pod, sandbox, ns) in [
        ("web-0", "sandbox-d", &rebuilt),
        ("web-1", "sandbox-b", &web1),
        ("web-2", "sandbox-c", &web2),
    ] {
        cluster.cni("DEL", pod, sandbox, ns)?;
    }
    let verdict = if before == after {
        "kept its IP across delete + rebuild"
    } else {
        "IP CHANGED"
    };
    let rows = [
        ["POD", "IP BEFORE", "IP AFTER", "WHAT IPKEEP DID"],
        ["web-0", &before, &after, verdict],
        [
            "web-2",
            "-",
            &bystander,
            "new pod, never given a held address",
        ],
    ];
    let mut table = String::new();
    for [pod, was, now, what] in rows {
        let _ = writeln!(table, "{pod:<8} {was:<16} {now:<16} {what}");
    }
    say(out, table);
    Ok(DemoReport {
        before,
        after,
        bystander,
    })
}
