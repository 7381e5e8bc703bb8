#!/usr/bin/env bash
# A real Kubernetes cluster on this machine, with ipkeep installed with Helm (charts/ipkeep).
#
#   scripts/cluster.sh up [--nodes N] [--kwok-nodes N] [--state DIR] [--port-base P]
#                         [--k8s-version V] [--without-ipkeep] [--without-extender] [--release]
#                         [--upstream-node-timeouts] [--pin-cpus CPUS:CPUS]
#                         [--webhook-client-auth] [--node-runtime built|debian]
#                         [--cni-data-size SIZE]
#                         [--network bridge|flannel] [--node-layout kubeadm|k3s|kind]
#                         [--ip-family ipv4|dual] [--admission auto|policy|webhook]
#                         [--with-kruise ARCHIVE]
#   scripts/cluster.sh status [--state DIR]
#   scripts/cluster.sh node stop|start|kill NAME [--state DIR]
#   scripts/cluster.sh node exec NAME [--state DIR] -- CMD...
#   scripts/cluster.sh images [--state DIR]
#   scripts/cluster.sh down [--state DIR] [--keep-logs]
#
# up starts the control plane as local processes: etcd; kube-apiserver (TLS, Node and RBAC
# authorization, service-account token signing, default admission plugins);
# kube-controller-manager (each controller with its own service account, node pod CIDRs from
# 10.244.0.0/16, node-loss timeouts of seconds); kube-scheduler. kube-apiserver and
# kube-controller-manager run with the feature gate MaxUnavailableStatefulSet on (beta in 1.35
# and 1.36 but off by default there; on by default from 1.37).
#
# --k8s-version V picks the Kubernetes release (default $IPKEEP_K8S_VERSION, else v1.37.2;
# `scripts/k8s-build.sh --list` lists those with a wrapper module: v1.35.4, v1.36.3, v1.37.2). It
# is written to DIR/k8s-version, the directory of its binaries to DIR/bin.
#
# --nodes N (default 2; needs root) adds N real nodes node-0..node-N-1 (scripts/lib/nodes.sh):
# each its own network and mount namespaces and cgroup, with containerd and runc, kubelet and
# kube-proxy, zone labels zone-0, zone-1, ..., and routes between their pod CIDRs. The node
# runtime is built from its Go modules by scripts/runtime-build.sh (containerd 2.3, runc 1.5, the
# CNI plugins 1.10; CNI configurations at cniVersion 1.1.0); --node-runtime debian runs Debian's
# containerd 1.6, runc 1.1 and CNI plugins 1.1 instead (cniVersion 1.0.0; not run by CI).
# --ip-family dual (default ipv4) makes the cluster dual-stack, IPv4 first: Service and pod ranges
# of both families, IPv6 on the nodes' underlay and routes to their IPv6 pod CIDRs, and the CNI
# configuration with a second (IPv6) range set (scripts/lib/dualstack.sh says what exactly).
# ipkeep is then installed as a user installs it, from the release bundle
# (scripts/release-bundle.sh of the release build, into DIR/bundle; or the one
# $IPKEEP_BUNDLE names, checked against its SHA256SUMS): the bundle's image (and a busybox and a
# pause image from scripts/images.py) imported into every node (there is no registry),
# the bundle's namespace.yaml, `helm install` of the bundle's packaged chart (--dry-run=server
# first) with the values an operator of this cluster sets (DIR/ipkeep-values.yaml: the
# Service's cluster IP, the agent writing each node's CNI configuration, the layout's values),
# the webhook's certificates made by ipkeep-controller, kube-scheduler restarted with
# deploy/scheduler-ext/scheduler-config.yaml's extender (at the Service's cluster IP, the CA
# from the Secret), then `helm test`. A kube-proxy on the host gives kube-apiserver and
# kube-scheduler the Service IPs.
#
# --node-layout (real nodes; default $IPKEEP_NODE_LAYOUT, else kubeadm) lays the nodes out as a
# distribution does, and installs ipkeep with that distribution's values from
# docs/distributions.md (charts/ipkeep/ci/LAYOUT-values.yaml): kubeadm, the CNI configuration in
# /etc/cni/net.d and the plugins in /opt/cni/bin; k3s, containerd's CNI directories at k3s's
# paths (/var/lib/rancher/k3s/agent/etc/cni/net.d, /var/lib/rancher/k3s/data/cni), /etc/cni/net.d
# and /opt/cni/bin empty; kind, kubeadm's paths without the bridge plugin (which the chart's
# cni.installPlugins brings). Written to DIR/node-layout (the name and the two directories).
#
# --cni-data-size SIZE (default $IPKEEP_CNI_DATA_SIZE, else none) gives each real node's
# /var/lib/cni/ipkeep (ipkeep's stores) a file system of its own of SIZE (a tmpfs, e.g. 64m,
# mounted from the host: it survives node power-offs, and a test fills it from
# DIR/nodes/NODE/root/var/lib/cni/ipkeep to see what a full disk does to the node).
#
# --network flannel (real nodes) runs flannel instead of the bridge the agent configures:
# flanneld (kube subnet manager, vxlan) on every node and the CNI configuration
# deploy/cni/10-ipkeep-flannel.conflist, as docs/install.md tells users (scripts/lib/flannel.sh);
# flannel is built from its Go modules by scripts/flannel-build.sh. The default is bridge.
#
# --kwok-nodes N adds N fake nodes kwok-0..kwok-N-1 (kwok; labels kubernetes.io/hostname and
# topology.kubernetes.io/zone zone-0..zone-2; tainted NoSchedule when real nodes exist). With
# --nodes 0, ipkeep's controller (two replicas, leader election) and scheduler-ext run as local
# processes instead, each with a kubeconfig holding only its own ServiceAccount's token (so a
# permission missing from deploy/ fails), and the webhook is registered with a url on loopback.
#
# up returns when everything is ready; its last line is `export KUBECONFIG=...` (an admin
# kubeconfig). The Kubernetes binaries come from scripts/k8s-build.sh (built on first use).
#
# node stop NAME stops a real node's kubelet and containerd (its pods keep running); node start
# NAME starts them again (powering the node on first if it was killed) and returns once its Node
# has a pod CIDR, routed to it (a Node deleted meanwhile registers again, maybe with another); node kill NAME powers
# the node off (every process of the node, pods included, is killed; its disk directories stay,
# its /run is gone); node exec NAME -- CMD runs CMD on the node (its network and mount
# namespaces: `ipkeep list`, crictl-like ctr, curl of the agent's 127.0.0.1:9464). images lists
# the images every real node has.
#
# Ports: P (etcd client), P+1 (etcd peer), P+2 (kube-apiserver), P+3 (scheduler-ext webhook and
# extender, local processes), P+4 (scheduler-ext probes), P+5 and P+6 (the controllers'
# probes), P+7 (kube-scheduler's), P+8 (kube-controller-manager's), P+9 and P+10 (the host's
# kube-proxy), P+11 and P+12 (kruise-manager's webhooks and probes); P defaults to 16440. With
# real nodes kube-apiserver listens on 10.200.0.1 (the nodes' bridge), else on 127.0.0.1. The state (certificates, data, logs in DIR/logs, pids in
# DIR/pids, the nodes' disks in DIR/nodes) is in DIR, default $IPKEEP_CLUSTER_STATE or
# /tmp/ipkeep-cluster. --without-ipkeep leaves ipkeep out (real nodes then run Debian's bridge
# with host-local: the baseline); --without-extender leaves the extender out of kube-scheduler's
# configuration (the webhook or the admission policy alone; default: $IPKEEP_WITHOUT_EXTENDER=1
# does the same; written to DIR/extender, 1 or 0); --release runs ipkeep's optimised build as local processes
# (real nodes always run the release build, in the image). Node loss is detected in seconds by
# default (tests need it); --upstream-node-timeouts restores upstream's timeouts (node grace 50
# s, leases 40 s, eviction after 300 s), so that on a loaded machine a late heartbeat neither
# marks pods NotReady (kwok never marks them Ready again) nor evicts them: benchmarks.
# --admission picks how new StatefulSet pods get their pin (docs/scheduler-ext.md): policy, the
# MutatingAdmissionPolicy ipkeep-pin inside kube-apiserver (Kubernetes 1.36 and later); webhook,
# the mutating webhook; auto (the default), policy where kube-apiserver serves it, else webhook,
# as the chart's admission.mode=auto does. The choice is written to DIR/admission.
# --with-kruise ARCHIVE (default $IPKEEP_WITH_KRUISE, else none) also runs OpenKruise's
# kruise-manager, built from Kruise's source archive ARCHIVE by scripts/kruise-build.sh, as a
# local process with its CRDs, its Advanced StatefulSet controller and its webhooks (at a URL on
# loopback), feature gates PodWebhook=false and KruiseDaemon=false (scripts/lib/kruise.sh says
# what exactly).
# --webhook-client-auth (with --nodes 0) makes ipkeep-scheduler-ext require client
# certificates (--client-ca, the cluster's CA): kube-apiserver presents one to the webhooks
# through an AdmissionConfiguration (--admission-control-config-file: a WebhookAdmission
# kubeconfig whose user for the webhook's host has a client certificate), and kube-scheduler
# to the extender through its tlsConfig (certFile, keyFile), as docs/install.md describes.
# --pin-cpus A:B runs the control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kwok) on CPUs A and ipkeep's local processes on CPUs B (taskset lists, e.g.
# 0:1), as on a cluster whose control plane has machines of its own: benchmarks. up refuses
# a taken port or a state directory in use; on any failure it stops what it started. down stops
# every process up started (by pid, and every process of each real node by its cgroup), removes
# the nodes' namespaces, routes and kube-proxy rules, and removes DIR (with --keep-logs, all of
# it but DIR/logs).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
state=${IPKEEP_CLUSTER_STATE:-/tmp/ipkeep-cluster}
port_base=16440
kwok_nodes=0
nodes=2
k8s_version=${IPKEEP_K8S_VERSION:-v1.37.2}
# Beta but off by default in 1.35 and 1.36 (on from 1.37): StatefulSet
# rollingUpdate.maxUnavailable, which rebuilds several ordinals at once (docs/retention.md);
# kube-apiserver keeps the field, the StatefulSet controller honours it.
feature_gates=MaxUnavailableStatefulSet=true
ipkeep=1
extender=1
[ "${IPKEEP_WITHOUT_EXTENDER:-}" = 1 ] && extender=0
node_layout=${IPKEEP_NODE_LAYOUT:-kubeadm}
profile=debug
keep_logs=0
pin_cpus=
client_auth=0
node_runtime=built
cni_data_size=${IPKEEP_CNI_DATA_SIZE:-}
network=bridge
ip_family=ipv4
admission=auto
node_grace=8s lease_seconds=8 toleration_seconds=10
kruise_archive=
[ -n "${IPKEEP_WITH_KRUISE:-}" ] && kruise_archive=$(realpath -m "$IPKEEP_WITH_KRUISE")

say() { echo "cluster: $*" >&2; }
die() { say "error: $*"; exit 1; }

cmd=${1:-}
case $cmd in -h|--help|help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
[ $# -gt 0 ] && shift
node_cmd= node_name= node_argv=()
if [ "$cmd" = node ]; then
  node_cmd=${1:-} node_name=${2:-}
  [[ $node_cmd =~ ^(stop|start|kill|exec)$ ]] && [ -n "$node_name" ] || die "usage: $0 node stop|start|kill|exec NAME [--state DIR] [-- CMD...]"
  shift 2
fi
while [ $# -gt 0 ]; do
  case $1 in
    --) shift; node_argv=("$@"); break ;;
    --nodes) nodes=${2:?--nodes needs a number}; shift 2 ;;
    --state) state=${2:?--state needs a directory}; shift 2 ;;
    --port-base) port_base=${2:?--port-base needs a number}; shift 2 ;;
    --k8s-version) k8s_version=${2:?--k8s-version needs a release such as v1.37.2}; shift 2 ;;
    --kwok-nodes) kwok_nodes=${2:?--kwok-nodes needs a number}; shift 2 ;;
    --without-ipkeep) ipkeep=0; shift ;;
    --without-extender) extender=0; shift ;;
    --release) profile=release; shift ;;
    --keep-logs) keep_logs=1; shift ;;
    --pin-cpus) pin_cpus=${2:?--pin-cpus needs CONTROL-PLANE-CPUS:IPKEEP-CPUS}; shift 2 ;;
    --upstream-node-timeouts) node_grace=50s lease_seconds=40 toleration_seconds=300; shift ;;
    --webhook-client-auth) client_auth=1; shift ;;
    --node-runtime) node_runtime=${2:?--node-runtime needs built or debian}; shift 2 ;;
    --cni-data-size) cni_data_size=${2:?--cni-data-size needs a size such as 64m}; shift 2 ;;
    --network) network=${2:?--network needs bridge or flannel}; shift 2 ;;
    --ip-family) ip_family=${2:?--ip-family needs ipv4 or dual}; shift 2 ;;
    --admission) admission=${2:?--admission needs auto, policy or webhook}; shift 2 ;;
    --node-layout) node_layout=${2:?--node-layout needs kubeadm, k3s or kind}; shift 2 ;;
    --with-kruise) kruise_archive=$(realpath -m "${2:?--with-kruise needs the Kruise source archive}"); shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
[[ $port_base =~ ^[0-9]+$ ]] && (( port_base > 1023 && port_base < 65500 )) || die "--port-base must be a port number between 1024 and 65499"
[[ $kwok_nodes =~ ^[0-9]+$ ]] || die "--kwok-nodes must be a number"
[[ $admission =~ ^(auto|policy|webhook)$ ]] || die "--admission takes auto, policy or webhook, got '$admission'"
[[ $k8s_version =~ ^v1\.[0-9]+\.[0-9]+$ ]] || die "--k8s-version takes a release such as v1.37.2, got '$k8s_version'"
[[ $nodes =~ ^[0-9]+$ ]] && [ "$nodes" -le 20 ] || die "--nodes must be a number from 0 to 20"
[[ $node_runtime =~ ^(built|debian)$ ]] || die "--node-runtime takes built or debian"
[ -z "$cni_data_size" ] || [[ $cni_data_size =~ ^[0-9]+[kmg]$ ]] || die "--cni-data-size takes a size such as 64m, got '$cni_data_size'"
[[ $network =~ ^(bridge|flannel)$ ]] || die "--network takes bridge or flannel"
[[ $node_layout =~ ^(kubeadm|k3s|kind)$ ]] || die "--node-layout takes kubeadm, k3s or kind, got '$node_layout'"
if [ "$node_layout" != kubeadm ] && { [ "$nodes" -eq 0 ] || [ "$ipkeep" = 0 ] || [ "$network" = flannel ]; }; then
  die "--node-layout $node_layout needs real nodes, ipkeep and --network bridge"
fi
if [ "$network" = flannel ] && { [ "$nodes" -eq 0 ] || [ "$ipkeep" = 0 ]; }; then
  die "--network flannel needs real nodes (--nodes 1 or more) and ipkeep"
fi
# flanneld would need EnableIPv6 and an IPv6 network in its net-conf.json: not wired here yet.
[ "$network" = flannel ] && [ "${ip_family:-ipv4}" = dual ] && die "--network flannel runs IPv4 only here; --ip-family dual needs --network bridge"
if [ "$client_auth" = 1 ] && { [ "$nodes" -gt 0 ] || [ "$ipkeep" = 0 ]; }; then
  die "--webhook-client-auth needs --nodes 0 and ipkeep (the webhook runs as a local process)"
fi
if [ -n "$pin_cpus" ]; then
  [[ $pin_cpus =~ ^[0-9,-]+:[0-9,-]+$ ]] || die "--pin-cpus takes CONTROL-PLANE-CPUS:IPKEEP-CPUS, e.g. 0:1"
  command -v taskset >/dev/null || die "--pin-cpus needs taskset (apt-get install util-linux)"
fi
state=$(realpath -m "$state")

p_etcd=$port_base p_peer=$((port_base + 1)) p_api=$((port_base + 2)) p_ext=$((port_base + 3))
p_ext_probe=$((port_base + 4)) p_ctl0=$((port_base + 5)) p_ctl1=$((port_base + 6))
p_sched=$((port_base + 7)) p_kcm=$((port_base + 8))
p_proxy_health=$((port_base + 9)) p_proxy_metrics=$((port_base + 10))
api_host=127.0.0.1
[ "$nodes" -gt 0 ] && api_host=10.200.0.1
# The image tag of the images built for real nodes; the scheduler extension's fixed cluster IP.
image_tag=dev
ext_cluster_ip=10.96.0.50
up_done=
# Set by `up` (or read from DIR by the other commands).
bin='' kubectl=() bundle=

# --- certificates ----------------------------------------------------------------------------

# pki: the cluster's certificates (scripts/lib/controlplane.sh makes the CA, kube-apiserver's,
# the admin's and the service-account key) and the admin's kubeconfig.
pki() {
  controlplane_pki "IP:127.0.0.1,IP:10.200.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
  # kube-apiserver's client certificate for kubelets (logs, exec).
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  cert kcm "/CN=system:kube-controller-manager"
  cert scheduler "/CN=system:kube-scheduler"
  cert scheduler-ext "/CN=ipkeep-scheduler-ext" "IP:127.0.0.1,DNS:ipkeep-scheduler-ext.ipkeep-system.svc"
  # With --webhook-client-auth: what kube-apiserver and kube-scheduler present to it.
  cert apiserver-webhook-client "/CN=kube-apiserver-webhook-client"
  cert scheduler-extender-client "/CN=kube-scheduler-extender-client"
}

# --- up --------------------------------------------------------------------------------------

up() {
  [ ! -e "$state/pids" ] || die "$state is in use by another cluster (scripts/cluster.sh down --state $state)"
  local p
  for p in $p_etcd $p_peer $p_api $p_ext $p_ext_probe $p_ctl0 $p_ctl1 $p_sched $p_kcm $p_proxy_health $p_proxy_metrics \
    ${kruise_archive:+$p_kruise $p_kruise_probe}; do
    port_taken "$p" && die "port $p on 127.0.0.1 is taken (choose other ports with --port-base)"
  done
  command -v openssl >/dev/null || die "openssl is not installed (apt-get install openssl)"
  command -v curl >/dev/null || die "curl is not installed (apt-get install curl)"
  [ "$nodes" -gt 0 ] && nodes_preflight "$node_runtime"
  dual_preflight
  local t0; t0=$(date +%s)
  say "building or reusing the Kubernetes $k8s_version binaries (scripts/k8s-build.sh)"
  # Only what this cluster runs (a later cluster with more builds what is missing).
  local parts=etcd,kube-apiserver,kube-controller-manager,kube-scheduler,kubectl
  [ "$nodes" -gt 0 ] && parts=$parts,kubelet,kube-proxy
  [ "$kwok_nodes" -gt 0 ] && parts=$parts,kwok
  bin=$("$repo/scripts/k8s-build.sh" --k8s-version "$k8s_version" --only "$parts" --print-dir | tail -1)
  if [ "$nodes" -gt 0 ] && [ "$node_runtime" = built ]; then
    say "building or reusing the node runtime (scripts/runtime-build.sh)"
    runtime_use built "$("$repo/scripts/runtime-build.sh" --print-dir | tail -1)"
  else
    runtime_use debian
  fi
  [ "$network" = flannel ] && flannel_build
  [ -n "$kruise_archive" ] && kruise_build
  local ib=""
  local plugin=""
  if [ "$nodes" -gt 0 ]; then
    ib=$(ipkeep_build release ipkeep-agent ipkeep-controller ipkeep-scheduler-ext)
    plugin=$(ipkeep_plugin)
    [ "$ipkeep" = 1 ] && bundle=$(ipkeep_bundle "$ib" "$plugin")
  elif [ "$ipkeep" = 1 ]; then
    ib=$(ipkeep_build "$profile" ipkeep-controller ipkeep-scheduler-ext)
  fi
  rm -rf "$state/etcd" "$state/logs"
  mkdir -p "$state"/{logs,pids,etcd}
  # Whatever ends `up` before it is done (an error, die, a signal) stops what it started.
  # (IPKEEP_CLUSTER_KEEP_FAILED=1 keeps it running, to look at; then `down` it.)
  trap 'if [ -z "$up_done" ] && [ -n "${IPKEEP_CLUSTER_KEEP_FAILED:-}" ]; then say "failed; kept running (IPKEEP_CLUSTER_KEEP_FAILED)"; elif [ -z "$up_done" ]; then say "failed; stopping what was started (logs kept in $state/logs)"; teardown; fi' EXIT
  trap 'exit 130' INT TERM
  echo "$bin" >"$state/bin"
  runtime_save
  echo "$k8s_version" >"$state/k8s-version"
  echo "$ip_family" >"$state/ip-family"
  echo "$extender" >"$state/extender"
  if [ "$nodes" -gt 0 ]; then
    node_layout_save
    say "building the images for the nodes (scripts/images.py: busybox and pause; ipkeep's is the bundle's)"
    python3 "$repo/scripts/images.py" --only busybox,pause --out "$state/images" --tag "$image_tag" >"$state/images.txt" ||
      die "building the images failed"
    if [ -n "$bundle" ]; then
      cp "$bundle/ipkeep-image.tar" "$state/images/ipkeep.tar"
      echo "$state/images/ipkeep.tar $(sed -n 's/^image: \(\S*\) (\(\S*\),.*/\1 \2/p' "$bundle/RELEASE")" >>"$state/images.txt"
    fi
    underlay_up
    dual_underlay_up
  fi
  pki
  kubeconfig "$state/kcm.kubeconfig" cert kcm
  kubeconfig "$state/scheduler.kubeconfig" cert scheduler

  etcd_start --auto-compaction-retention=1 --quota-backend-bytes=$((4 << 30))

  # With real nodes, pods reach kube-apiserver through the `kubernetes` Service, whose endpoint
  # is the advertised address; without, nothing outside this machine's loopback needs it.
  local endpoints=(--endpoint-reconciler-type=none)
  [ "$nodes" -gt 0 ] && endpoints=(--advertise-address="$api_host")
  local admission_config=()
  if [ "$client_auth" = 1 ]; then
    webhook_client_auth_config
    admission_config=(--admission-control-config-file="$state/admission.yaml")
  fi
  apiserver_start "${endpoints[@]}" \
    --kubelet-client-certificate="$state/pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$state/pki/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP,Hostname \
    --service-cluster-ip-range="$service_cidrs" --authorization-mode=Node,RBAC --allow-privileged=true \
    --default-not-ready-toleration-seconds="$toleration_seconds" \
    --default-unreachable-toleration-seconds="$toleration_seconds" \
    "${admission_config[@]}" --feature-gates="$feature_gates"
  [ "$nodes" -gt 0 ] && host_proxy_start

  say "starting kube-controller-manager"
  start kube-controller-manager "$bin/kube-controller-manager" --kubeconfig="$state/kcm.kubeconfig" \
    --authentication-kubeconfig="$state/kcm.kubeconfig" --authorization-kubeconfig="$state/kcm.kubeconfig" \
    --service-account-private-key-file="$state/pki/sa.key" --root-ca-file="$state/pki/ca.crt" \
    --use-service-account-credentials=true --leader-elect=false \
    --bind-address=127.0.0.1 --secure-port="$p_kcm" \
    --allocate-node-cidrs=true --cluster-cidr="$pod_cidrs" "${kcm_cidr_args[@]}" \
    --node-monitor-period=1s --node-monitor-grace-period="$node_grace" \
    --concurrent-statefulset-syncs=10 --concurrent-gc-syncs=10 --kube-api-qps=500 --kube-api-burst=1000 \
    --feature-gates="$feature_gates"
  wait_for kube-controller-manager 60 kube-controller-manager curl -kfsS "https://127.0.0.1:$p_kcm/healthz"
  # In-cluster ipkeep: kube-scheduler starts without the extender, and restarts with it once
  # ipkeep's controller has made the webhook's CA (ipkeep_install), as an operator adds it.
  local url=""
  [ "$nodes" -eq 0 ] && [ "$ipkeep" = 1 ] && [ "$extender" = 1 ] && url=https://127.0.0.1:$p_ext
  scheduler_start "$url" "$(base64 -w0 <"$state/pki/ca.crt")"
  wait_for "the default ServiceAccount" 60 kube-controller-manager "${kubectl[@]}" get serviceaccount default
  [ -n "$kruise_archive" ] && kruise_up

  [ "$network" = flannel ] && flannel_setup
  [ "$nodes" -gt 0 ] && nodes_up "$nodes"
  [ "$kwok_nodes" -gt 0 ] && kwok_up
  if [ "$nodes" -gt 0 ]; then
    wait_for "kube-proxy on the host (its first sync of the Services)" 60 kube-proxy-host host_proxy_synced
    if [ "$ipkeep" = 1 ]; then
      ipkeep_install
    else
      nodes_host_local_conf
    fi
    wait_for "$nodes real nodes Ready" 180 "" real_nodes_ready "$nodes"
    [ "$ipkeep" = 1 ] && ipkeep_wait && ipkeep_helm_test
  elif [ "$ipkeep" = 1 ]; then
    ipkeep_up "$ib"
  fi
  up_done=1
  say "up in $(( $(date +%s) - t0 )) s; logs in $state/logs; stop with: $0 down --state $state"
  echo "export KUBECONFIG=$state/admin.kubeconfig"
}

# webhook_client_auth_config: kube-apiserver's AdmissionConfiguration, whose WebhookAdmission
# kubeconfig gives the webhooks' host (127.0.0.1:P+3, where scheduler-ext listens) a client
# certificate: what docs/install.md ("Client certificates") has an admin write.
webhook_client_auth_config() {
  local plugin
  {
    printf 'apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n'
    for plugin in MutatingAdmissionWebhook ValidatingAdmissionWebhook; do
      printf -- '- name: %s\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: WebhookAdmissionConfiguration\n    kubeConfigFile: %s\n' \
        "$plugin" "$state/webhook-client.kubeconfig"
    done
  } >"$state/admission.yaml"
  {
    printf 'apiVersion: v1\nkind: Config\nusers:\n'
    printf -- '- name: "127.0.0.1:%s"\n  user:\n' "$p_ext"
    printf '    client-certificate: %s\n    client-key: %s\n' \
      "$state/pki/apiserver-webhook-client.crt" "$state/pki/apiserver-webhook-client.key"
  } >"$state/webhook-client.kubeconfig"
}

# scheduler_start EXTENDER-URL CA-BASE64: kube-scheduler with the extender at the URL (none if
# empty).
scheduler_start() {
  scheduler_config "$1" "$2" >"$state/scheduler-config.yaml"
  say "starting kube-scheduler${1:+ (extender $1)}"
  start kube-scheduler "$bin/kube-scheduler" --config="$state/scheduler-config.yaml" \
    --authentication-kubeconfig="$state/scheduler.kubeconfig" --authorization-kubeconfig="$state/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$p_sched"
  wait_for kube-scheduler 60 kube-scheduler curl -kfsS "https://127.0.0.1:$p_sched/readyz"
}

# The scheduler's configuration: deploy/scheduler-ext/scheduler-config.yaml with this cluster's
# kubeconfig, the extender at $1 (none if empty) and its CA ($2, base64) inline.
scheduler_config() {
  local file=$repo/deploy/scheduler-ext/scheduler-config.yaml url=$1 ca=$2
  grep -q 'urlPrefix: https://ipkeep-scheduler-ext.ipkeep-system.svc:443' "$file" &&
    grep -q 'caFile: ' "$file" && grep -q 'kubeconfig: ' "$file" ||
    die "$file no longer has the urlPrefix, caFile and kubeconfig lines this script rewrites"
  # The client rate limits are raised (as for kube-scheduler's own density tests) so that
  # what a benchmark measures is scheduling, not client-side throttling.
  local client=""
  [ "$client_auth" = 1 ] &&
    client="\n      certFile: $state/pki/scheduler-extender-client.crt\n      keyFile: $state/pki/scheduler-extender-client.key"
  if [ -n "$url" ]; then
    sed -e "s#kubeconfig: .*#kubeconfig: $state/scheduler.kubeconfig\n  qps: 500\n  burst: 1000#" \
        -e "s#urlPrefix: .*#urlPrefix: $url#" \
        -e "s#^\( *\)caFile: .*#\1caData: $ca$client#" "$file"
  else
    printf 'apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\n'
    printf 'clientConnection:\n  kubeconfig: %s\n  qps: 500\n  burst: 1000\n' "$state/scheduler.kubeconfig"
  fi
  printf 'leaderElection:\n  leaderElect: false\n'
}

kwok_up() {
  local stages=$bin/kwok-stages cfg=$state/kwok.yaml i
  say "starting kwok with $kwok_nodes nodes"
  {
    # With a config file kwok applies no defaults to what it leaves out: every parallelism is set.
    printf 'apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions:\n'
    printf '  enableCNI: false\n  nodeLeaseParallelism: 4\n  podPlayStageParallelism: 4\n'
    printf '  nodePlayStageParallelism: 4\n  podsOnNodeSyncParallelism: 1\n'
    for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
             pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
      [ -f "$stages/$f" ] || die "kwok stage $f is missing from $stages"
      printf -- '---\n'
      cat "$stages/$f"
    done
  } >"$cfg"
  start kwok "$bin/kwok" --kubeconfig="$state/admin.kubeconfig" --config="$cfg" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-lease-duration-seconds="$lease_seconds" --cidr=10.0.0.0/16 --node-ip=10.255.0.1
  for ((i = 0; i < kwok_nodes; i++)); do
    cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: kwok-$i
  annotations: {kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0"}
  labels:
    kubernetes.io/hostname: kwok-$i
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    topology.kubernetes.io/zone: zone-$((i % 3))
    type: kwok
$( [ "$nodes" -gt 0 ] && printf 'spec:\n  taints: [{key: kwok.x-k8s.io/node, value: fake, effect: NoSchedule}]' )
status:
  allocatable: {cpu: "32", memory: 256Gi, pods: "110"}
  capacity: {cpu: "32", memory: 256Gi, pods: "110"}
EOF
  done >"$state/nodes.yaml"
  "${kubectl[@]}" apply -f "$state/nodes.yaml" >/dev/null
  wait_for "$kwok_nodes kwok nodes" 120 kwok nodes_ready "$kwok_nodes"
}

nodes_ready() {
  local n
  n=$("${kubectl[@]}" get nodes -l type=kwok -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' | grep -c True || true)
  [ "$n" -ge "$1" ]
}

# --- status / down ---------------------------------------------------------------------------

status() {
  [ -d "$state/pids" ] || { say "no cluster in $state"; exit 1; }
  local f ok=0
  for f in "$state"/pids/*; do
    [ -f "$f" ] || continue
    if kill -0 "$(cat "$f")" 2>/dev/null; then
      printf '%-24s running (pid %s)\n' "$(basename "$f")" "$(cat "$f")"
    else
      printf '%-24s NOT RUNNING (log: %s)\n' "$(basename "$f")" "$state/logs/$(basename "$f").log"
      ok=1
    fi
  done
  bin=$(cat "$state/bin")
  KUBECONFIG="$state/admin.kubeconfig" "$bin/kubectl" get nodes 2>&1 | head -5 || ok=1
  echo "export KUBECONFIG=$state/admin.kubeconfig"
  return $ok
}

# teardown: stops everything up started (nodes first: their pods, daemons and namespaces).
teardown() {
  [ -f "$state/bin" ] && bin=$(cat "$state/bin")
  ip_family_load
  node_layout_load
  nodes_down
  stop_all
  stop_strays
  rm -rf "$state/pids"
}

# stop_strays: kills what still runs with this cluster's certificates on its command line once
# every process its pid files name has stopped (one started again by someone else who lost its
# pid: a soak's overlapping kube-apiserver restarts once left one serving the cluster's port).
stop_strays() {
  local f pid
  for f in /proc/[0-9]*/cmdline; do
    tr '\0' '\n' <"$f" 2>/dev/null | grep -qF -- "=$state/pki/" || continue
    pid=${f#/proc/}; pid=${pid%/cmdline}
    say "process $pid still runs with this cluster's certificates though no pid file names it: $(tr '\0' ' ' <"$f" 2>/dev/null | cut -c1-100); killing it"
    kill -KILL "$pid" 2>/dev/null || true
    gone "$pid" || say "process $pid still runs 10 s after SIGKILL"
  done
}

down() {
  if [ ! -d "$state/pids" ]; then
    say "no cluster in $state"
    return 0
  fi
  if [ "$keep_logs" = 1 ]; then
    # The pods' own logs are on the nodes' disks: keep them with the rest.
    local node
    for node in $(node_names); do
      [ -d "$(node_dir "$node")/root/var/log/pods" ] &&
        cp -r "$(node_dir "$node")/root/var/log/pods" "$state/logs/$node-pods" 2>/dev/null
    done
  fi
  teardown
  if [ "$keep_logs" = 1 ]; then
    find "$state" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf --one-file-system {} +
    say "stopped; removed $state but its logs"
  else
    rm -rf --one-file-system "$state"
    say "stopped and removed $state"
  fi
}

node() {
  [ -d "$state/pids" ] || die "no cluster in $state"
  bin=$(cat "$state/bin")
  runtime_load
  node_layout_load
  ip_family_load
  kubectl=(env KUBECONFIG="$state/admin.kubeconfig" "$bin/kubectl")
  [ -d "$(node_dir "$node_name")" ] || die "no real node $node_name in $state (nodes: $(node_names | tr '\n' ' '))"
  case $node_cmd in
    stop) node_stop "$node_name" ;;
    start) node_start "$node_name" ;;
    kill) node_kill "$node_name"; say "$node_name powered off (start it again: $0 node start $node_name)" ;;
    exec)
      [ ${#node_argv[@]} -gt 0 ] || die "usage: $0 node exec NAME [--state DIR] -- CMD..."
      alive "$node_name-holder" || die "$node_name is powered off"
      # The runtime's ctr and runc first, as on a node that ships them, and the node's CNI
      # plugins (`ipkeep list`).
      node_exec "$node_name" env PATH="$rt_path$cni_bin_dir:$PATH" "${node_argv[@]}" ;;
  esac
}

images() {
  [ -d "$state/pids" ] || die "no cluster in $state"
  runtime_load
  local node
  for node in $(node_names); do
    echo "$node:"
    if alive "$node-containerd"; then
      node_exec "$node" "$rt_ctr" -a /run/containerd/containerd.sock -n k8s.io images ls -q | grep -v '^sha256:' | sed 's/^/  /'
    else
      echo "  (containerd not running)"
    fi
  done
}

# The libraries last: each checks, as it is sourced, that what it uses from this script is defined.
# shellcheck source=scripts/lib/controlplane.sh
. "$repo/scripts/lib/controlplane.sh"
# shellcheck source=scripts/lib/nodes.sh
. "$repo/scripts/lib/nodes.sh"
# shellcheck source=scripts/lib/install.sh
. "$repo/scripts/lib/install.sh"
# shellcheck source=scripts/lib/flannel.sh
. "$repo/scripts/lib/flannel.sh"
# shellcheck source=scripts/lib/dualstack.sh
. "$repo/scripts/lib/dualstack.sh"
# shellcheck source=scripts/lib/kruise.sh
. "$repo/scripts/lib/kruise.sh"
ip_family_use "$ip_family"
node_layout_use "$node_layout"

case $cmd in
  up) up ;;
  status) status ;;
  node) node ;;
  images) images ;;
  down) down ;;
  *) die "usage: $0 up|status|node|images|down [options] (see --help)" ;;
esac
