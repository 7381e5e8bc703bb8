#!/usr/bin/env bash
# Every check CI runs: the deploy/ manifests (offline, scripts/validate-deploy.sh), formatting,
# clippy with warnings as errors, and all tests, including the network-namespace tests (which
# need root; without root they skip loudly, and under CI they fail instead of skipping).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
scripts/validate-deploy.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo build --workspace --locked --bins
cargo test --workspace --locked
