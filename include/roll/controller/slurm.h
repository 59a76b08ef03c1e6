#pragma once
// Slurm allocations (docs/multinode.md, "Slurm"). Inside an allocation
// (`sbatch`, `salloc`), `roll run` takes the job's nodes from Slurm instead
// of from hand-started agents: num_nodes is the allocation's node count,
// the controller runs on the allocation's first node and binds to that
// node's address, and the agents of nodes 1..N-1 are one `srun` job step
// (one task per node) that the controller starts and waits for. Each agent
// (`roll agent --slurm`) finds its node rank and address the same way.
//
// Everything here reads the environment Slurm gives a job (SLURM_JOB_ID,
// SLURM_JOB_NUM_NODES, SLURM_JOB_NODELIST, SLURMD_NODENAME, ...) and asks
// `scontrol` for what the environment does not say (the expanded host
// list, a node's address). The environment and the command runner are
// parameters so that tests can give a made-up allocation.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "roll/common/config.h"
#include "roll/common/status.h"

namespace roll {

// The environment variable that carries the job token to the agents of an
// srun step (srun passes the controller's environment on to its tasks; a
// process's environment is readable by its owner alone, unlike its
// command line or a file on a shared filesystem).
inline constexpr char kSlurmTokenEnv[] = "ROLL_JOB_TOKEN";

struct SlurmAllocation {
  std::string job_id;               // SLURM_JOB_ID
  std::vector<std::string> hosts;   // SLURM_JOB_NODELIST expanded, node order
  std::string host;                 // this node, SLURMD_NODENAME
  int node = 0;                     // the index of `host` in `hosts`
  int gpus_per_node = -1;           // SLURM_GPUS_ON_NODE; -1: Slurm gives none
  int cpus_per_node = 0;            // SLURM_CPUS_ON_NODE; 0: not given
  int step_tasks = 0;               // SLURM_STEP_NUM_TASKS inside an srun step, else 0

  int num_nodes() const { return static_cast<int>(hosts.size()); }
};

// Reads one environment variable; nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
// Runs a command (argv[0] looked up on PATH) and returns its standard
// output; an error with its output when it cannot run or exits non-zero.
using CommandRunner = std::function<absl::StatusOr<std::string>(const std::vector<std::string>&)>;

// This process's environment and a runner that forks and execs.
EnvLookup ProcessEnv();
absl::StatusOr<std::string> RunCommandOutput(const std::vector<std::string>& argv);

// The path of an executable on PATH; NotFound naming it and PATH.
absl::StatusOr<std::string> FindOnPath(const std::string& name);

// The allocation this process runs in: nullopt outside Slurm (no
// SLURM_JOB_ID). Errors name the variable that is missing or malformed.
absl::StatusOr<std::optional<SlurmAllocation>> ReadSlurmAllocation(const EnvLookup& env = ProcessEnv(),
                                                                   const CommandRunner& run = RunCommandOutput);

// The IPv4 address this node's servers bind to: that of `interface` when
// it is given (it must exist on this machine, with an IPv4 address), else
// the node's NodeAddr from `scontrol show node`, resolved.
absl::StatusOr<std::string> SlurmNodeAddress(const SlurmAllocation& allocation, const std::string& interface,
                                             const CommandRunner& run = RunCommandOutput);

// The IPv4 address of a network interface of this machine; the error lists
// the interfaces there are.
absl::StatusOr<std::string> InterfaceAddress(const std::string& interface);

// Fits the config of `roll run` to the allocation: num_nodes from it (a
// config that sets another node count than 1 must match, else both numbers
// are named), runtime.bind_address = `node_address` when the job spans
// nodes and the config left the loopback default (or names
// runtime.bind_interface). Refuses a `roll run` started as one of several
// tasks of an srun step, or on another node than the allocation's first,
// and a num_gpus_per_node above the GPUs Slurm gives each node.
absl::Status ApplySlurmAllocation(const SlurmAllocation& allocation, const std::string& node_address,
                                  PipelineConfig* config);

// All of the above for the job this process runs in, when
// `config->runtime.slurm` is on: nullopt (and the config unchanged) outside
// Slurm; otherwise the allocation, with the config fitted to it.
absl::StatusOr<std::optional<SlurmAllocation>> FitConfigToSlurm(PipelineConfig* config);

// The job step that starts one `roll agent --slurm` on each of the nodes
// 1..N-1: srun with one task per node, relative to node 1, each task given
// the CPUs (and GPUs) Slurm gives a node; a task that fails ends the step.
// The token goes in the environment (kSlurmTokenEnv), not in the argv.
std::vector<std::string> SlurmAgentStep(const SlurmAllocation& allocation, const std::string& roll_binary,
                                        const std::string& controller_address, const RuntimeConfig& runtime,
                                        const std::string& log_dir);

}  // namespace roll
