#!/usr/bin/env bash
# Multi-node test: two network namespaces joined by a veth pair, each a node
# with its own address. Node 0 runs the controller (`roll run`), node 1 a
# `roll agent`. The job places actor_train rank 1 and actor_infer on node 1,
# so the data-parallel all-reduce and the weight sync cross the namespaces.
# Then a second job loses its controller (SIGKILL) mid-run, and the agent
# and every worker it started must exit.
#
# usage: multinode_test.sh ROLL_BINARY WORK_DIR
# Needs root (ip netns). Exits 77 (skipped) without it. Removes its
# namespaces whatever happens.
set -uo pipefail
roll=$(readlink -f "$1")
work=$2
config=$(dirname "$(readlink -f "$0")")/../../configs/rlvr_base.yaml

if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null; then
  echo "SKIP: needs root and iproute2 for network namespaces"
  exit 77
fi

tag=rmn$$
ns0=${tag}n0
ns1=${tag}n1
subnet=$(( $$ % 200 + 20 ))
ip0=10.213.$subnet.1
ip1=10.213.$subnet.2
port=29411

cleanup() {
  for ns in "$ns0" "$ns1"; do
    # shellcheck disable=SC2046
    kill -9 $(ip netns pids "$ns" 2>/dev/null) 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() {
  echo "FAIL: $*"
  for f in "$work"/*.log "$work"/agent_logs*/*.log; do
    [[ -f $f ]] && { echo "---- $f"; tail -n 30 "$f"; }
  done
  exit 1
}

rm -rf "$work"
mkdir -p "$work"
ip netns add "$ns0" && ip netns add "$ns1" || fail "cannot create network namespaces"
ip link add "${tag}a" type veth peer name "${tag}b" || fail "cannot create a veth pair"
ip link set "${tag}a" netns "$ns0"
ip link set "${tag}b" netns "$ns1"
ip -n "$ns0" addr add "$ip0/24" dev "${tag}a"
ip -n "$ns1" addr add "$ip1/24" dev "${tag}b"
for ns in "$ns0" "$ns1"; do
  ip -n "$ns" link set lo up
done
ip -n "$ns0" link set "${tag}a" up
ip -n "$ns1" link set "${tag}b" up

# A small base model (no network needed).
"$roll" sft "$config" output_dir="$work/sft" sft.output_dir="$work/base" sft.max_steps=30 runtime.threads_per_worker=1 \
  >"$work/sft.log" 2>&1 || fail "roll sft"

job=(
  "$config" output_dir="$work/out" "actor_train.model_args.model_name_or_path=$work/base"
  "actor_infer.model_args.model_name_or_path=$work/base"
  num_nodes=2 num_gpus_per_node=1 cpu_threads_per_slot=1
  "actor_train.device_mapping=[0,1]" actor_train.num_gpus_per_worker=1
  "actor_infer.device_mapping=[1]" actor_infer.num_gpus_per_worker=1
  rollout_batch_size=8 actor_train.training_args.per_device_train_batch_size=16
  eval_steps=0 save_steps=0 data.num_val=16 track_with=stdout
  runtime.bind_address=$ip0 runtime.controller_port=$port "runtime.token_file=$work/token"
  runtime.node_timeout_s=60
)

# The agent may start before the controller: it retries until it registers.
start_agent() {  # log dir
  ip netns exec "$ns1" "$roll" agent --controller "$ip0:$port" --token-file "$work/token" --bind "$ip1" \
    --log-dir "$1" --connect-timeout-s 60 --controller-grace-s 3 >"$1.log" 2>&1 &
  agent_pid=$!
}

# ---- 1: a job across both nodes completes.
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/token"
start_agent "$work/agent_logs1"
ip netns exec "$ns0" "$roll" run "${job[@]}" max_steps=3 --quiet >"$work/run1.log" 2>&1 ||
  fail "the two-node job failed"
wait "$agent_pid" || fail "the agent did not exit cleanly after the job (code $?)"
grep -q "node 1: .*($ip1)" "$work/run1.log" || fail "the controller did not log node 1 at $ip1"
for w in actor_train_1 actor_infer_0; do
  [[ -s $work/agent_logs1/$w.log ]] || fail "no log of $w on node 1"
done
[[ ! -e $work/out/logs/actor_train_1.log ]] || fail "actor_train rank 1 ran on node 0"
# Both trainer ranks stepped together (all-reduce across the namespaces) and
# the generator on node 1 generated with every new version (weight sync).
for s in 1 2 3; do
  line=$(grep "\"step\":$s[,}]" "$work/out/metrics.jsonl") || fail "no metrics for step $s"
  echo "$line" | grep -q "\"rollout/weight_version_max\":$((s - 1))[,.}]" ||
    fail "step $s did not generate with weight version $((s - 1)): $line"
done
grep -q "cluster 'actor_train' up: 2" "$work/run1.log" || fail "actor_train did not start 2 ranks"
echo "ok: a 2-node job ran 3 steps; actor_train rank 1 and actor_infer ran in the other namespace"

# ---- 2: the controller dies mid-run; the agent and its workers exit.
start_agent "$work/agent_logs2"
ip netns exec "$ns0" "$roll" run "${job[@]}" output_dir="$work/out2" max_steps=500 --quiet \
  >"$work/run2.log" 2>&1 &
run_pid=$!
for _ in $(seq 600); do
  grep -q '"step":1[,}]' "$work/out2/metrics.jsonl" 2>/dev/null && break
  kill -0 "$run_pid" 2>/dev/null || fail "the second job ended early"
  sleep 0.2
done
grep -q '"step":1[,}]' "$work/out2/metrics.jsonl" || fail "the second job made no step"
kill -9 "$run_pid"
wait "$run_pid" 2>/dev/null
for _ in $(seq 100); do
  [[ -z $(ip netns pids "$ns1") ]] && break
  sleep 0.2
done
left=$(ip netns pids "$ns1")
[[ -z $left ]] || fail "processes on node 1 outlived the controller by 20 s: $(ps -o pid,args -p "${left//$'\n'/,}")"
wait "$agent_pid"
code=$?
[[ $code -eq 2 ]] || fail "the agent exited with $code, not 2 (controller lost)"
grep -q "unreachable" "$work/agent_logs2.log" || fail "the agent did not say why it exited"
echo "ok: after the controller died, the agent and its workers exited"
echo "PASS"
