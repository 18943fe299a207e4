#!/usr/bin/env bash
# A throwaway NFSv4 server for tests: nfs-ganesha (VFS backend) exporting DIR/export on
# 127.0.0.1 only, on a free port. No rpcbind (it would bind the wildcard address), no systemd.
#
#   scripts/nfs-server.sh install        apt-get nfs-ganesha (root)
#   scripts/nfs-server.sh start DIR      prints "READY nfs://127.0.0.1/export?version=4&nfsport=PORT"
#   scripts/nfs-server.sh stop DIR
set -euo pipefail
cmd=${1:?usage: nfs-server.sh install|start DIR|stop DIR}
if [ "$cmd" = install ]; then
  exec bash "$(dirname "$0")/apt-ensure.sh" nfs-ganesha nfs-ganesha-vfs
fi
G=${2:?usage: nfs-server.sh $cmd DIR}
if [ "$cmd" = stop ]; then
  [ -s "$G/pid" ] || exit 0
  p=$(cat "$G/pid"); kill "$p" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$p" 2>/dev/null || true
  rm -f "$G/pid"
  exit 0
fi
[ "$cmd" = start ] || { echo "usage: nfs-server.sh install|start DIR|stop DIR" >&2; exit 2; }
read -r NFSPORT MNTPORT < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])
for s in ss: s.close()')
mkdir -p "$G"/{export,recov,log}
cat > "$G/ganesha.conf" <<CONF
NFS_CORE_PARAM {
  Bind_addr = 127.0.0.1;
  NFS_Port = $NFSPORT; MNT_Port = $MNTPORT;
  NLM_Port = 0; Rquota_Port = 0;
  Enable_NLM = false; Enable_RQUOTA = false; Enable_UDP = false;
  NFS_Protocols = 4;
}
NFS_KRB5 { Active_krb5 = false; }
NFSv4 { Graceless = true; RecoveryBackend = fs; RecoveryRoot = "$G/recov"; Only_Numeric_Owners = true; }
EXPORT {
  Export_Id = 1; Path = "$G/export"; Pseudo = /export;
  Access_Type = RW; Squash = No_Root_Squash; SecType = sys;
  Protocols = 4; Transports = TCP;
  Attr_Expiration_Time = 0;  # files change behind ganesha in tests: never serve cached attributes
  FSAL { Name = VFS; }
}
LOG { Default_Log_Level = EVENT; }
CONF
ganesha.nfsd -F -f "$G/ganesha.conf" -L "$G/log/ganesha.log" -p "$G/ganesha.pid" -N NIV_EVENT &
echo $! > "$G/pid"
for _ in $(seq 300); do
  kill -0 "$(cat "$G/pid")" 2>/dev/null || { echo "nfs-server: ganesha died" >&2; tail -5 "$G/log/ganesha.log" >&2; exit 1; }
  (exec 3<>"/dev/tcp/127.0.0.1/$NFSPORT") 2>/dev/null && break
  sleep 0.1
done
echo "READY nfs://127.0.0.1/export?version=4&nfsport=$NFSPORT"
