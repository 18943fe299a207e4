#!/usr/bin/env bash
# A throwaway etcd for tests and benches: Debian's etcd-server on 127.0.0.1 only, every port chosen
# by the OS, one member or several (a real quorum), no systemd.
#
#   scripts/etcd.sh install              apt-get etcd-server etcd-client (root)
#   scripts/etcd.sh start DIR [MEMBERS]  prints "READY https://127.0.0.1:P1,https://127.0.0.1:P2,..."
#                                        once every member answers, then "TLS /abs/DIR/tls"; data
#                                        and logs under DIR
#   scripts/etcd.sh stop DIR [MEMBER]    stops every member (or member MEMBER, 0-based: a member down)
# TLS with client-certificate authentication, for clients and peers alike: a throwaway CA (30 days)
# and certificates made with openssl under DIR/tls (0700; keys 0600), kept for a restart on the
# same DIR: ca.pem, ca-key.pem; server.pem, server-key.pem (SAN: ETCD_HOST, 127.0.0.1, localhost;
# serverAuth and clientAuth, as peers use it both ways); client.pem, client-key.pem (CN
# granary-master, clientAuth). A client without client.pem is refused.
#   etcdctl --endpoints URL --cacert DIR/tls/ca.pem --cert DIR/tls/client.pem --key DIR/tls/client-key.pem
# ETCD_HOST (default 127.0.0.1): the address to serve on (a network namespace's, for the benches).
# ETCD_PLAIN=1: plain HTTP instead, no certificates and no TLS line (only for whoever asks for it).
set -euo pipefail
cmd=${1:?usage: etcd.sh install|start DIR [MEMBERS]|stop DIR [MEMBER]}
if [ "$cmd" = install ]; then
  exec bash "$(dirname "$0")/apt-ensure.sh" etcd-server etcd-client
fi
D=${2:?usage: etcd.sh $cmd DIR}
stop_one() {  # PIDFILE
  [ -s "$1" ] || return 0
  local p; p=$(cat "$1"); kill "$p" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$p" 2>/dev/null || true
  rm -f "$1"
}
if [ "$cmd" = stop ]; then
  if [ -n "${3:-}" ]; then stop_one "$D/m$3/pid"; exit 0; fi
  for f in "$D"/m*/pid; do [ -e "$f" ] && stop_one "$f"; done
  exit 0
fi
[ "$cmd" = start ] || { echo "usage: etcd.sh install|start DIR [MEMBERS]|stop DIR [MEMBER]" >&2; exit 2; }
N=${3:-1}
H=${ETCD_HOST:-127.0.0.1}
command -v etcd >/dev/null || { echo "error: etcd not installed (scripts/etcd.sh install)" >&2; exit 1; }
# Two ports per member (clients, peers), held by the OS until etcd binds them.
read -r -a PORTS < <(python3 -c '
import socket, sys
ss = [socket.socket() for _ in range(2 * int(sys.argv[1]))]
for s in ss: s.bind((sys.argv[2], 0))
print(*[s.getsockname()[1] for s in ss])
for s in ss: s.close()' "$N" "$H")
mkdir -p "$D"
if [ "${ETCD_PLAIN:-0}" = 1 ]; then
  S=http; TLS_FLAGS=(); CURL_TLS=()
else
  command -v openssl >/dev/null || { echo "error: openssl not installed" >&2; exit 1; }
  T="$(cd "$D" && pwd)/tls"
  mkdir -p "$T"; chmod 0700 "$T"
  have=1
  for f in ca ca-key server server-key client client-key; do [ -s "$T/$f.pem" ] || have=0; done
  if [ "$have" = 0 ]; then
    sign() {  # NAME CN EXTENSIONS: NAME-key.pem and NAME.pem, signed by the CA
      openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$T/$1-key.pem" 2>/dev/null
      openssl req -new -key "$T/$1-key.pem" -subj "/CN=$2" -out "$T/$1.csr"
      openssl x509 -req -in "$T/$1.csr" -CA "$T/ca.pem" -CAkey "$T/ca-key.pem" -days 30 \
        -set_serial "0x$(openssl rand -hex 16)" -out "$T/$1.pem" -extfile <(printf '%s\n' \
          "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
          "subjectKeyIdentifier=hash" "authorityKeyIdentifier=keyid" "$3") 2>/dev/null
      rm -f "$T/$1.csr"
    }
    (
      umask 077
      openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$T/ca-key.pem" 2>/dev/null
      openssl req -x509 -new -key "$T/ca-key.pem" -subj "/CN=granary throwaway etcd CA" -days 30 \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$T/ca.pem"
      san="IP:127.0.0.1,DNS:localhost"; [ "$H" = 127.0.0.1 ] || san="IP:$H,$san"
      sign server granary-etcd "extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$san"
      sign client granary-master "extendedKeyUsage=clientAuth"
    ) || { echo "error: openssl could not make the certificates under $T" >&2; exit 1; }
    chmod 0600 "$T"/*-key.pem; chmod 0644 "$T/ca.pem" "$T/server.pem" "$T/client.pem"
  fi
  S=https
  TLS_FLAGS=(--cert-file "$T/server.pem" --key-file "$T/server-key.pem" --client-cert-auth
    --trusted-ca-file "$T/ca.pem" --peer-cert-file "$T/server.pem" --peer-key-file "$T/server-key.pem"
    --peer-client-cert-auth --peer-trusted-ca-file "$T/ca.pem")
  CURL_TLS=(--cacert "$T/ca.pem" --cert "$T/client.pem" --key "$T/client-key.pem")
fi
cluster=""; clients=""
for i in $(seq 0 $((N - 1))); do
  cluster+="${cluster:+,}m$i=$S://$H:${PORTS[$((2 * i + 1))]}"
  clients+="${clients:+,}$S://$H:${PORTS[$((2 * i))]}"
done
for i in $(seq 0 $((N - 1))); do
  m="$D/m$i"; mkdir -p "$m"
  setsid etcd --name "m$i" --data-dir "$m/data" \
    --listen-client-urls "$S://$H:${PORTS[$((2 * i))]}" --advertise-client-urls "$S://$H:${PORTS[$((2 * i))]}" \
    --listen-peer-urls "$S://$H:${PORTS[$((2 * i + 1))]}" --initial-advertise-peer-urls "$S://$H:${PORTS[$((2 * i + 1))]}" \
    --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "granary-$$" \
    ${TLS_FLAGS[@]+"${TLS_FLAGS[@]}"} --listen-metrics-urls "" > "$m/log" 2>&1 < /dev/null &
  echo $! > "$m/pid"
done
# Ready once every member reports itself healthy (a quorum has formed).
for _ in $(seq 300); do
  ok=0
  for i in $(seq 0 $((N - 1))); do
    curl -sf -m 2 ${CURL_TLS[@]+"${CURL_TLS[@]}"} "$S://$H:${PORTS[$((2 * i))]}/health" 2>/dev/null |
      grep -q '"health":"true"' && ok=$((ok + 1))
  done
  if [ "$ok" = "$N" ]; then
    echo "READY $clients"
    [ "$S" = http ] || echo "TLS $T"
    exit 0
  fi
  for i in $(seq 0 $((N - 1))); do
    kill -0 "$(cat "$D/m$i/pid")" 2>/dev/null || { echo "error: etcd member $i exited:" >&2; tail -20 "$D/m$i/log" >&2; exit 1; }
  done
  sleep 0.1
done
echo "error: etcd did not become healthy within 30 s; logs under $D" >&2
exit 1
