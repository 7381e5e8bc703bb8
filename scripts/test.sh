#!/usr/bin/env bash
# Every check CI runs: the deploy/ manifests (offline, scripts/validate-deploy.sh), formatting,
# clippy with warnings as errors, and all tests, including the network-namespace tests (which
# need root; without root they skip loudly, and under CI they fail instead of skipping) and the
# tests on a real control plane (tests/tests/cluster.rs; the Kubernetes components are built
# from their Go modules first, or reused from the cache: docs/cluster.md).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
scripts/validate-deploy.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo build --workspace --locked --bins
if command -v go >/dev/null; then
  scripts/k8s-build.sh --without-kubelet
else
  echo "test.sh: Go is not installed: the tests on a real control plane will skip (under CI: fail)" >&2
fi
cargo test --workspace --locked
