#include "roll/controller/controller.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_join.h"
#include "controller/cluster_impl.h"
#include "roll/scheduler/device_mapping.h"
#include "controller/controller_service.h"
#include "controller/node_launcher.h"
#include "common/atomic_file.h"
#include "common/spawn.h"
#include "roll/controller/slurm.h"
#include "rpc/rpc_util.h"
#include "rpc/store_service.h"

namespace roll {
namespace fs = std::filesystem;

namespace {

// The last `n` lines of a file, for error messages about workers that died.
std::string Tail(const std::string& path, int n) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (static_cast<int>(lines.size()) > n) lines.erase(lines.begin());
  }
  std::string out;
  for (const auto& l : lines) absl::StrAppend(&out, "\n    | ", l);
  return out;
}

// The job token of `runtime.token_file`: read when the file exists, else a
// fresh one written to it (mode 0600) for the agents to read.
absl::StatusOr<std::string> TokenFromFile(const std::string& path) {
  std::error_code ec;
  if (fs::exists(path, ec)) return ReadTokenFile(path, "runtime.token_file");
  const std::string token = rpc::RandomToken();
  auto file = common_internal::AtomicFileWriter::Create(path, 0600);
  absl::Status written = file.ok() ? file->Append(token + "\n") : file.status();
  if (written.ok()) written = file->Commit();
  if (!written.ok()) return Annotate(written, "runtime.token_file");
  return token;
}

// Whether the node an agent registered can hold what the placement puts on it.
absl::Status CheckNodeResources(const DeviceMapping& mapping, const NodeRegistration& node) {
  std::set<int> used;
  for (const auto& w : mapping.workers()) {
    if (w.node == node.node) used.insert(w.local_devices.begin(), w.local_devices.end());
  }
  if (used.empty()) return absl::OkStatus();
  const int highest = *used.rbegin();
  const std::string where = absl::StrCat("node ", node.node, " (", node.hostname, ", agent at ", node.agent_address, ")");
  if (mapping.device_type() == DeviceType::kCuda) {
    if (highest >= node.cuda_devices) {
      return absl::FailedPreconditionError(absl::StrCat(
          where, " has ", node.cuda_devices, " CUDA devices, and the placement uses its local device ", highest,
          " (num_gpus_per_node=", mapping.devices_per_node(), ")"));
    }
    return absl::OkStatus();
  }
  if (static_cast<int>(used.size()) > node.cpu_cores) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, " has ", node.cpu_cores, " cores, and the placement uses ", used.size(),
        " CPU slots there (num_gpus_per_node=", mapping.devices_per_node(), "); a slot needs a core at least"));
  }
  if (static_cast<int>(used.size()) * mapping.threads_per_slot() > node.cpu_cores) {
    spdlog::warn("{} has {} cores for {} CPU slots of {} threads: its workers share cores", where, node.cpu_cores,
                 used.size(), mapping.threads_per_slot());
  }
  return absl::OkStatus();
}

}  // namespace

class Controller::Impl {
 public:
  // Also when Create fails midway: agents that registered are told the job is over.
  ~Impl() {
    if (node_launcher) node_launcher->ShutdownAgents();
    EndAgentStep();
    // Parked store waits would hold the shutdown until their deadline.
    if (store) store->Close();
    if (server) server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  }

  PipelineConfig config;
  ControllerOptions options;
  std::string token;
  std::string address;
  std::unique_ptr<LocalLauncher> own_launcher;
  std::unique_ptr<NodeLauncher> node_launcher;  // num_nodes > 1
  std::map<int, NodeRegistration> nodes;
  Launcher* launcher = nullptr;
  std::unique_ptr<ControllerService> service;
  // The rendezvous store of every worker group's collectives.
  std::unique_ptr<rpc::StoreService> store;
  std::unique_ptr<grpc::Server> server;
  std::string config_yaml;
  std::string log_dir;
  std::optional<DeviceMapping> mapping;
  // In a Slurm allocation: the srun job step running the agents of nodes 1..N-1.
  pid_t agent_step = -1;
  std::string agent_step_log;

  absl::Status StartAgentStep(const SlurmAllocation& allocation, const RuntimeConfig& rt) {
    common_internal::SpawnOptions spawn;
    spawn.argv = SlurmAgentStep(allocation, SelfExecutable(), address, rt, fs::absolute(log_dir).string());
    ROLL_ASSIGN_OR_RETURN(spawn.argv[0], FindOnPath(spawn.argv[0]));
    spawn.env[kSlurmTokenEnv] = token;
    agent_step_log = (fs::path(log_dir) / "agents.log").string();
    spawn.log_path = agent_step_log;
    spawn.truncate_log = true;
    // A controller that dies takes the step along: srun passes SIGTERM on to the agents.
    spawn.death_signal = SIGTERM;
    spdlog::info("Slurm job {}: starting the agents of nodes 1..{} ({}) with srun; their log: {}",
                 allocation.job_id, allocation.num_nodes() - 1,
                 absl::StrJoin(allocation.hosts.begin() + 1, allocation.hosts.end(), ","), agent_step_log);
    ROLL_ASSIGN_OR_RETURN(agent_step, common_internal::SpawnProcess(spawn));
    return absl::OkStatus();
  }

  // OK while the agents' step runs; its end, before every node registered, is the error.
  absl::Status AgentStepRunning() {
    int status = 0;
    if (agent_step <= 0 || waitpid(agent_step, &status, WNOHANG) == 0) return absl::OkStatus();
    agent_step = -1;
    const std::string how = WIFEXITED(status) ? absl::StrCat("exit code ", WEXITSTATUS(status))
                                              : absl::StrCat("signal ", WTERMSIG(status));
    return absl::UnavailableError(absl::StrCat("the agents' job step (srun) ended (", how,
                                               ") before every node registered; ", agent_step_log, ":",
                                               Tail(agent_step_log, 15)));
  }

  // The agents exit when the job ends, and the step with them; one that
  // lingers is signalled (srun passes the signal on to its tasks).
  void EndAgentStep() {
    if (agent_step <= 0) return;
    auto exited_within = [&](absl::Duration d) {
      const absl::Time until = absl::Now() + d;
      while (absl::Now() < until) {
        if (waitpid(agent_step, nullptr, WNOHANG) != 0) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      return false;
    };
    if (!exited_within(absl::Seconds(15))) {
      spdlog::warn("the agents' job step (srun pid {}) did not end with the job: SIGTERM", agent_step);
      kill(agent_step, SIGTERM);
      if (!exited_within(absl::Seconds(10))) {
        kill(agent_step, SIGKILL);
        waitpid(agent_step, nullptr, 0);
      }
    }
    agent_step = -1;
  }
};

Controller::Controller(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Controller::~Controller() = default;

absl::StatusOr<std::unique_ptr<Controller>> Controller::Create(PipelineConfig config, ControllerOptions options) {
  auto impl = std::make_unique<Impl>();
  const RuntimeConfig& rt = config.runtime;
  // A multi-node job in a Slurm allocation: the agents start as an srun step.
  // `roll run` has fitted the config to the allocation already (num_nodes
  // from it); a pipeline of the library's users gets the same checks here.
  std::optional<SlurmAllocation> slurm;
  if (config.num_nodes > 1) {
    ROLL_ASSIGN_OR_RETURN(slurm, FitConfigToSlurm(&config));
  }
  if (!options.token.empty()) {
    impl->token = options.token;
  } else if (!rt.token_file.empty()) {
    ROLL_ASSIGN_OR_RETURN(impl->token, TokenFromFile(rt.token_file));
  } else if (slurm) {
    impl->token = rpc::RandomToken();  // to the agents through srun's environment
  } else if (config.num_nodes > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "runtime.token_file: a job on num_nodes=", config.num_nodes,
        " nodes needs a token file that its agents read (`roll agent --token-file`)"));
  } else {
    impl->token = rpc::RandomToken();
  }
  impl->launcher = options.launcher;
  if (impl->launcher == nullptr) {
    impl->own_launcher = std::make_unique<LocalLauncher>();
    impl->launcher = impl->own_launcher.get();
  }
  ROLL_RETURN_IF_ERROR(rpc::ConfigureTls({rt.tls_cert_file, rt.tls_key_file, rt.tls_ca_file}));
  // AutoDeviceMapping: every worker's node, devices and threads, once per job.
  ROLL_ASSIGN_OR_RETURN(impl->mapping, DeviceMapping::Build(config, HostCores()));
  impl->log_dir = (fs::path(config.output_dir) / "logs").string();
  std::error_code ec;
  fs::create_directories(impl->log_dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create log directory '", impl->log_dir, "': ", ec.message()));
  }
  impl->config_yaml = DumpConfigYaml(config);

  impl->service = std::make_unique<ControllerService>(impl->token);
  grpc::ServerBuilder builder;
  rpc::ConfigureServerBuilder(&builder);
  int port = 0;
  const std::string bind = config.runtime.bind_address;
  builder.AddListeningPort(absl::StrCat(bind, ":", rt.controller_port), rpc::ServerCredentials(), &port);
  builder.RegisterService(impl->service.get());
  impl->store = std::make_unique<rpc::StoreService>(impl->token);
  builder.RegisterService(impl->store.get());
  const int num_nodes = impl->mapping->num_nodes();
  impl->service->ExpectNodes(num_nodes);
  impl->server = builder.BuildAndStart();
  if (!impl->server || port == 0) {
    return absl::UnavailableError(absl::StrCat("controller cannot listen on ", bind, ":", rt.controller_port,
                                               " (runtime.bind_address, runtime.controller_port)"));
  }
  impl->address = absl::StrCat(bind, ":", port);
  if (num_nodes > 1) {
    spdlog::info("controller listening on {}; waiting up to {} s for the agents of nodes 1..{}", impl->address,
                 rt.node_timeout_s, num_nodes - 1);
    std::function<absl::Status()> step_running;
    if (slurm) {
      ROLL_RETURN_IF_ERROR(impl->StartAgentStep(*slurm, rt));
      step_running = [impl = impl.get()] { return impl->AgentStepRunning(); };
    }
    ROLL_ASSIGN_OR_RETURN(impl->nodes, impl->service->WaitForNodes(absl::Seconds(rt.node_timeout_s),
                                                                   "runtime.node_timeout_s", step_running));
    impl->node_launcher = std::make_unique<NodeLauncher>(impl->launcher);
    // Every agent is added before any check, so a refused job still shuts all of them down.
    for (const auto& [n, node] : impl->nodes) {
      impl->node_launcher->AddNode(n, std::make_unique<AgentLauncher>(n, node.agent_address, impl->token));
    }
    impl->launcher = impl->node_launcher.get();
    for (const auto& [n, node] : impl->nodes) {
      ROLL_RETURN_IF_ERROR(CheckNodeResources(*impl->mapping, node));
      spdlog::info("node {}: {} ({}), {} cores, {} CUDA devices, agent at {}", n, node.hostname, node.node_address,
                   node.cpu_cores, node.cuda_devices, node.agent_address);
    }
  }
  impl->config = std::move(config);
  impl->options = std::move(options);
  spdlog::info("controller listening on {}", impl->address);
  return std::unique_ptr<Controller>(new Controller(std::move(impl)));
}

const PipelineConfig& Controller::config() const { return impl_->config; }
const std::string& Controller::token() const { return impl_->token; }
const std::string& Controller::address() const { return impl_->address; }
Launcher& Controller::launcher() { return *impl_->launcher; }
const DeviceMapping& Controller::placement() const { return *impl_->mapping; }

absl::StatusOr<std::unique_ptr<ClusterBase>> Controller::StartCluster(std::string_view role,
                                                                    std::string_view worker_type) {
  ROLL_ASSIGN_OR_RETURN(auto impl, StartClusterImpl(role, worker_type));
  return std::make_unique<ClusterBase>(std::move(impl));
}

absl::StatusOr<std::unique_ptr<ClusterBase::Impl>> Controller::StartClusterImpl(std::string_view role,
                                                                              std::string_view worker_type) {
  const PipelineConfig& cfg = impl_->config;
  const WorkerConfig* section = cfg.FindRole(role);
  if (section == nullptr || !section->present) {
    return absl::InvalidArgumentError(absl::StrCat("config has no role section '", Sv(role), "'"));
  }
  const std::string name(role);
  std::string type(worker_type);
  if (type.empty()) type = section->worker_cls;
  if (type.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ".worker_cls: no worker type given"));
  }
  const int world = section->world_size;
  if (world < 1) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": world_size (or device_mapping) must give at least 1 worker"));
  }
  const auto& rt = cfg.runtime;
  impl_->service->Reset(name);

  std::vector<WorkerInfo> infos;
  std::vector<int> ranks;
  for (int r = 0; r < world; ++r) {
    auto info = LaunchWorker(name, type, world, r);
    if (!info.ok()) {
      for (const WorkerInfo& w : infos) impl_->launcher->Signal(w.pid, SIGKILL);
      return info.status();
    }
    infos.push_back(*std::move(info));
    ranks.push_back(r);
  }
  auto kill_all = [&] {
    for (auto& w : infos) {
      impl_->launcher->Signal(w.pid, SIGKILL);
      impl_->launcher->WaitExit(w.pid, 5.0);
    }
  };
  if (absl::Status s = WaitRegistered(name, &infos); !s.ok()) {
    kill_all();
    return s;
  }

  ClusterSettings settings;
  settings.name = name;
  settings.worker_type = type;
  settings.token = impl_->token;
  settings.call_timeout = absl::Seconds(rt.call_timeout_s);
  settings.health_interval = absl::Seconds(rt.health_check_interval_s);
  settings.worker_timeout = absl::Seconds(rt.worker_timeout_s);
  auto cluster = std::make_unique<ClusterBase::Impl>(std::move(settings), impl_->launcher, infos);
  absl::Status init = cluster->Initialize(ranks, impl_->config_yaml, impl_->options.load.extra_roles,
                                          absl::Seconds(rt.startup_timeout_s));
  if (!init.ok()) {
    cluster.reset();
    kill_all();
    return init;
  }
  cluster->StartMonitor();
  spdlog::info("cluster '{}' up: {} x '{}'", name, world, type);
  return cluster;
}

absl::StatusOr<WorkerInfo> Controller::LaunchWorker(const std::string& name, const std::string& type, int world,
                                                    int rank) {
  const auto& rt = impl_->config.runtime;
  const std::string binary = rt.worker_binary.empty() ? SelfExecutable() : rt.worker_binary;
  const WorkerPlacement* place = impl_->mapping->Find(name, rank);
  if (place == nullptr) return absl::InternalError(absl::StrCat(name, " rank ", rank, " has no placement"));
  std::string safe_name = name;
  for (char& c : safe_name) if (c == '/' || c == '.') c = '_';
  LaunchSpec spec;
  spec.node = place->node;
  // Workers bind to their node's address: loopback or the controller's
  // interface on node 0, the address the agent registered elsewhere.
  const std::string worker_bind = place->node == 0 ? rt.bind_address : impl_->nodes.at(place->node).node_address;
  spec.argv = {binary, "worker", "--type", type, "--cluster", name, "--rank", std::to_string(rank),
               "--world-size", std::to_string(world), "--controller", impl_->address, "--bind",
               worker_bind, "--controller-grace-s", absl::StrCat(rt.controller_grace_s),
               "--log-level", std::string(ToString(rt.log_level)), "--threads", std::to_string(place->threads),
               "--follow-load", rt.threads_follow_load && !impl_->config.deterministic ? "1" : "0"};
  spec.env["ROLL_JOB_TOKEN"] = impl_->token;
  if (!rt.tls_cert_file.empty()) {
    // Absolute paths: the worker may start in another directory.
    spec.env[rpc::kTlsCertEnv] = fs::absolute(rt.tls_cert_file).string();
    spec.env[rpc::kTlsKeyEnv] = fs::absolute(rt.tls_key_file).string();
    if (!rt.tls_ca_file.empty()) spec.env[rpc::kTlsCaEnv] = fs::absolute(rt.tls_ca_file).string();
  }
  const std::string devices = absl::StrJoin(place->local_devices, ",");
  if (!devices.empty()) spec.env["ROLL_DEVICES"] = devices;
  // A worker without devices sees no GPU at all, rather than every GPU of
  // its node (a model there would land on another cluster's device).
  if (impl_->mapping->device_type() == DeviceType::kCuda) spec.env["CUDA_VISIBLE_DEVICES"] = devices;
  spec.log_path = (fs::path(impl_->log_dir) / absl::StrCat(safe_name, "_", rank, ".log")).string();
  auto pid = impl_->launcher->Launch(spec);
  if (!pid.ok()) return Annotate(pid.status(), absl::StrCat("cluster '", name, "' rank ", rank));
  WorkerInfo info;
  info.rank = rank;
  info.pid = *pid;
  info.node = place->node;
  info.log_path = place->node == 0 ? spec.log_path
                                   : absl::StrCat("node ", place->node, ": ", fs::path(spec.log_path).filename().string(),
                                                  " in the agent's log directory");
  return info;
}

absl::Status Controller::WaitRegistered(const std::string& name, std::vector<WorkerInfo>* infos) {
  std::vector<int> ranks;
  for (const WorkerInfo& w : *infos) ranks.push_back(w.rank);
  auto regs = impl_->service->WaitForCluster(
      name, ranks, absl::Seconds(impl_->config.runtime.startup_timeout_s), [&]() -> absl::Status {
        for (const auto& w : *infos) {
          if (auto how = impl_->launcher->ExitStatus(w.pid)) {
            return absl::UnavailableError(absl::StrCat("cluster '", name, "' rank ", w.rank, " (pid ", w.pid, ") ",
                                                       *how, " before registering; log ", w.log_path, ":",
                                                       Tail(w.log_path, 8)));
          }
        }
        return absl::OkStatus();
      });
  if (!regs.ok()) return regs.status();
  for (auto& w : *infos) w.address = (*regs)[w.rank].address;
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> Controller::RestartDeadWorkers(ClusterBase& cluster) {
  std::vector<int> dead;
  for (const WorkerInfo& w : cluster.workers()) {
    if (!w.alive) dead.push_back(w.rank);
  }
  for (int r : dead) ROLL_RETURN_IF_ERROR(RestartWorker(cluster, r));
  return dead;
}

absl::Status Controller::RestartWorker(ClusterBase& cluster, int rank) {
  if (rank < 0 || rank >= cluster.world_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster '", cluster.name(), "' has no rank ", rank, " (world_size ", cluster.world_size(), ")"));
  }
  const std::string name = cluster.name();
  ClusterBase::Impl& impl = *cluster.impl_;
  // The old process must be gone before another takes its place (its port,
  // its device); an exited one is not signalled (its pid may be reused).
  const WorkerInfo old = impl.workers()[rank];
  if (!impl_->launcher->ExitStatus(old.pid)) {
    impl_->launcher->Signal(old.pid, SIGKILL);
    if (!impl_->launcher->WaitExit(old.pid, 10.0)) {
      return absl::UnavailableError(absl::StrCat("cluster '", name, "' rank ", rank, " (pid ", old.pid,
                                                 ") did not exit within 10 s of SIGKILL; not starting another"));
    }
  }
  impl_->service->Reset(name, rank);
  ROLL_ASSIGN_OR_RETURN(WorkerInfo info, LaunchWorker(name, cluster.worker_type(), cluster.world_size(), rank));
  std::vector<WorkerInfo> infos = {info};
  auto kill_it = [&] {
    impl_->launcher->Signal(info.pid, SIGKILL);
    impl_->launcher->WaitExit(info.pid, 5.0);
  };
  if (absl::Status s = WaitRegistered(name, &infos); !s.ok()) {
    kill_it();
    return s;
  }
  impl.ReplaceWorker(infos[0]);
  absl::Status init = impl.Initialize({rank}, impl_->config_yaml, impl_->options.load.extra_roles,
                                      absl::Seconds(impl_->config.runtime.startup_timeout_s));
  if (!init.ok()) {
    kill_it();
    impl.MarkDead(rank, absl::StrCat("failed to initialize: ", init.message()), infos[0].pid);
    return init;
  }
  spdlog::info("cluster '{}' rank {} replaced: pid {} -> {}", name, rank, old.pid, infos[0].pid);
  return absl::OkStatus();
}

}  // namespace roll
