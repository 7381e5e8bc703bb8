//! Prints the PersistentPodState CRD as YAML: `cargo run -p ipkeep-controller --bin crdgen >
//! charts/ipkeep/crds/persistentpodstates.yaml`, then `scripts/render-deploy.sh` renders it
//! into `deploy/crd.yaml`. A test fails when the chart's file differs, and
//! `scripts/validate-deploy.sh` when deploy/ is stale.

fn main() -> anyhow::Result<()> {
    print!("{}", ipkeep_controller::crd_yaml()?);
    Ok(())
}
