//! Prints the PersistentPodState CRD as YAML: `cargo run -p ipkeep-controller --bin crdgen >
//! deploy/crd.yaml`. A test fails when the committed file differs.

fn main() -> anyhow::Result<()> {
    print!("{}", ipkeep_controller::crd_yaml()?);
    Ok(())
}
