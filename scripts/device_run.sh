#!/usr/bin/env bash
# Long runs on the lent GPU machine, whose calls last at most 10 minutes and which goes back
# after 30 s idle: start a run detached from the call (it outlives the call while the machine
# is held), watch it from the calls that follow (back to back), pack its results into $OUT.
#
#   bash scripts/device_run.sh start NAME CMD...   # setsid; output in /tmp/device_runs/NAME.log
#   bash scripts/device_run.sh watch SECONDS       # waits up to SECONDS (less once every run has
#                                                  # ended), then each run's state and log tail
#   bash scripts/device_run.sh pack PATH...        # PATHs as one tar.gz in $OUT, parts of 15 MiB
#
# (A device call sends back at most 8 files of 16 MiB; what a command leaves running is
# killed when it returns unless it started a new session, as `start` does.)
set -euo pipefail
runs=/tmp/device_runs
mkdir -p "$runs"
state() {  # NAME: running, or "exit N"
  local name=$1
  if [ -f "$runs/$name.rc" ]; then echo "exit $(cat "$runs/$name.rc")"; else echo running; fi
}
case "${1:-}" in
  start)
    [ $# -ge 3 ] || { echo "usage: device_run.sh start NAME CMD..." >&2; exit 2; }
    name=$2; shift 2
    [ -e "$runs/$name.log" ] && { echo "a run named $name exists ($runs/$name.log)" >&2; exit 2; }
    printf '%q ' "$@" > "$runs/$name.cmd"
    setsid nohup bash -c '"$@"; echo $? > "'"$runs/$name.rc"'"' _ "$@" \
      > "$runs/$name.log" 2>&1 < /dev/null &
    echo "started $name: $(cat "$runs/$name.cmd")"
    ;;
  watch)
    [ $# -eq 2 ] || { echo "usage: device_run.sh watch SECONDS" >&2; exit 2; }
    end=$(( $(date +%s) + $2 ))
    while [ "$(date +%s)" -lt "$end" ]; do
      ls "$runs"/*.cmd >/dev/null 2>&1 || break
      running=0
      for c in "$runs"/*.cmd; do [ -f "${c%.cmd}.rc" ] || running=1; done
      [ $running -eq 1 ] || break
      sleep 5
    done
    date -u
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv,noheader
    for c in "$runs"/*.cmd; do
      [ -f "$c" ] || continue
      name=$(basename "${c%.cmd}")
      echo "=== $name: $(state "$name")"
      tr '\r' '\n' < "$runs/$name.log" | grep -v '^\s*$' | tail -n 15
    done
    ;;
  pack)
    [ $# -ge 2 ] || { echo "usage: device_run.sh pack PATH..." >&2; exit 2; }
    [ -n "${OUT:-}" ] || { echo "OUT is not set (the device call's result folder)" >&2; exit 2; }
    shift
    tar -czf /tmp/device_pack.tgz "$@" "$runs"
    split -b 15m /tmp/device_pack.tgz "$OUT/pack.tgz.part-"
    ls -l "$OUT"
    ;;
  *)
    echo "usage: device_run.sh start NAME CMD... | watch SECONDS | pack PATH..." >&2; exit 2
    ;;
esac
