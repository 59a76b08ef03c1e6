#include "roll/controller/controller.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_join.h"
#include "controller/cluster_impl.h"
#include "roll/scheduler/device_mapping.h"
#include "controller/controller_service.h"
#include "rpc/rpc_util.h"

namespace roll {
namespace fs = std::filesystem;

namespace {

std::string RandomToken() {
  std::random_device rd;
  std::string token;
  static constexpr char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 32; ++i) token.push_back(kHex[rd() % 16]);
  return token;
}

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

}  // namespace

class Controller::Impl {
 public:
  PipelineConfig config;
  ControllerOptions options;
  std::string token;
  std::string address;
  std::unique_ptr<LocalLauncher> own_launcher;
  Launcher* launcher = nullptr;
  std::unique_ptr<ControllerService> service;
  std::unique_ptr<grpc::Server> server;
  std::string config_yaml;
  std::string log_dir;
  std::optional<DeviceMapping> mapping;
};

Controller::Controller(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Controller::~Controller() {
  if (impl_->server) impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
}

absl::StatusOr<std::unique_ptr<Controller>> Controller::Create(PipelineConfig config, ControllerOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->token = options.token.empty() ? RandomToken() : options.token;
  impl->launcher = options.launcher;
  if (impl->launcher == nullptr) {
    impl->own_launcher = std::make_unique<LocalLauncher>();
    impl->launcher = impl->own_launcher.get();
  }
  const RuntimeConfig& rt = config.runtime;
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
  builder.AddListeningPort(absl::StrCat(bind, ":0"), rpc::ServerCredentials(), &port);
  builder.RegisterService(impl->service.get());
  impl->server = builder.BuildAndStart();
  if (!impl->server || port == 0) {
    return absl::UnavailableError(absl::StrCat("controller cannot listen on ", bind, " (runtime.bind_address)"));
  }
  impl->address = absl::StrCat(bind, ":", port);
  impl->config = std::move(config);
  impl->options = std::move(options);
  spdlog::info("controller listening on {}", impl->address);
  return std::unique_ptr<Controller>(new Controller(std::move(impl)));
}

const PipelineConfig& Controller::config() const { return impl_->config; }
const std::string& Controller::token() const { return impl_->token; }
const std::string& Controller::address() const { return impl_->address; }
Launcher& Controller::launcher() { return *impl_->launcher; }

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
  const std::string binary = rt.worker_binary.empty() ? SelfExecutable() : rt.worker_binary;
  impl_->service->Reset(name);

  std::vector<WorkerInfo> infos(world);
  std::string safe_name = name;
  for (char& c : safe_name) if (c == '/' || c == '.') c = '_';
  for (int r = 0; r < world; ++r) {
    const WorkerPlacement* place = impl_->mapping->Find(name, r);
    if (place == nullptr) return absl::InternalError(absl::StrCat(name, " rank ", r, " has no placement"));
    if (place->node != 0) {
      return absl::UnimplementedError(absl::StrCat(
          name, " rank ", r, " is placed on node ", place->node, " (num_nodes=", cfg.num_nodes,
          "), and this controller starts workers on its own node only"));
    }
    const int threads = place->threads;
    LaunchSpec spec;
    spec.argv = {binary, "worker", "--type", type, "--cluster", name, "--rank", std::to_string(r),
                 "--world-size", std::to_string(world), "--controller", impl_->address, "--bind",
                 rt.bind_address, "--controller-grace-s", absl::StrCat(rt.controller_grace_s),
                 "--log-level", std::string(ToString(rt.log_level)), "--threads", std::to_string(threads)};
    spec.env["ROLL_JOB_TOKEN"] = impl_->token;
    if (!rt.tls_cert_file.empty()) {
      // Absolute paths: the worker may start in another directory.
      spec.env[rpc::kTlsCertEnv] = fs::absolute(rt.tls_cert_file).string();
      spec.env[rpc::kTlsKeyEnv] = fs::absolute(rt.tls_key_file).string();
      if (!rt.tls_ca_file.empty()) spec.env[rpc::kTlsCaEnv] = fs::absolute(rt.tls_ca_file).string();
    }
    if (!place->local_devices.empty()) {
      spec.env["ROLL_DEVICES"] = absl::StrJoin(place->local_devices, ",");
      if (impl_->mapping->device_type() == "cuda") spec.env["CUDA_VISIBLE_DEVICES"] = spec.env["ROLL_DEVICES"];
    }
    spec.log_path = (fs::path(impl_->log_dir) / absl::StrCat(safe_name, "_", r, ".log")).string();
    auto pid = impl_->launcher->Launch(spec);
    if (!pid.ok()) {
      for (int k = 0; k < r; ++k) impl_->launcher->Signal(infos[k].pid, SIGKILL);
      return Annotate(pid.status(), absl::StrCat("cluster '", name, "' rank ", r));
    }
    infos[r].rank = r;
    infos[r].pid = *pid;
    infos[r].log_path = spec.log_path;
  }
  auto kill_all = [&] {
    for (auto& w : infos) {
      impl_->launcher->Signal(w.pid, SIGKILL);
      impl_->launcher->WaitExit(w.pid, 5.0);
    }
  };
  auto regs = impl_->service->WaitForCluster(
      name, world, absl::Seconds(rt.startup_timeout_s), [&]() -> absl::Status {
        for (const auto& w : infos) {
          if (auto how = impl_->launcher->ExitStatus(w.pid)) {
            return absl::UnavailableError(absl::StrCat("cluster '", name, "' rank ", w.rank, " (pid ", w.pid, ") ",
                                                       *how, " before registering; log ", w.log_path, ":",
                                                       Tail(w.log_path, 8)));
          }
        }
        return absl::OkStatus();
      });
  if (!regs.ok()) {
    kill_all();
    return regs.status();
  }
  for (auto& w : infos) w.address = (*regs)[w.rank].address;

  ClusterSettings settings;
  settings.name = name;
  settings.worker_type = type;
  settings.token = impl_->token;
  settings.call_timeout = absl::Seconds(rt.call_timeout_s);
  settings.health_interval = absl::Seconds(rt.health_check_interval_s);
  settings.worker_timeout = absl::Seconds(rt.worker_timeout_s);
  auto cluster = std::make_unique<ClusterBase::Impl>(std::move(settings), impl_->launcher, infos);
  absl::Status init = cluster->InitializeAll(impl_->config_yaml, impl_->options.load.extra_roles,
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

}  // namespace roll
