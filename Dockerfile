# syntax=docker/dockerfile:1
#
# One image with every ipkeep binary in /usr/local/bin: ipkeep (the CNI plugin, copied onto
# each node by the agent DaemonSet's init container), ipkeep-agent, ipkeep-controller and
# ipkeep-scheduler-ext. Every manifest in deploy/ uses it as ghcr.io/ipkeep/ipkeep:<version>
# and picks the binary with `command`.
#
#   docker build -t ghcr.io/ipkeep/ipkeep:0.3.0 .
#
# The runtime stage is Debian slim, not distroless, on purpose: the agent's init container
# (deploy/agent/daemonset.yaml) runs /bin/sh, cp, chmod and mv, and the scheduler extension's
# preStop hook runs sleep. The image runs as the unprivileged user 65532 by default; the agent's
# DaemonSet runs it as root (the node's IPAM store belongs to root).
#
# The ipkeep plugin binary runs on the host, not in this image (the agent's init container
# copies it to the node's CNI plugin directory), so it is linked statically
# (scripts/build-plugin.sh): it runs on any Linux host, whatever its C library. So do the
# reference plugins in /opt/cni/bin (Go, static). The other binaries run in this image, with its
# glibc. scripts/images.py builds the same image without Docker (scripts/release-bundle.sh).

ARG RUST_IMAGE=rust:1-bookworm
ARG GO_IMAGE=golang:1.26-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
# The cache mounts keep the registry and the target directory between builds; the binaries are
# copied out of the cached target directory in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --locked --release \
      -p ipkeep-agent -p ipkeep-controller -p ipkeep-scheduler-ext \
      --bin ipkeep-agent --bin ipkeep-controller --bin ipkeep-scheduler-ext \
 && mkdir -p /out \
 && install -m 0755 "$(scripts/build-plugin.sh)" /out/ipkeep \
 && for bin in ipkeep-agent ipkeep-controller ipkeep-scheduler-ext; do \
      install -m 0755 "target/release/$bin" "/out/$bin"; \
    done

# The reference CNI plugins the chart's cni.installPlugins copies onto the nodes (the conflist
# the agent writes names bridge and portmap; every runtime runs loopback), as upstream releases
# them: static, the version stamped in. The version is the one the real-node tests run
# (tests/k8s/tools/cni-plugins/go.mod; scripts/images.py checks that the two agree).
FROM ${GO_IMAGE} AS cni-plugins
ARG CNI_PLUGINS_VERSION=v1.10.0
RUN CGO_ENABLED=0 GOBIN=/out go install -trimpath \
      -ldflags "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=${CNI_PLUGINS_VERSION}" \
      github.com/containernetworking/plugins/plugins/main/bridge@${CNI_PLUGINS_VERSION} \
      github.com/containernetworking/plugins/plugins/meta/portmap@${CNI_PLUGINS_VERSION} \
      github.com/containernetworking/plugins/plugins/main/loopback@${CNI_PLUGINS_VERSION}

FROM ${RUNTIME_IMAGE}
# ca-certificates: for a kubeconfig that points at an API server with a public certificate
# (in a cluster, the service account's CA is used).
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 65532 nonroot \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin nonroot
COPY --from=build /out/ /usr/local/bin/
COPY --from=cni-plugins /out/ /opt/cni/bin/
USER 65532:65532
# No ENTRYPOINT: each workload names its binary (command: ["ipkeep-controller"], ...).
CMD ["ipkeep-controller", "--help"]
