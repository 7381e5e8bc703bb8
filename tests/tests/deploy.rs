//! The example configurations in `deploy/` are accepted by the plugin as shipped.

use ipkeep_tests::{Invocation, ipkeep_bin};

#[test]
fn example_conflist_is_a_valid_ipkeep_configuration() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/cni/10-ipkeep-bridge.conflist"
    );
    let list: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("JSON");
    let plugin = list["plugins"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["ipam"]["type"] == "ipkeep"))
        .expect("a plugin delegating to ipkeep");
    assert_eq!(
        plugin["capabilities"]["io.kubernetes.cri.pod-annotations"], true,
        "retention needs the annotations capability"
    );
    // What libcni hands the main plugin (and it hands on to us): the plugin with the list's
    // name and version; STATUS validates it without touching state.
    let mut conf = plugin.clone();
    conf["name"] = list["name"].clone();
    conf["cniVersion"] = "1.1.0".into();
    let out = Invocation::new("STATUS", "-").run(&ipkeep_bin(), &conf.to_string());
    assert!(out.ok(), "{out:?}");
}
