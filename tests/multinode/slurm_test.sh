#!/usr/bin/env bash
# Slurm test: a real Slurm cluster from Debian's packages on this machine.
# munged (a fresh key), slurmctld and two slurmd nodes, each node in its own
# network namespace with its own address (node0 10.215.x.1 also holds the
# controller daemon, node1 10.215.x.2), slurm.conf in a temporary directory.
# Then, through examples/slurm/rlvr_2node.sbatch:
#   1. a 5-step job completes: metrics.jsonl has every step, the controller
#      found node 1 at its address, trainer rank 1 and the generator ran in
#      node 1's namespace (all-reduce and weight sync across namespaces);
#   1b. an agent that cannot bind (its interface is missing on node 1)
#      fails the job at once, with the agent's reason in the job's output;
#   2. USR1 (what the script gets ahead of its time limit) requeues the job,
#      and the requeued run resumes from the newest checkpoint and completes;
#   3. scancel mid-run leaves no process of the job on either node, and the
#      last checkpoint stays loadable.
# It prints the time from sbatch to step 1 and the mean step time.
#
# usage: slurm_test.sh ROLL_BINARY WORK_DIR
# Needs root, iproute2, nsenter/unshare and slurmctld, slurmd, munged
# (scripts/setup installs them). Exits 77 (skipped) without them. Stops
# and removes everything it started whatever happens.
set -uo pipefail
roll=$(readlink -f "$1")
work=$2
repo=$(readlink -f "$(dirname "$(readlink -f "$0")")/../..")
script=$repo/examples/slurm/rlvr_2node.sbatch
config=$repo/examples/slurm/rlvr_2node.yaml

for tool in ip nsenter unshare munged slurmctld slurmd sbatch scontrol scancel srun; do
  if ! command -v "$tool" >/dev/null; then
    echo "SKIP: needs $tool (scripts/setup installs Slurm and munge)"
    exit 77
  fi
done
if [[ $(id -u) -ne 0 ]]; then
  echo "SKIP: needs root for network namespaces and the Slurm daemons"
  exit 77
fi

tag=rsl$$
ns=("${tag}n0" "${tag}n1")
subnet=$(($$ % 200 + 20))
addr=("10.215.$subnet.1" "10.215.$subnet.2")
ctl_port=$((17000 + $$ % 1000 * 2))
slurmd_port=$((ctl_port + 1))
conf=$work/slurm/slurm.conf
export SLURM_CONF=$conf

daemon_pids() {
  cat "$work"/slurm/run/*.pid 2>/dev/null
}
cleanup() {
  # Jobs first (their processes live in the namespaces), then the daemons.
  for n in "${ns[@]}"; do
    # shellcheck disable=SC2046
    kill -9 $(ip netns pids "$n" 2>/dev/null) 2>/dev/null
  done
  # shellcheck disable=SC2046
  kill -9 $(daemon_pids) 2>/dev/null
  for n in "${ns[@]}"; do ip netns del "$n" 2>/dev/null; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() {
  echo "FAIL: $*"
  for f in "$work"/*.log "$work"/*.out "$work"/out*/logs/agents.log "$work"/slurm/log/*.log; do
    [[ -f $f ]] && { echo "---- $f"; tail -n 25 "$f"; }
  done
  exit 1
}

in_ns() {  # namespace-index command...: the command in that node's network namespace
  local i=$1
  shift
  nsenter --net="/var/run/netns/${ns[$i]}" "$@"
}

# ---- the cluster
rm -rf "$work"
mkdir -p "$work"/slurm/{state,spool,log,run}
chmod 700 "$work/slurm"
head -c 1024 /dev/urandom >"$work/slurm/munge.key"
chmod 600 "$work/slurm/munge.key"
munged --force --key-file="$work/slurm/munge.key" --socket="$work/slurm/munge.sock" \
  --pid-file="$work/slurm/run/munged.pid" --log-file="$work/slurm/log/munged.log" \
  --seed-file="$work/slurm/munge.seed" || fail "munged did not start"

for i in 0 1; do ip netns add "${ns[$i]}" || fail "cannot create network namespaces"; done
ip link add "${tag}a" type veth peer name "${tag}b" || fail "cannot create a veth pair"
ip link set "${tag}a" netns "${ns[0]}"
ip link set "${tag}b" netns "${ns[1]}"
ip -n "${ns[0]}" addr add "${addr[0]}/24" dev "${tag}a"
ip -n "${ns[1]}" addr add "${addr[1]}/24" dev "${tag}b"
for i in 0 1; do ip -n "${ns[$i]}" link set lo up; done
ip -n "${ns[0]}" link set "${tag}a" up
ip -n "${ns[1]}" link set "${tag}b" up

cores=$(nproc)
cat >"$conf" <<EOF
ClusterName=roll$subnet
SlurmctldHost=${tag}ctl(${addr[0]})
SlurmctldPort=$ctl_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
# cred_expire: a requeued job waits this long before it starts again (default 120 s).
AuthInfo=socket=$work/slurm/munge.sock,cred_expire=10
CredType=cred/munge
StateSaveLocation=$work/slurm/state
SlurmdSpoolDir=$work/slurm/spool/%n
SlurmctldPidFile=$work/slurm/run/slurmctld.pid
SlurmdPidFile=$work/slurm/run/slurmd-%n.pid
SlurmctldLogFile=$work/slurm/log/slurmctld.log
SlurmdLogFile=$work/slurm/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
KillWait=5
MpiDefault=none
InactiveLimit=0
MinJobAge=600
NodeName=node0 NodeAddr=${addr[0]} CPUs=$cores State=UNKNOWN
NodeName=node1 NodeAddr=${addr[1]} CPUs=$cores State=UNKNOWN
PartitionName=roll Nodes=node0,node1 Default=YES MaxTime=INFINITE State=UP
EOF
# slurmctld checks that its host name is SlurmctldHost: its own UTS namespace.
in_ns 0 unshare --uts sh -c "hostname ${tag}ctl && exec slurmctld -f '$conf'" ||
  fail "slurmctld did not start"
for i in 0 1; do
  # nsenter (not `ip netns exec`, which remounts /sys): slurmd needs the host's cgroup mounts.
  in_ns "$i" slurmd -f "$conf" -N "node$i" || fail "slurmd node$i did not start"
done
for _ in $(seq 100); do
  [[ $(in_ns 0 sinfo -h -o %t -p roll 2>/dev/null | sort -u) == idle ]] && break
  sleep 0.2
done
[[ $(in_ns 0 sinfo -h -o %t -p roll | sort -u) == idle ]] || fail "the nodes did not come up: $(in_ns 0 sinfo)"
echo "ok: slurmctld and slurmd node0 (${addr[0]}), node1 (${addr[1]}) up"

# A small base model (no network needed), made before submitting as the example says.
"$roll" sft "$config" output_dir="$work/sft" sft.output_dir="$work/base" sft.max_steps=30 runtime.threads_per_worker=1 \
  >"$work/sft.log" 2>&1 || fail "roll sft"

job_args=(
  "actor_train.model_args.model_name_or_path=$work/base" "actor_infer.model_args.model_name_or_path=$work/base"
  rollout_batch_size=8 actor_train.training_args.per_device_train_batch_size=8
  eval_steps=0 data.num_val=16 runtime.node_timeout_s=60
)
submit() {  # output-dir extra-sbatch-flags... -- overrides...
  local out=$1
  shift
  local flags=()
  while [[ $1 != -- ]]; do flags+=("$1"); shift; done
  shift
  in_ns 0 env ROLL="$roll" ROLL_CONFIG="$config" sbatch --parsable --chdir="$work" \
    --output="$work/$(basename "$out").out" "${flags[@]}" "$script" "${job_args[@]}" output_dir="$out" "$@"
}
job_state() {
  in_ns 0 scontrol show job -o "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2
}
wait_state() {  # job seconds states...: waits until the job is in one of the states
  local job=$1 secs=$2 state
  shift 2
  for _ in $(seq $((secs * 5))); do
    state=$(job_state "$job")
    for s in "$@"; do [[ $state == "$s" ]] && return 0; done
    sleep 0.2
  done
  return 1
}
wait_step() {  # metrics-file step seconds
  for _ in $(seq $(($3 * 5))); do
    grep -q "\"step\":$2[,}]" "$1" 2>/dev/null && return 0
    sleep 0.2
  done
  return 1
}
# Processes of the job: those of the roll binary, in either namespace.
job_processes() {
  local p
  for n in "${ns[@]}"; do
    for p in $(ip netns pids "$n" 2>/dev/null); do
      [[ $(readlink "/proc/$p/exe" 2>/dev/null) == "$roll" ]] && echo "$p"
    done
  done
}

# ---- 1: a 5-step job across both nodes completes.
t0=$(date +%s.%N)
job=$(submit "$work/out1" -- max_steps=5 save_steps=0) || fail "sbatch refused the job"
wait_step "$work/out1/metrics.jsonl" 1 180 || fail "job $job made no step within 180 s (state $(job_state "$job"))"
t1=$(date +%s.%N)
wait_state "$job" 180 COMPLETED FAILED CANCELLED TIMEOUT NODE_FAIL || fail "job $job did not end"
[[ $(job_state "$job") == COMPLETED ]] || fail "job $job ended $(job_state "$job")"
log=$work/out1.out
grep -q "node 1: .*(${addr[1]})" "$log" || fail "the controller did not log node 1 at ${addr[1]}"
grep -q "cluster 'actor_train' up: 2" "$log" || fail "actor_train did not start 2 ranks"
for w in actor_train_1 actor_infer_0; do
  [[ -s $work/out1/logs/node1/$w.log ]] || fail "no log of $w from node 1's agent"
done
[[ ! -e $work/out1/logs/actor_train_1.log ]] || fail "actor_train rank 1 ran on node 0"
grep -q "agent at ${addr[1]}:" "$work/out1/logs/agents.log" || fail "no agent served node 1 at ${addr[1]}"
for s in 1 2 3 4 5; do
  line=$(grep "\"step\":$s[,}]" "$work/out1/metrics.jsonl") || fail "no metrics for step $s"
  echo "$line" | grep -q "\"rollout/weight_version_max\":$((s - 1))[,.}]" ||
    fail "step $s did not generate with weight version $((s - 1)): $line"
done
[[ -z $(job_processes) ]] || fail "processes of the completed job remain: $(job_processes)"
to_step1=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
step_s=$(grep -o '"time/step_s":[0-9.e+-]*' "$work/out1/metrics.jsonl" | tail -n 4 | cut -d: -f2 |
  awk '{ s += $1; n++ } END { if (n) printf "%.2f", s / n }')
echo "ok: a 2-node job through sbatch ran 5 steps across the namespaces"
echo "figure: sbatch to step 1: ${to_step1} s; mean step time (steps 2-5): ${step_s} s"

# ---- 1b: an agent that cannot start fails the job at once, with its reason.
# Node 0's veth exists on node 0 only: the controller binds, the agent cannot.
job=$(submit "$work/out1b" -- max_steps=5 save_steps=0 runtime.bind_interface="${tag}a") || fail "sbatch refused job 1b"
wait_state "$job" 60 COMPLETED FAILED CANCELLED || fail "job $job (no interface on node 1) did not end within 60 s"
[[ $(job_state "$job") == FAILED ]] || fail "job $job (no interface on node 1) ended $(job_state "$job")"
grep -q "agents' job step (srun) ended" "$work/out1b.out" || fail "the controller did not report the agents' step"
grep -q "'${tag}a' has no IPv4 address here (no such interface)" "$work/out1b.out" ||
  fail "the agent's reason is not in the job's output"
echo "ok: an agent that cannot bind fails the job at once, naming the interface"

# ---- 2: USR1 ahead of the time limit requeues the job; the new run resumes.
job=$(submit "$work/out2" -- max_steps=6 save_steps=2) || fail "sbatch refused the second job"
wait_step "$work/out2/metrics.jsonl" 3 240 || fail "job $job made no step 3"
# What --signal=B:USR1@300 delivers at the time limit minus 5 minutes.
in_ns 0 scancel --batch --signal=USR1 "$job" || fail "scancel --signal=USR1"
wait_state "$job" 300 COMPLETED FAILED CANCELLED || fail "the requeued job $job did not end"
[[ $(job_state "$job") == COMPLETED ]] || fail "the requeued job $job ended $(job_state "$job")"
grep -q "requeueing job $job" "$work/out2.out" || fail "the script did not requeue on USR1"
grep -q "restart 1" "$work/out2.out" || fail "the job did not run a second time"
grep -q "resuming from .*checkpoint-[0-9]" "$work/out2.out" || fail "the requeued run did not resume"
wait_step "$work/out2/metrics.jsonl" 6 1 || fail "the requeued run did not reach step 6"
echo "ok: USR1 requeued the job; the second run resumed from its checkpoint and completed"

# ---- 3: scancel mid-run ends every process of the job on both nodes.
job=$(submit "$work/out3" -- max_steps=500 save_steps=2) || fail "sbatch refused the third job"
wait_step "$work/out3/metrics.jsonl" 3 240 || fail "job $job made no step 3"
[[ -n $(job_processes) ]] || fail "no process of the running job found"
in_ns 0 scancel "$job" || fail "scancel"
for _ in $(seq 150); do
  [[ -z $(job_processes) ]] && break
  sleep 0.2
done
left=$(job_processes)
[[ -z $left ]] || fail "30 s after scancel, processes of the job remain: $(ps -o pid,args -p "${left//$'\n'/,}")"
wait_state "$job" 30 CANCELLED || fail "job $job is $(job_state "$job"), not CANCELLED"
last=$(ls -d "$work"/out3/checkpoint-* 2>/dev/null | sort -t- -k2 -n | tail -n 1)
[[ -n $last ]] || fail "no checkpoint before scancel"
# The last checkpoint is whole: a one-node run resumes from it.
"$roll" run "$config" "${job_args[@]}" output_dir="$work/out3" runtime.slurm=false num_nodes=1 num_gpus_per_node=2 \
  resume_from_checkpoint="$last" max_steps=$(( ${last##*-} + 1 )) save_steps=0 --quiet \
  >"$work/resume3.log" 2>&1 || fail "no run resumes from $last after scancel"
echo "ok: scancel left no process on either node; $(basename "$last") resumes"

# ---- 4: the same job as 1, started by hand (roll agent on node 1), for the step time.
# The agent waits for the controller (--connect-timeout-s).
head -c 24 /dev/urandom | od -An -tx1 | tr -d " \n" >"$work/token"
chmod 600 "$work/token"
in_ns 1 "$roll" agent --controller "${addr[0]}:29412" --token-file "$work/token" --bind "${addr[1]}" \
  --log-dir "$work/hand_logs" --connect-timeout-s 60 >"$work/hand_agent.log" 2>&1 &
agent=$!
in_ns 0 "$roll" run "$config" "${job_args[@]}" output_dir="$work/hand" max_steps=5 save_steps=0 num_nodes=2 \
  runtime.slurm=false runtime.bind_address="${addr[0]}" runtime.controller_port=29412 \
  runtime.token_file="$work/token" --quiet >"$work/hand.log" 2>&1 || fail "the job started by hand failed"
wait "$agent" || fail "the hand-started agent exited with $?"
hand_s=$(grep -o '"time/step_s":[0-9.e+-]*' "$work/hand/metrics.jsonl" | tail -n 4 | cut -d: -f2 |
  awk '{ s += $1; n++ } END { if (n) printf "%.2f", s / n }')
echo "figure: mean step time (steps 2-5) through sbatch ${step_s} s, started by hand ${hand_s} s"
echo "PASS"
