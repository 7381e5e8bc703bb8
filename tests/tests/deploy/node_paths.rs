//! Issue 41 (gaps 5, 6): every directory of the node the agent and the plugin use is a value,
//! landing in the agent's volumes, mounts and flags and in the CNI configuration it writes; the
//! reference plugins that configuration names come from the image when asked.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;

use serde_json::Value;

use super::chart::{args, pod, refused, render};
use super::manifests::repo_root;

/// A k3s node's directories (docs/distributions.md), and ipkeep's own moved too, so that every
/// value differs from its default.
const MOVED: [(&str, &str); 5] = [
    ("cniBinDir", "/var/lib/rancher/k3s/data/cni"),
    ("cniConfDir", "/var/lib/rancher/k3s/agent/etc/cni/net.d"),
    ("netnsDir", "/run/netns"),
    ("dataDir", "/var/lib/rancher/ipkeep"),
    ("socketDir", "/run/k3s/ipkeep"),
];

/// The agent's hostPath volumes (name → host path) and its container's mounts (name → path).
fn volumes_and_mounts(agent: &Value) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let spec = pod(agent);
    let volumes = (spec["volumes"].as_array().expect("volumes").iter())
        .filter_map(|v| {
            Some((
                v["name"].as_str()?.into(),
                v["hostPath"]["path"].as_str()?.into(),
            ))
        })
        .collect();
    let mounts = (spec["containers"][0]["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter())
    .filter_map(|m| Some((m["name"].as_str()?.into(), m["mountPath"].as_str()?.into())))
    .collect();
    (volumes, mounts)
}

#[test]
fn every_host_directory_is_a_value() {
    let mut sets: Vec<String> = MOVED
        .iter()
        .map(|(key, path)| format!("agent.{key}={path}"))
        .collect();
    sets.push("cni.enabled=true".into());
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let Some(r) = render(&sets) else { return };
    let agent = r.find("DaemonSet", "ipkeep-agent");
    let (volumes, mounts) = volumes_and_mounts(agent);
    let host = |name: &str| volumes.get(name).map(String::as_str);
    assert_eq!(host("cni-bin"), Some(MOVED[0].1));
    assert_eq!(host("cni-conf"), Some(MOVED[1].1));
    // The agent sees the namespaces, the stores and the socket where the plugin, on the host,
    // names them: mounted at the same paths.
    for (name, path) in [
        ("netns", MOVED[2].1),
        ("data", MOVED[3].1),
        ("run", MOVED[4].1),
    ] {
        assert_eq!(host(name), Some(path), "{name}");
        assert_eq!(mounts.get(name).map(String::as_str), Some(path), "{name}");
    }
    let a = args(agent);
    assert!(a.contains(&format!("--data-dir={}", MOVED[3].1)), "{a:?}");
    assert!(
        a.contains(&format!("--socket={}/agent.sock", MOVED[4].1)),
        "{a:?}"
    );
    // What the agent writes into each node's configuration directory names the same store and
    // socket, and the plugin accepts it.
    let cm = r.find("ConfigMap", "ipkeep-cni-config");
    let template = cm["data"]["10-ipkeep.conflist"]
        .as_str()
        .expect("the template");
    let rendered = ipkeep_agent::cniconf::render(template, &["10.244.1.0/24".into()])
        .expect("the agent renders it");
    let list: Value = serde_json::from_str(&rendered).expect("JSON");
    let ipam = &list["plugins"][0]["ipam"];
    assert_eq!(ipam["dataDir"], MOVED[3].1);
    assert_eq!(
        ipam["agentSocket"],
        format!("{}/agent.sock", MOVED[4].1).as_str()
    );
    let mut conf = list["plugins"][0].clone();
    conf["name"] = list["name"].clone();
    conf["cniVersion"] = list["cniVersion"].clone();
    super::assert_plugin_accepts(&conf);

    // The defaults: the paths of a kubeadm node, and the plugin's default socket left implicit.
    let defaults = render(&["cni.enabled=true"]).expect("helm");
    let (volumes, _) = volumes_and_mounts(defaults.find("DaemonSet", "ipkeep-agent"));
    let want: BTreeMap<String, String> = [
        ("cni-bin", "/opt/cni/bin"),
        ("cni-conf", "/etc/cni/net.d"),
        ("netns", "/var/run/netns"),
        ("data", "/var/lib/cni/ipkeep"),
        ("run", "/run/ipkeep"),
    ]
    .into_iter()
    .map(|(n, p)| (n.to_string(), p.to_string()))
    .collect();
    assert_eq!(volumes, want);
    let template = defaults.find("ConfigMap", "ipkeep-cni-config")["data"]["10-ipkeep.conflist"]
        .as_str()
        .expect("the template")
        .to_string();
    assert!(!template.contains("agentSocket"), "{template}");

    for bad in ["opt/cni/bin", "/opt/cni/bin/", "/opt/cni bin", "/opt//cni"] {
        let message = refused(&[&format!("agent.cniBinDir={bad}")]).expect("helm");
        assert!(message.contains("/agent/cniBinDir"), "{bad}: {message}");
    }
}

/// The init container's script of `values`, run by the shell the image carries (busybox) with
/// its paths moved into a directory: returns what it installed, with their modes.
fn install(sets: &[&str]) -> Option<BTreeMap<String, u32>> {
    let r = render(sets)?;
    let init = &pod(r.find("DaemonSet", "ipkeep-agent"))["initContainers"][0];
    let script = init["command"][2]
        .as_str()
        .expect("sh -c SCRIPT")
        .to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let (image, host) = (dir.path().join("image"), dir.path().join("host"));
    std::fs::create_dir_all(&image).expect("mkdir");
    std::fs::create_dir_all(&host).expect("mkdir");
    for name in ["ipkeep", "bridge", "portmap", "loopback"] {
        std::fs::write(image.join(name), name).expect("write");
    }
    // An older plugin on the node, replaced.
    std::fs::write(host.join("bridge"), "old").expect("write");
    let script = script
        .replace("/host/opt/cni/bin", host.to_str().expect("utf-8"))
        .replace("/opt/cni/bin/", &format!("{}/", image.display()))
        .replace(
            "/usr/local/bin/ipkeep",
            &image.join("ipkeep").display().to_string(),
        );
    let shell = ["/bin/busybox", "/bin/sh"]
        .into_iter()
        .find(|s| std::path::Path::new(s).exists())
        .expect("a shell");
    let mut cmd = Command::new(shell);
    if shell.ends_with("busybox") {
        cmd.arg("sh");
    }
    let out = cmd.args(["-c", &script]).output().expect("run the shell");
    assert!(out.status.success(), "{script}: {out:?}");
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir(&host).expect("read_dir") {
        let entry = entry.expect("entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        let content = std::fs::read_to_string(entry.path()).expect("read");
        assert!(
            content == name || (name == "bridge" && content == "old"),
            "{name}: {content}"
        );
        if content == name {
            let mode = entry.metadata().expect("metadata").permissions().mode() & 0o777;
            found.insert(name, mode);
        }
    }
    Some(found)
}

#[test]
fn install_plugins_copies_what_the_configuration_names_from_the_image() {
    let Some(plain) = install(&[]) else { return };
    assert_eq!(plain, BTreeMap::from([("ipkeep".to_string(), 0o755)]));
    let all = install(&["cni.installPlugins=true"]).expect("helm");
    let want: BTreeMap<String, u32> = ["bridge", "ipkeep", "loopback", "portmap"]
        .into_iter()
        .map(|n| (n.to_string(), 0o755))
        .collect();
    assert_eq!(all, want, "the old bridge replaced, the others added");

    // The configuration names bridge and portmap; the image carries them (the Dockerfile's
    // plugin stage, which scripts/images.py follows), with loopback.
    let r = render(&["cni.enabled=true"]).expect("helm");
    let template = r.find("ConfigMap", "ipkeep-cni-config")["data"]["10-ipkeep.conflist"]
        .as_str()
        .expect("the template")
        .to_string();
    let list: Value =
        serde_json::from_str(&template.replace("usePodCidr", "10.0.0.0/24")).expect("JSON");
    let named: Vec<&str> = (list["plugins"].as_array().expect("plugins").iter())
        .filter_map(|p| p["type"].as_str())
        .collect();
    assert_eq!(named, ["bridge", "portmap"]);
    let dockerfile = std::fs::read_to_string(repo_root().join("Dockerfile")).expect("Dockerfile");
    for plugin in ["main/bridge", "meta/portmap", "main/loopback"] {
        assert!(
            dockerfile.contains(&format!("containernetworking/plugins/plugins/{plugin}@")),
            "the Dockerfile builds no {plugin}"
        );
    }
}

/// The recipes docs/distributions.md gives are the values files CI lints the chart with and
/// `scripts/cluster.sh --node-layout` installs with, word for word.
#[test]
fn the_distribution_recipes_are_the_values_the_tests_install_with() {
    let doc = std::fs::read_to_string(repo_root().join("docs/distributions.md"))
        .expect("docs/distributions.md");
    for layout in ["k3s", "kind"] {
        let path = format!("charts/ipkeep/ci/{layout}-values.yaml");
        let values = std::fs::read_to_string(repo_root().join(&path)).expect("the values file");
        assert!(
            doc.contains(&format!("```yaml\n{values}```")),
            "docs/distributions.md does not show {path} as it is"
        );
        let cluster = std::fs::read_to_string(repo_root().join("scripts/lib/nodes.sh"))
            .expect("scripts/lib/nodes.sh");
        assert!(
            cluster.contains(&format!("    {layout}) cni_conf_dir=")),
            "{layout}"
        );
    }
}
