#!/usr/bin/env bash
# Fails when a worker process started from this build is still running
# a few seconds after the tests that started it have finished.
build_dir=$1
pattern="^${build_dir}/[b]in/[a-z_]+ worker "
for _ in $(seq 1 50); do
  pids=$(pgrep -f "$pattern" || true)
  [[ -z $pids ]] && { echo "no orphan worker processes"; exit 0; }
  sleep 0.1
done
echo "orphan worker processes left behind:"
ps -o pid,ppid,etime,args -p $(echo $pids | tr ' ' ',')
exit 1
