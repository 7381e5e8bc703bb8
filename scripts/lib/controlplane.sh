# Starting a control plane, shared by scripts/cluster.sh and the tests' API server
# (tests/src/apiserver.sh, which tests/src/apiserver.rs runs once per test binary): local
# processes by pid file, the certificates, etcd and kube-apiserver, and the waits for what they
# serve (sourced).
#
# Everything is in $state: pids/NAME and logs/NAME.log of each process started, pki/ (the CA, the
# certificates it signed, the service-account key pair), etcd/ (etcd's data) and
# admin.kubeconfig. etcd listens on 127.0.0.1 ($p_etcd for clients, $p_peer for its peer),
# kube-apiserver on $api_host:$p_api. With pin_cpus (CONTROL-PLANE-CPUS:IPKEEP-CPUS, taskset
# lists) the control plane and ipkeep's local processes run on CPUs of their own.
# shellcheck source=scripts/lib/require.sh
. "${BASH_SOURCE[0]%/*}/require.sh"
require_vars state bin say die api_host p_etcd p_peer p_api pin_cpus

# wait_for's pause between two tries (seconds); the keys' algorithm (newkey). A caller may set
# either before it sources this file.
: "${wait_poll:=0.5}" "${pki_key:=rsa}"

# --- processes -------------------------------------------------------------------------------

# start NAME CMD...: runs CMD in the background, logging to logs/NAME.log, pid in pids/NAME.
start() {
  local name=$1 pin=(); shift
  if [ -n "$pin_cpus" ]; then
    case $name in
      etcd|kube-apiserver|kube-controller-manager|kube-scheduler|kwok) pin=(taskset -c "${pin_cpus%%:*}") ;;
      controller-*|scheduler-ext) pin=(taskset -c "${pin_cpus##*:}") ;;
    esac
  fi
  "${pin[@]}" "$@" >>"$state/logs/$name.log" 2>&1 &
  echo $! >"$state/pids/$name"
}

alive() { [ -f "$state/pids/$1" ] && kill -0 "$(cat "$state/pids/$1")" 2>/dev/null; }

# gone PID: waits up to 10 s for PID to exit; fails if it still runs. A process killed with
# SIGKILL holds its ports until it is gone, and the next `up` on the same ports checks them first.
# A zombie (exited, its parent has not waited for it yet: a soak's restarted process) is gone.
gone() {
  local waited=0
  while kill -0 "$1" 2>/dev/null && ! zombie "$1"; do
    [ $waited -lt 100 ] || return 1
    sleep 0.1; waited=$((waited + 1))
  done
}

# zombie PID: PID has exited and holds nothing but its entry in /proc (state Z after its name).
zombie() { [[ $(cat "/proc/$1/stat" 2>/dev/null) =~ \)\ Z\  ]]; }

stop_all() {
  local f pid
  for f in "$state"/pids/*; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    kill -TERM "$pid" 2>/dev/null || true
  done
  for f in "$state"/pids/*; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    gone "$pid" || { kill -KILL "$pid" 2>/dev/null || true; gone "$pid" || say "process $pid still runs 10 s after SIGKILL"; }
    rm -f "$f"
  done
}

# stop_one NAME: stops one process `start` started (TERM, then KILL after 10 s) and waits until
# it is gone.
stop_one() {
  local f=$state/pids/$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  kill -TERM "$pid" 2>/dev/null || true
  gone "$pid" || { kill -KILL "$pid" 2>/dev/null || true; gone "$pid" || say "process $pid still runs 10 s after SIGKILL"; }
  rm -f "$f"
}

# wait_for WHAT SECONDS PROCESS CMD...: retries CMD until it succeeds; fails (with the process's
# last log lines) if PROCESS dies or time runs out.
wait_for() {
  local what=$1 secs=$2 proc=$3; shift 3
  local t0; t0=$(date +%s)
  until "$@" >/dev/null 2>&1; do
    if [ -n "$proc" ] && ! alive "$proc"; then
      tail -20 "$state/logs/$proc.log" >&2 || true
      die "$proc exited while waiting for $what (log: $state/logs/$proc.log)"
    fi
    if (( $(date +%s) - t0 >= secs )); then
      [ -n "$proc" ] && { tail -20 "$state/logs/$proc.log" >&2 || true; }
      die "$what not ready after ${secs}s${proc:+ (log: $state/logs/$proc.log)}"
    fi
    sleep "$wait_poll"
  done
  say "  $what ready ($(( $(date +%s) - t0 )) s)"
}

port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# --- certificates ----------------------------------------------------------------------------

# ssl ARGS...: openssl, quiet unless it fails.
ssl() {
  local out
  out=$(openssl "$@" 2>&1) || die "openssl $1 failed: $out"
}

# newkey FILE: a private key, RSA 2048 (pki_key=rsa) or P-256 (pki_key=ec: the tests' servers,
# started once per test binary, would spend a second and a half on four RSA keys).
newkey() {
  case $pki_key in
    rsa) ssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$1" ;;
    ec) ssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" ;;
    *) die "pki_key is rsa or ec, not '$pki_key'" ;;
  esac
}

# cert NAME SUBJECT [SAN]: a key and an X.509 v3 certificate signed by the cluster's CA, in
# DIR/pki (v3 for every one: rustls, which ipkeep's clients use, refuses v1 certificates).
cert() {
  local d=$state/pki
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    [ -n "${3:-}" ] && echo "subjectAltName=$3"
  } >"$d/$1.ext"
  newkey "$d/$1.key"
  ssl req -new -key "$d/$1.key" -subj "$2" -out "$d/$1.csr"
  ssl x509 -req -in "$d/$1.csr" -CA "$d/ca.crt" -CAkey "$d/ca.key" -CAcreateserial \
    -days 30 -out "$d/$1.crt" -extfile "$d/$1.ext"
}

# controlplane_pki SANS: the CA, kube-apiserver's serving certificate for SANS (openssl's
# subjectAltName syntax), the admin's client certificate (system:masters), the service-account
# key pair and the admin's kubeconfig; sets kubectl (kubectl as the admin).
controlplane_pki() {
  local d=$state/pki
  command -v openssl >/dev/null || die "openssl is not installed (apt-get install openssl)"
  mkdir -p "$d"
  newkey "$d/ca.key"
  ssl req -x509 -new -key "$d/ca.key" -days 30 -subj "/CN=ipkeep-test-ca" -out "$d/ca.crt"
  cert apiserver "/CN=kube-apiserver" "$1"
  cert admin "/O=system:masters/CN=ipkeep-test-admin"
  newkey "$d/sa.key"
  ssl pkey -in "$d/sa.key" -pubout -out "$d/sa.pub"
  kubeconfig "$state/admin.kubeconfig" cert admin
  kubectl=(env KUBECONFIG="$state/admin.kubeconfig" "$bin/kubectl")
}

# kubeconfig FILE (cert NAME | token TOKEN) [NAMESPACE]
kubeconfig() {
  local file=$1 kind=$2 cred=$3 ns=${4:-default}
  local k=(env KUBECONFIG="$file" "$bin/kubectl")
  "${k[@]}" config set-cluster local --server="https://$api_host:$p_api" \
    --certificate-authority="$state/pki/ca.crt" --embed-certs=true >/dev/null
  if [ "$kind" = cert ]; then
    "${k[@]}" config set-credentials user --client-certificate="$state/pki/$cred.crt" \
      --client-key="$state/pki/$cred.key" --embed-certs=true >/dev/null
  else
    "${k[@]}" config set-credentials user --token="$cred" >/dev/null
  fi
  "${k[@]}" config set-context local --cluster=local --user=user --namespace="$ns" >/dev/null
  "${k[@]}" config use-context local >/dev/null
  chmod 600 "$file"
}

# --- etcd and kube-apiserver -----------------------------------------------------------------

# etcd_start ARG...: etcd, one member, its data in DIR/etcd (no fsync: a throwaway cluster),
# with the ARGs; returns once it is ready.
etcd_start() {
  command -v curl >/dev/null || die "curl is not installed (apt-get install curl)"
  say "starting etcd on 127.0.0.1:$p_etcd"
  mkdir -p "$state/etcd"
  start etcd "$bin/etcd" --name=node0 --data-dir="$state/etcd" \
    --listen-client-urls="http://127.0.0.1:$p_etcd" --advertise-client-urls="http://127.0.0.1:$p_etcd" \
    --listen-peer-urls="http://127.0.0.1:$p_peer" --initial-advertise-peer-urls="http://127.0.0.1:$p_peer" \
    --initial-cluster="node0=http://127.0.0.1:$p_peer" --unsafe-no-fsync=true "$@"
  wait_for etcd 60 etcd curl -fsS "http://127.0.0.1:$p_etcd/readyz"
}

# apiserver_start ARG...: kube-apiserver on that etcd, serving with controlplane_pki's
# certificate, clients authenticated by the CA's certificates, service-account tokens signed
# with its key, and the ARGs (authorization, Service range, ...); returns once it is ready.
apiserver_start() {
  say "starting kube-apiserver on https://$api_host:$p_api"
  start kube-apiserver "$bin/kube-apiserver" --etcd-servers="http://127.0.0.1:$p_etcd" \
    --bind-address="$api_host" --secure-port="$p_api" \
    --tls-cert-file="$state/pki/apiserver.crt" --tls-private-key-file="$state/pki/apiserver.key" \
    --client-ca-file="$state/pki/ca.crt" \
    --service-account-issuer=https://kubernetes.default.svc \
    --service-account-key-file="$state/pki/sa.pub" --service-account-signing-key-file="$state/pki/sa.key" \
    "$@"
  wait_for kube-apiserver 120 kube-apiserver "${kubectl[@]}" get --raw /readyz
}

# crd_established: waits until kube-apiserver serves the PersistentPodState CRD (once applied).
crd_established() {
  wait_for "the PersistentPodState CRD" 60 "" "${kubectl[@]}" wait --for=condition=Established --timeout=1s crd/persistentpodstates.ipkeep.dev
}
