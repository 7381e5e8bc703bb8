#!/usr/bin/env bash
# Every check CI runs: the Helm chart and the deploy/ manifests rendered from it (offline,
# scripts/validate-deploy.sh with the helm of scripts/helm-build.sh and the promtool of
# scripts/promtool-build.sh), formatting, clippy with warnings as errors, the dependency graph's
# licences, duplicate versions and sources (deny.toml, with the cargo-deny of
# scripts/cargo-deny-build.sh), and all tests, including the network-namespace tests (which
# need root; without root they skip loudly, and under CI they fail instead of skipping) and the
# tests on a real cluster (tests/tests/cluster.rs: the control plane with kwok nodes;
# tests/tests/e2e.rs: real nodes with kubelet and containerd, ipkeep installed from the release
# bundle; tests/tests/flannel.rs: the same nodes with flannel, ipkeep as its IPAM), and the
# upgrades from 0.1.0 (its kubectl apply -k install adopted by Helm) and from 0.2.0 on real
# nodes (scripts/upgrade-test.sh; $IPKEEP_UPGRADE_FROM, default "0.1.0 0.2.0", empty skips). The
# Kubernetes components, the node runtime (containerd, runc, CNI plugins) and flannel are built
# from their Go modules first, and OpenKruise's kruise-manager from its source archive (the story
# on real nodes runs it), or reused from the cache (docs/cluster.md); the real nodes run ipkeep's
# release build.
#
# Kubernetes: everything runs on the default release (scripts/cluster.sh: v1.37.2, the newest
# supported); the control-plane suite (--test cluster) runs again on each release in
# $IPKEEP_K8S_ALSO (default v1.35.4, the oldest supported), so both ends of the window are
# tested. IPKEEP_K8S_ALSO= (empty) skips that second run. New StatefulSet pods get their pin from
# the admission policy on v1.37.2 and from the webhook on v1.35.4 (scripts/cluster.sh
# --admission auto): the control-plane suite covers both, and tests/tests/e2e.rs runs the story
# on real nodes with the policy (v1.37.2; kind's node layout, no extender) and with the webhook
# (v1.35.4; k3s's node layout). The release bundle (scripts/release-bundle.sh: the packaged
# chart, the image, the plugin, the CRD, SBOMs, SHA256SUMS) is made once, from the clean checkout
# under CI, and every real-node cluster installs from it (IPKEEP_BUNDLE).
set -euo pipefail
cd "$(dirname "$0")/.."

also=${IPKEEP_K8S_ALSO-v1.35.4}
scripts/install-deps.sh
kubectl_bin=
helm_bin=
promtool_bin=
runtime_dir=
if command -v go >/dev/null; then
  # kubelet and kube-proxy only where real nodes can run (root).
  node=(--without-kubelet); [ "$(id -u)" -eq 0 ] && node=()
  kubectl_bin=$(scripts/k8s-build.sh "${node[@]}" --print-dir | tail -1)/kubectl
  # Helm 4 for the chart checks (lint, renderings, deploy/ not stale), built or cached.
  helm_bin=$(scripts/helm-build.sh --print-dir | tail -1)/bin/helm
  # promtool (Prometheus) for the alerting rules (check rules, test rules), built or cached;
  # where real nodes run, the Prometheus server too (tests/tests/e2e/monitoring.rs).
  server=(); [ "$(id -u)" -eq 0 ] && server=(--server)
  promtool_bin=$(scripts/promtool-build.sh "${server[@]}" --print-dir | tail -1)/bin/promtool
  # The node runtime the real nodes run (containerd, runc, CNI plugins), built or cached.
  if [ "$(id -u)" -eq 0 ]; then
    runtime_dir=$(scripts/runtime-build.sh --print-dir | tail -1)
    scripts/flannel-build.sh >/dev/null # flanneld and its CNI plugin (tests/tests/flannel.rs)
    # Kubernetes' e2e.test and agnhost for the conformance subset (tests/tests/conformance.rs).
    scripts/e2e-build.sh >/dev/null
  fi
  for v in $also; do
    # With kubelet where real nodes run: tests/tests/e2e.rs runs the webhook path on v1.35.4.
    scripts/k8s-build.sh --k8s-version "$v" "${node[@]}" >/dev/null
  done
  [ "$(id -u)" -eq 0 ] && scripts/k8s-build.sh --k8s-version v1.35.4 >/dev/null
else
  echo "test.sh: Go is not installed: the tests on a real cluster will skip (under CI: fail)" >&2
fi
# OpenKruise v1.9.0's source archive, whose CRDs the Advanced StatefulSet tests load
# (scripts/kruise-src.sh: $IPKEEP_KRUISE_SRC, which .ci/run sets to a local copy, or fetched).
IPKEEP_KRUISE_SRC=$(scripts/kruise-src.sh)
export IPKEEP_KRUISE_SRC
# kruise-manager from it, built or cached, where real nodes run: tests/tests/e2e.rs's story brings
# its cluster up with it (IPKEEP_WITH_KRUISE) for the Advanced StatefulSet step.
[ -n "$runtime_dir" ] && scripts/kruise-build.sh "$IPKEEP_KRUISE_SRC" >/dev/null
IPKEEP_KUBECTL=$kubectl_bin IPKEEP_HELM=$helm_bin IPKEEP_PROMTOOL=$promtool_bin \
  scripts/validate-deploy.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
"$(scripts/cargo-deny-build.sh --print-dir | tail -1)/bin/cargo-deny" deny --locked check bans licenses sources
cargo build --workspace --locked --bins
if [ "$(id -u)" -eq 0 ]; then
  # The release bundle every real-node cluster installs from: the release binaries, the static
  # plugin, the image built from them. Under CI from the clean checkout, as a release is made.
  cargo build --release --locked -p ipkeep-agent --bin ipkeep-agent -p ipkeep-controller \
    --bin ipkeep-controller -p ipkeep-scheduler-ext --bin ipkeep-scheduler-ext
  plugin=$(scripts/build-plugin.sh | tail -1)
  dirty=(--allow-dirty); [ -n "${CI:-}" ] && dirty=()
  target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
  rm -rf "$target_dir/bundle"
  IPKEEP_BUNDLE=$(scripts/release-bundle.sh "$target_dir/bundle" "${dirty[@]}" \
    --release-dir "$target_dir/release" --plugin "$plugin" | tail -1)
  export IPKEEP_BUNDLE
fi
cargo test --workspace --locked
if [ -n "$runtime_dir" ]; then
  # The differential suites again, against host-local of the CNI plugins the real nodes run
  # (1.10.0) rather than Debian's 1.1.1 (docs/cni-plugin.md).
  IPKEEP_REFERENCE_CNI_DIR=$runtime_dir/cni cargo test --locked -p ipkeep-tests --test differential --test differential_via_agent
fi
for v in $also; do
  echo "test.sh: the control-plane suite on Kubernetes $v" >&2
  IPKEEP_K8S_VERSION=$v cargo test --locked -p ipkeep-tests --test cluster
done
if [ -n "$runtime_dir" ]; then
  # Upgrades that leave nothing behind, under load: the adoption of 0.1.0's kubectl apply -k
  # install on v1.37.2 (policy mode; the hook that deletes its webhook configuration is also
  # tested on a real kube-apiserver by tests/tests/helm_release.rs) and from 0.2.0 (Helm) on
  # v1.35.4. Each old version's release build is kept in /var/cache/ipkeep-upgrade (the first
  # run compiles it: about 10 min on two shared cores; then about 3.5 min a run).
  for from in ${IPKEEP_UPGRADE_FROM-0.1.0 0.2.0}; do
    echo "test.sh: scripts/upgrade-test.sh --from $from" >&2
    scripts/upgrade-test.sh --from "$from" --replicas 2
  done
fi
