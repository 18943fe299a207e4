#!/usr/bin/env bash
# A throwaway S3 server for tests and benchmarks: single-node Ceph (mon + memstore OSD) with the
# RADOS Gateway, bound to 127.0.0.1 only, on free ports. Real S3: it verifies SigV4.
#
#   scripts/s3-server.sh install           apt-get the Ceph packages (root)
#   scripts/s3-server.sh start DIR         prints "READY <endpoint> <access key> <secret key>"
#   scripts/s3-server.sh stop DIR          stops what start DIR started (by PID)
#
# Keys come from $S3_ACCESS_KEY / $S3_SECRET_KEY or fixed test values. Data lives in RAM. The
# gateway listens on $S3_BIND (default 127.0.0.1; the benchmark rig runs it inside a network
# namespace on that namespace's address). Ceph's own daemons always stay on loopback.
set -euo pipefail
cmd=${1:?usage: s3-server.sh install|start DIR|stop DIR}

if [ "$cmd" = install ]; then
  exec bash "$(dirname "$0")/apt-ensure.sh" ceph-mon ceph-osd radosgw uuid-runtime python3-boto3
fi

D=${2:?usage: s3-server.sh $cmd DIR}
if [ "$cmd" = stop ]; then
  [ -f "$D/pids" ] || exit 0
  tac "$D/pids" | while read -r name pid; do
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  rm -f "$D/pids"
  exit 0
fi
[ "$cmd" = start ] || { echo "usage: s3-server.sh install|start DIR|stop DIR" >&2; exit 2; }

BIND=${S3_BIND:-127.0.0.1}
AK=${S3_ACCESS_KEY:-GRANARYTESTKEY000000}
SK=${S3_SECRET_KEY:-granary/test+secret0000000000000000000000}
# Free ports: the mon, the gateway, and a block of 50 for the daemons' messengers.
read -r MONPORT RGWPORT BASE < <(python3 - <<'PY'
import random, socket
def free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); return True
    except OSError:
        return False
    finally:
        s.close()
def any_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
while True:
    base = random.randrange(42000, 60000, 50)
    if all(free(p) for p in range(base, base + 50)):
        break
ports = set(range(base, base + 50))
a = any_port()
while a in ports: a = any_port()
b = any_port()
while b in ports or b == a: b = any_port()
print(a, b, base)
PY
)
rm -rf "$D"; mkdir -p "$D"/{run,log,mon,osd/ceph-0,rgw}
C="$D/ceph.conf"; FSID=$(uuidgen)
cat > "$C" <<CONF
[global]
fsid = $FSID
mon_host = v2:127.0.0.1:$MONPORT
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
ms_bind_msgr1 = false
ms_bind_port_min = $BASE
ms_bind_port_max = $((BASE + 49))
auth_cluster_required = cephx
auth_service_required = cephx
auth_client_required = cephx
run_dir = $D/run
admin_socket = $D/run/\$name.asok
log_file = $D/log/\$name.log
keyring = $D/admin.keyring
osd_pool_default_size = 1
osd_pool_default_min_size = 1
mon_allow_pool_size_one = true
mon_warn_on_pool_no_redundancy = false
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
mon_max_pg_per_osd = 1000
mon_data_avail_warn = 1
auth_allow_insecure_global_id_reclaim = false
osd_crush_chooseleaf_type = 0
[mon]
mon_data = $D/mon/\$cluster-\$id
[osd]
osd_data = $D/osd/\$cluster-\$id
keyring = $D/osd/\$cluster-\$id/keyring
osd_objectstore = memstore
memstore_device_bytes = ${S3_MEMSTORE_BYTES:-2147483648}
[client.rgw.gw]
keyring = $D/rgw/keyring
rgw_frontends = beast endpoint=$BIND:$RGWPORT
rgw_data = $D/rgw
CONF
CEPH="ceph -c $C --connect-timeout 30"
: > "$D/pids"
fail() { echo "s3-server: $*" >&2; tail -5 "$D"/log/*.out >&2 2>/dev/null || true; bash "$0" stop "$D"; exit 1; }
wait_for() { local what=$1; shift; for _ in $(seq 600); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done; fail "timed out waiting for $what"; }

ceph-authtool --create-keyring "$D/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
ceph-authtool --create-keyring "$D/admin.keyring" --gen-key -n client.admin \
  --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *' >/dev/null
ceph-authtool "$D/mon.keyring" --import-keyring "$D/admin.keyring" >/dev/null
monmaptool --create --addv a "[v2:127.0.0.1:$MONPORT]" --fsid "$FSID" "$D/monmap" >/dev/null
ceph-mon -c "$C" --mkfs -i a --monmap "$D/monmap" --keyring "$D/mon.keyring" >>"$D/log/mon.out" 2>&1
ceph-mon -c "$C" -i a -f >>"$D/log/mon.out" 2>&1 & echo "mon $!" >> "$D/pids"

OSD_UUID=$(uuidgen); OSD_KEY=$(ceph-authtool --gen-print-key)
echo "{\"cephx_secret\": \"$OSD_KEY\"}" > "$D/osd/new.json"
$CEPH osd new "$OSD_UUID" -i "$D/osd/new.json" >/dev/null || fail "ceph osd new failed"
ceph-osd -c "$C" -i 0 --mkfs --key "$OSD_KEY" --osd-uuid "$OSD_UUID" >>"$D/log/osd.out" 2>&1
ceph-authtool --create-keyring "$D/osd/ceph-0/keyring" -n osd.0 --add-key "$OSD_KEY" >/dev/null
ceph-osd -c "$C" -i 0 -f >>"$D/log/osd.out" 2>&1 & echo "osd $!" >> "$D/pids"

$CEPH auth get-or-create client.rgw.gw mon 'allow rw' osd 'allow rwx' mgr 'allow rw' -o "$D/rgw/keyring" >/dev/null
wait_for "the OSD" sh -c "$CEPH osd stat 2>/dev/null | grep -q '1 up'"
radosgw -c "$C" -n client.rgw.gw -f >>"$D/log/rgw.out" 2>&1 & echo "rgw $!" >> "$D/pids"
wait_for "the gateway" curl -s -o /dev/null "http://$BIND:$RGWPORT/"
radosgw-admin -c "$C" user create --uid=test --display-name=test --access-key="$AK" --secret="$SK" >/dev/null \
  || fail "radosgw-admin user create failed"
echo "READY http://$BIND:$RGWPORT $AK $SK"
