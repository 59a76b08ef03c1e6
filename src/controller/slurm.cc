#include "roll/controller/slurm.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include <spdlog/spdlog.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

extern char** environ;

namespace roll {

namespace {

// An integer variable of the job's environment; `fallback` when unset.
absl::StatusOr<int> IntVar(const EnvLookup& env, const std::string& name, int fallback) {
  const std::optional<std::string> v = env(name);
  if (!v || v->empty()) return fallback;
  int n = 0;
  if (!absl::SimpleAtoi(*v, &n) || n < 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, "='", *v, "' is not a count (Slurm's environment)"));
  }
  return n;
}

// The first IPv4 address `name` resolves to (a dotted address resolves to itself).
absl::StatusOr<std::string> ResolveIpv4(const std::string& name) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (int rc = getaddrinfo(name.c_str(), nullptr, &hints, &result); rc != 0) {
    return absl::NotFoundError(absl::StrCat("cannot resolve '", name, "' to an IPv4 address: ", gai_strerror(rc)));
  }
  char text[INET_ADDRSTRLEN] = {0};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(result->ai_addr)->sin_addr, text, sizeof(text));
  freeaddrinfo(result);
  return std::string(text);
}

}  // namespace

EnvLookup ProcessEnv() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

absl::StatusOr<std::string> FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path ? path : "", ':', absl::SkipEmpty())) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return absl::NotFoundError(absl::StrCat("'", name, "' is not on PATH (", path ? path : "", ")"));
}

absl::StatusOr<std::string> RunCommandOutput(const std::vector<std::string>& argv) {
  const std::string what = absl::StrJoin(argv, " ");
  int fds[2];
  if (pipe(fds) != 0) return absl::InternalError(absl::StrCat("pipe for `", what, "`"));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  posix_spawn_file_actions_addclose(&actions, fds[1]);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return absl::NotFoundError(absl::StrCat("cannot run `", what, "`: ", strerror(rc)));
  }
  std::string out;
  char buf[4096];
  ssize_t n = 0;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
    if (n > 0) out.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::UnavailableError(absl::StrCat("`", what, "` failed (",
                                               WIFEXITED(status) ? absl::StrCat("exit code ", WEXITSTATUS(status))
                                                                 : absl::StrCat("signal ", WTERMSIG(status)),
                                               "): ", absl::StripAsciiWhitespace(out)));
  }
  return out;
}

absl::StatusOr<std::optional<SlurmAllocation>> ReadSlurmAllocation(const EnvLookup& env, const CommandRunner& run) {
  const std::optional<std::string> job = env("SLURM_JOB_ID");
  if (!job || job->empty()) return std::optional<SlurmAllocation>();
  SlurmAllocation a;
  a.job_id = *job;
  const std::optional<std::string> nodelist = env("SLURM_JOB_NODELIST");
  if (!nodelist || nodelist->empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("Slurm job ", a.job_id, ": SLURM_JOB_NODELIST is not set; run inside sbatch or salloc"));
  }
  ROLL_ASSIGN_OR_RETURN(const std::string hosts, run({"scontrol", "show", "hostnames", *nodelist}));
  for (absl::string_view h : absl::StrSplit(hosts, absl::ByAnyChar("\n \t"), absl::SkipEmpty())) {
    a.hosts.emplace_back(h);
  }
  if (a.hosts.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("Slurm job ", a.job_id, ": `scontrol show hostnames ", *nodelist, "` listed no host"));
  }
  ROLL_ASSIGN_OR_RETURN(const int count, IntVar(env, "SLURM_JOB_NUM_NODES", a.num_nodes()));
  if (count != a.num_nodes()) {
    return absl::FailedPreconditionError(absl::StrCat("Slurm job ", a.job_id, ": SLURM_JOB_NUM_NODES=", count,
                                                      " but SLURM_JOB_NODELIST=", *nodelist, " names ",
                                                      a.num_nodes(), " hosts"));
  }
  // SLURMD_NODENAME is the node's name in slurm.conf, which need not be its host name.
  a.host = env("SLURMD_NODENAME").value_or("");
  if (a.host.empty()) {
    char name[256] = {0};
    gethostname(name, sizeof(name) - 1);
    a.host = name;
  }
  auto it = std::find(a.hosts.begin(), a.hosts.end(), a.host);
  if (it == a.hosts.end()) {
    return absl::FailedPreconditionError(absl::StrCat("Slurm job ", a.job_id, ": this node '", a.host,
                                                      "' (SLURMD_NODENAME) is not in its node list ",
                                                      absl::StrJoin(a.hosts, ",")));
  }
  a.node = static_cast<int>(it - a.hosts.begin());
  ROLL_ASSIGN_OR_RETURN(a.gpus_per_node, IntVar(env, "SLURM_GPUS_ON_NODE", -1));
  ROLL_ASSIGN_OR_RETURN(a.cpus_per_node, IntVar(env, "SLURM_CPUS_ON_NODE", 0));
  ROLL_ASSIGN_OR_RETURN(a.step_tasks, IntVar(env, "SLURM_STEP_NUM_TASKS", 0));
  return std::optional<SlurmAllocation>(std::move(a));
}

absl::StatusOr<std::string> InterfaceAddress(const std::string& interface) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return absl::InternalError("getifaddrs failed");
  std::string found;
  std::set<std::string> names;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_name == nullptr) continue;
    names.insert(i->ifa_name);
    if (found.empty() && interface == i->ifa_name && i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET) {
      char text[INET_ADDRSTRLEN] = {0};
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof(text));
      found = text;
    }
  }
  freeifaddrs(list);
  if (!found.empty()) return found;
  return absl::NotFoundError(absl::StrCat("network interface '", interface, "' has no IPv4 address here",
                                          names.count(interface) ? "" : " (no such interface)",
                                          "; interfaces: ", absl::StrJoin(names, ", ")));
}

absl::StatusOr<std::string> SlurmNodeAddress(const SlurmAllocation& a, const std::string& interface,
                                             const CommandRunner& run) {
  if (!interface.empty()) {
    auto address = InterfaceAddress(interface);
    if (!address.ok()) return Annotate(address.status(), absl::StrCat("node ", a.host, ", runtime.bind_interface"));
    return address;
  }
  ROLL_ASSIGN_OR_RETURN(const std::string info, run({"scontrol", "show", "node", "-o", a.host}));
  for (absl::string_view field : absl::StrSplit(info, absl::ByAnyChar(" \n"), absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&field, "NodeAddr=")) {
      auto address = ResolveIpv4(std::string(field));
      if (!address.ok()) {
        return Annotate(address.status(), absl::StrCat("node ", a.host, " (NodeAddr of `scontrol show node`; "
                                                                        "set runtime.bind_interface to pick one)"));
      }
      return address;
    }
  }
  return absl::NotFoundError(
      absl::StrCat("node ", a.host, ": `scontrol show node -o ", a.host, "` gave no NodeAddr: ", info));
}

absl::Status ApplySlurmAllocation(const SlurmAllocation& a, const std::string& node_address, PipelineConfig* config) {
  const std::string job = absl::StrCat("Slurm job ", a.job_id);
  if (a.step_tasks > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        job, ": roll run was started as one of SLURM_STEP_NUM_TASKS=", a.step_tasks,
        " tasks of a job step (srun); start it once, from the batch script: it starts the agents of the other "
        "nodes itself (or set runtime.slurm: false)"));
  }
  if (config->num_nodes != 1 && config->num_nodes != a.num_nodes()) {
    return absl::InvalidArgumentError(absl::StrCat("num_nodes: the config says ", config->num_nodes, " and ", job,
                                                   " has ", a.num_nodes(), " nodes (SLURM_JOB_NUM_NODES); drop "
                                                   "num_nodes to use the allocation, or ask Slurm for ",
                                                   config->num_nodes, " nodes"));
  }
  if (a.num_nodes() == 1) return absl::OkStatus();
  if (a.node != 0) {
    return absl::FailedPreconditionError(absl::StrCat(job, ": roll run runs on the allocation's first node (",
                                                      a.hosts[0], "); this is node ", a.node, " (", a.host, ")"));
  }
  if (config->device_type == DeviceType::kCuda && a.gpus_per_node >= 0 && config->num_gpus_per_node > a.gpus_per_node) {
    return absl::InvalidArgumentError(absl::StrCat("num_gpus_per_node: the config says ", config->num_gpus_per_node,
                                                   " and ", job, " gives each node ", a.gpus_per_node,
                                                   " GPUs (SLURM_GPUS_ON_NODE)"));
  }
  if (config->num_nodes != a.num_nodes()) {
    spdlog::info("{}: num_nodes={} from the allocation ({})", job, a.num_nodes(), absl::StrJoin(a.hosts, ","));
  }
  config->num_nodes = a.num_nodes();
  const RuntimeConfig defaults;
  if (!config->runtime.bind_interface.empty() || config->runtime.bind_address == defaults.bind_address) {
    config->runtime.bind_address = node_address;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<SlurmAllocation>> FitConfigToSlurm(PipelineConfig* config) {
  if (!config->runtime.slurm) return std::optional<SlurmAllocation>();
  // `roll run` fits its config, then the Controller fits its copy again: the
  // process's allocation and node address are asked of scontrol once.
  static std::mutex mu;
  static std::optional<absl::StatusOr<std::optional<SlurmAllocation>>> allocation;
  static std::map<std::string, absl::StatusOr<std::string>> addresses;  // by bind_interface
  std::lock_guard<std::mutex> lock(mu);
  if (!allocation) allocation = ReadSlurmAllocation();
  if (!allocation->ok() || !allocation->value()) return *allocation;
  const SlurmAllocation& slurm = *allocation->value();
  std::string address;
  if (slurm.num_nodes() > 1) {
    const std::string& interface = config->runtime.bind_interface;
    auto it = addresses.find(interface);
    if (it == addresses.end()) it = addresses.emplace(interface, SlurmNodeAddress(slurm, interface)).first;
    ROLL_ASSIGN_OR_RETURN(address, it->second);
  }
  ROLL_RETURN_IF_ERROR(ApplySlurmAllocation(slurm, address, config));
  return *allocation;
}

std::vector<std::string> SlurmAgentStep(const SlurmAllocation& a, const std::string& roll_binary,
                                        const std::string& controller_address, const RuntimeConfig& rt,
                                        const std::string& log_dir) {
  const int others = a.num_nodes() - 1;
  std::vector<std::string> argv = {
      "srun",
      absl::StrCat("--nodes=", others),
      absl::StrCat("--ntasks=", others),
      "--ntasks-per-node=1",
      // Node 0 holds the controller; the step starts at node 1.
      "--relative=1",
      "--overlap",
      // An agent that fails ends the others (and so the job's workers).
      "--kill-on-bad-exit=1",
      "--label",
      absl::StrCat("--job-name=roll-agents-", a.job_id),
  };
  // A step gets one CPU per task unless it asks: the agent's workers use the node.
  if (a.cpus_per_node > 0) argv.push_back(absl::StrCat("--cpus-per-task=", a.cpus_per_node));
  if (a.gpus_per_node > 0) argv.push_back(absl::StrCat("--gres=gpu:", a.gpus_per_node));
  argv.insert(argv.end(), {roll_binary, "agent", "--slurm", "--controller", controller_address, "--log-dir", log_dir,
                           "--controller-grace-s", absl::StrCat(rt.controller_grace_s)});
  // Optional flags, each given only when its value is.
  for (const auto& [flag, value] : {std::pair{"--bind-interface", rt.bind_interface},
                                    std::pair{"--tls-cert", rt.tls_cert_file}, std::pair{"--tls-key", rt.tls_key_file},
                                    std::pair{"--tls-ca", rt.tls_ca_file}}) {
    if (value.empty()) continue;
    argv.push_back(flag);
    argv.push_back(value);
  }
  return argv;
}

}  // namespace roll
