//! What a node says when ipkeep cannot record addresses: containerd 2.x asks the network for its
//! STATUS (CNI 1.1: libcni → `bridge` → ipkeep), and kubelet turns an error into the Node's
//! `Ready=False` ("container runtime network not ready: NetworkReady=false ..." with ipkeep's
//! reason), so the scheduler stops sending pods there: pods wait rather than fail one by one at
//! their sandbox's ADD. Once the store can commit again, the node is Ready and the waiting pod
//! starts with an address ipkeep recorded.
//!
//! Needs a cluster whose nodes have ipkeep's data on a file system of its own
//! (`scripts/cluster.sh up --cni-data-size`, `IPKEEP_CNI_DATA_SIZE`), filled from the host.

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use ipkeep_tests::cluster::wait_until;
use ipkeep_tests::kubectl::Kubectl;
use serde_json::Value;

const NODE: &str = "node-1";
const POD: &str = "waits-for-the-network";

/// Node `node`'s Ready condition: (status, message).
fn ready_condition(kubectl: &Kubectl, node: &str) -> Option<(String, String)> {
    let n = kubectl.get(&["node", node])?;
    let c = n["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "Ready")?
        .clone();
    Some((
        c["status"].as_str()?.to_string(),
        c["message"].as_str().unwrap_or_default().to_string(),
    ))
}

/// Fills the file system of `dir` with `dir/filler` until less than `leave` bytes are free
/// (written, not sparse: a tmpfs counts only written pages).
fn fill(dir: &Path, leave: u64) -> std::path::PathBuf {
    let st = nix::sys::statvfs::statvfs(dir).expect("statvfs");
    let free = st.blocks_available() * st.fragment_size();
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).expect("the filler");
    let chunk = vec![0u8; 1 << 20];
    let mut left = free.saturating_sub(leave);
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n]).expect("fill");
        left -= n as u64;
    }
    f.sync_all().expect("sync the filler");
    path
}

pub fn follows_the_store(state: &Path) {
    let bin = std::fs::read_to_string(state.join("bin")).unwrap();
    let kubectl = Kubectl::new(
        &Path::new(bin.trim()).join("kubectl"),
        &state.join("admin.kubeconfig"),
    );
    let data = state
        .join("nodes")
        .join(NODE)
        .join("root/var/lib/cni/ipkeep");
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        mounts.contains(&format!(" {} tmpfs ", data.display())),
        "{} is not a file system of its own: bring the cluster up with --cni-data-size (IPKEEP_CNI_DATA_SIZE)",
        data.display()
    );
    wait_until(&format!("{NODE} Ready"), Duration::from_secs(120), || {
        (ready_condition(&kubectl, NODE)?.0 == "True").then_some(())
    });

    // Less free than ipkeep needs to record an address (256 KiB): STATUS fails.
    let filler = fill(&data, 64 << 10);
    let t0 = Instant::now();
    let message = wait_until(
        &format!("{NODE} NotReady because its network is not ready"),
        Duration::from_secs(90),
        || {
            let (status, message) = ready_condition(&kubectl, NODE)?;
            (status == "False" && message.contains("NetworkReady=false")).then_some(message)
        },
    );
    eprintln!(
        "{NODE} NotReady {:.1} s after its ipkeep disk filled: {message}",
        t0.elapsed().as_secs_f64()
    );
    assert!(
        message.contains("bytes free") && message.contains("ipam.dataDir"),
        "the node does not say what ipkeep needs: {message}"
    );

    // A pod for that node waits; it is not sent there to fail at its sandbox's ADD.
    kubectl.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {POD}, namespace: default}}\n\
         spec:\n  nodeSelector: {{kubernetes.io/hostname: {NODE}}}\n  \
         terminationGracePeriodSeconds: 1\n  containers:\n  - name: sleep\n    \
         image: localhost/ipkeep/busybox:dev\n    imagePullPolicy: Never\n    \
         command: [sleep, '1d']\n"
    ));
    std::thread::sleep(Duration::from_secs(15));
    let pod = kubectl.get(&["pod", POD, "-n", "default"]).unwrap();
    assert_eq!(pod["status"]["phase"], "Pending", "{pod}");
    let sandbox_failures = |kubectl: &Kubectl| -> Vec<Value> {
        let events = kubectl
            .get(&[
                "events",
                "-n",
                "default",
                "--field-selector",
                &format!("involvedObject.name={POD},reason=FailedCreatePodSandBox"),
            ])
            .unwrap();
        events["items"].as_array().cloned().unwrap_or_default()
    };
    assert_eq!(sandbox_failures(&kubectl), Vec::<Value>::new());

    // Space again: the node is Ready, the pod starts with an address ipkeep recorded.
    std::fs::remove_file(&filler).unwrap();
    let t0 = Instant::now();
    wait_until(
        &format!("{NODE} Ready again"),
        Duration::from_secs(90),
        || (ready_condition(&kubectl, NODE)?.0 == "True").then_some(()),
    );
    eprintln!(
        "{NODE} Ready {:.1} s after its ipkeep disk had space again",
        t0.elapsed().as_secs_f64()
    );
    let ip = wait_until(
        "the waiting pod running with an IP",
        Duration::from_secs(120),
        || {
            let p = kubectl.get(&["pod", POD, "-n", "default"])?;
            (p["status"]["phase"] == "Running")
                .then(|| p["status"]["podIP"].as_str().map(String::from))?
        },
    );
    let leases = super::retention::Real::new(state).leases(NODE);
    assert!(
        leases
            .iter()
            .any(|l| l["ip"] == ip.as_str() && l["pod"]["name"] == POD),
        "{ip} of {POD} is not in {NODE}'s store: {leases:?}"
    );
    assert_eq!(sandbox_failures(&kubectl), Vec::<Value>::new());
    kubectl.run(&["delete", "pod", POD, "-n", "default", "--wait=false"]);
}
