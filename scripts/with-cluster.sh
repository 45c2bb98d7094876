#!/usr/bin/env bash
# Runs one vgpuctl command against a fresh local system: a vgpu-node with two
# sim devices and a vgpu-mediator, both on loopback in a temporary directory.
# Both are stopped cleanly afterwards; the exit status is vgpuctl's, or
# non-zero if a daemon failed to start or to stop.
# usage: scripts/with-cluster.sh vgpuctl-args...
#        scripts/with-cluster.sh -- command args...   (run with VGPU_SOCKET set, and
#            VGPU_MEDIATOR_PID and VGPU_NODE_PID for tools that watch the daemons)
set -euo pipefail
bin=${BIN:-$(cd "$(dirname "$0")/.." && pwd)/bin}
dir=$(mktemp -d -t vgpu-XXXXXX)
port=${VGPU_NODE_PORT:-$((20000 + RANDOM % 20000))}
sock=$dir/mediator.sock
node_pid= med_pid=

stop() {
  local rc=0
  for pid in $med_pid $node_pid; do
    kill -TERM "$pid" 2>/dev/null || continue
    wait "$pid" || rc=$?
  done
  return $rc
}
cleanup() { stop || true; rm -rf "$dir"; }
trap cleanup EXIT

# VGPU_NODE_FLAGS replaces the node's device flags (scripts/gpu-check: --backend cuda ...).
# shellcheck disable=SC2086
"$bin/vgpu-node" --listen "127.0.0.1:$port" ${VGPU_NODE_FLAGS:---devices 2 --memory ${VGPU_NODE_MEMORY:-4GiB}} \
  --log-level "${VGPU_LOG_LEVEL:-warn}" 2>"$dir/node.log" &
node_pid=$!
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
  kill -0 $node_pid 2>/dev/null || { cat "$dir/node.log" >&2; echo "vgpu-node failed to start" >&2; exit 1; }
  sleep 0.05
done
"$bin/vgpu-mediator" --socket "$sock" --node "127.0.0.1:$port" --state-dir "$dir" --quota "" --containerd "" \
  --log-level "${VGPU_LOG_LEVEL:-warn}" 2>"$dir/mediator.log" &
med_pid=$!
# Serving once a connection is taken: the socket's file exists from bind(2),
# before listen(2), and a dial in between is refused (daemon.Serving).
for _ in $(seq 100); do
  /usr/bin/python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).connect(sys.argv[1])' "$sock" 2>/dev/null && break
  kill -0 $med_pid 2>/dev/null || { cat "$dir/mediator.log" >&2; echo "vgpu-mediator failed to start" >&2; exit 1; }
  sleep 0.05
done

rc=0
if [ "${1:-}" = "--" ]; then
  shift
  VGPU_SOCKET=$sock VGPU_MEDIATOR_PID=$med_pid VGPU_NODE_PID=$node_pid "$@" || rc=$?
else
  "$bin/vgpuctl" --socket "$sock" "$@" || rc=$?
fi
if ! stop; then
  echo "a daemon did not stop cleanly; logs:" >&2
  cat "$dir/node.log" "$dir/mediator.log" >&2
  rc=1
fi
node_pid= med_pid=
exit $rc
