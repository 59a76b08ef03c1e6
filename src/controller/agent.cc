#include "roll/controller/agent.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <iostream>
#include <mutex>
#include <set>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include "common/fork_thread.h"
#include "controller/node_launcher.h"
#include "roll/controller/launcher.h"
#include "roll/scheduler/device_mapping.h"
#include "rpc/rpc_util.h"

namespace roll {
namespace fs = std::filesystem;
namespace {

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal.store(sig); }

// CUDA devices of this machine, counted from the driver's device nodes (the
// agent links no CUDA code).
int CountCudaDevices() {
  int n = 0;
  std::error_code ec;
  while (fs::exists(absl::StrCat("/dev/nvidia", n), ec)) ++n;
  return n;
}

class AgentService final : public rpc::Agent::CallbackService {
 public:
  AgentService(const AgentOptions& o, std::string token) : o_(o), token_(std::move(token)) {}

  grpc::ServerUnaryReactor* Launch(grpc::CallbackServerContext* ctx, const rpc::LaunchRequest* req,
                                   rpc::LaunchReply* reply) override {
    if (!rpc::HasToken(ctx, token_)) return Answer(ctx, rpc::TokenRefused());
    auto spec = CheckLaunch(*req);
    if (!spec.ok()) return Answer(ctx, rpc::ToGrpc(spec.status()));
    if (stopping_.load()) return Answer(ctx, grpc::Status(grpc::StatusCode::UNAVAILABLE, "the agent is shutting down"));
    auto pid = launch_thread_.Run([&] { return launcher_.Launch(*spec); });
    if (!pid.ok()) return Answer(ctx, rpc::ToGrpc(pid.status()));
    {
      std::lock_guard<std::mutex> lock(mu_);
      launched_.insert(*pid);
    }
    spdlog::info("started pid {}, log {}", *pid, spec->log_path);
    reply->set_pid(*pid);
    return Answer(ctx, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx, const rpc::WaitRequest* req,
                                 rpc::WaitReply* reply) override {
    const pid_t pid = static_cast<pid_t>(req->pid());
    if (grpc::Status s = CheckCaller(ctx, pid); !s.ok()) return Answer(ctx, s);
    auto report = [this, pid, reply] {
      if (auto how = launcher_.ExitStatus(pid)) {
        reply->set_exited(true);
        reply->set_how(*how);
      }
    };
    const double timeout = std::clamp(req->timeout_s(), 0.0, 10.0);
    if (timeout <= 0) {
      report();
      return Answer(ctx, grpc::Status::OK);
    }
    // Waiting must not hold a handler thread.
    auto* reactor = ctx->DefaultReactor();
    waiters_.fetch_add(1);
    std::thread([this, pid, timeout, report, reactor] {
      launcher_.WaitExit(pid, timeout);
      report();
      reactor->Finish(grpc::Status::OK);
      waiters_.fetch_sub(1);
    }).detach();
    return reactor;
  }

  grpc::ServerUnaryReactor* Signal(grpc::CallbackServerContext* ctx, const rpc::SignalRequest* req,
                                   rpc::SignalReply*) override {
    const pid_t pid = static_cast<pid_t>(req->pid());
    if (grpc::Status s = CheckCaller(ctx, pid); !s.ok()) return Answer(ctx, s);
    if (req->signal() <= 0 || req->signal() >= NSIG) {
      return Answer(ctx, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, absl::StrCat("no signal ", req->signal())));
    }
    launcher_.Signal(pid, req->signal());
    return Answer(ctx, grpc::Status::OK);
  }

  grpc::ServerUnaryReactor* Shutdown(grpc::CallbackServerContext* ctx, const rpc::ShutdownRequest*,
                                     rpc::ShutdownReply*) override {
    if (!rpc::HasToken(ctx, token_)) return Answer(ctx, rpc::TokenRefused());
    RequestStop("the controller ended the job");
    return Answer(ctx, grpc::Status::OK);
  }

  // False when a stop was requested already (the first reason stays).
  bool RequestStop(const std::string& why) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_.exchange(true)) return false;
      stop_reason_ = why;
    }
    cv_.notify_all();
    return true;
  }
  // Waits up to `period` for a stop request; true once one came.
  bool WaitStop(std::chrono::milliseconds period) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, period, [this] { return stopping_.load(); });
  }
  std::string stop_reason() {
    std::lock_guard<std::mutex> lock(mu_);
    return stop_reason_;
  }

  // SIGTERM to every worker still running, SIGKILL to those that remain after 3 s.
  void EndWorkers() {
    std::set<pid_t> pids;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pids = launched_;
    }
    int running = 0;
    for (pid_t pid : pids) {
      if (launcher_.ExitStatus(pid)) continue;
      launcher_.Signal(pid, SIGTERM);
      ++running;
    }
    if (running > 0) spdlog::info("ending {} workers", running);
    for (pid_t pid : pids) {
      if (!launcher_.WaitExit(pid, 3.0)) {
        launcher_.Signal(pid, SIGKILL);
        launcher_.WaitExit(pid, 5.0);
      }
    }
    // Pending Wait calls end with their process; let them answer before
    // the server and this service go away.
    for (int i = 0; i < 2000 && waiters_.load() > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

 private:
  // The spec of a valid request: only `roll worker` processes, logs inside
  // the agent's log directory, and only the variables a worker reads.
  absl::StatusOr<LaunchSpec> CheckLaunch(const rpc::LaunchRequest& req) const {
    if (req.argv_size() < 8 || req.argv(1) != "worker") {
      return absl::InvalidArgumentError("launch: an agent starts `roll worker ...` processes only");
    }
    const std::string& log = req.log_name();
    if (log.empty() || log.find('/') != std::string::npos || log == "." || log == "..") {
      return absl::InvalidArgumentError(absl::StrCat("launch: log_name '", log, "' is not a plain file name"));
    }
    LaunchSpec spec;
    spec.argv.assign(req.argv().begin(), req.argv().end());
    spec.argv[0] = SelfExecutable();
    for (const auto& [k, v] : req.env()) {
      if (k.rfind("ROLL_", 0) != 0 && k != "CUDA_VISIBLE_DEVICES") {
        return absl::InvalidArgumentError(absl::StrCat("launch: environment variable '", k,
                                                       "' is not one a worker reads (ROLL_*, CUDA_VISIBLE_DEVICES)"));
      }
      spec.env[k] = v;
    }
    // This node's own TLS files, where the agent has them.
    if (!o_.tls_cert_file.empty()) {
      spec.env[rpc::kTlsCertEnv] = fs::absolute(o_.tls_cert_file).string();
      spec.env[rpc::kTlsKeyEnv] = fs::absolute(o_.tls_key_file).string();
      if (!o_.tls_ca_file.empty()) spec.env[rpc::kTlsCaEnv] = fs::absolute(o_.tls_ca_file).string();
    }
    spec.log_path = (fs::path(o_.log_dir) / log).string();
    return spec;
  }
  // The caller has the token and asks about a process this agent started.
  grpc::Status CheckCaller(grpc::CallbackServerContext* ctx, pid_t pid) {
    if (!rpc::HasToken(ctx, token_)) return rpc::TokenRefused();
    std::lock_guard<std::mutex> lock(mu_);
    if (launched_.count(pid)) return grpc::Status::OK;
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                        absl::StrCat("pid ", pid, " is not a worker this agent started"));
  }
  static grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* ctx, const grpc::Status& status) {
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(status);
    return reactor;
  }

  const AgentOptions o_;
  const std::string token_;
  LocalLauncher launcher_;
  // Every fork on one thread that lives as long as the agent: gRPC's handler
  // threads come and go, and a child's PR_SET_PDEATHSIG fires when the thread
  // that forked it ends.
  common_internal::ForkThread launch_thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<pid_t> launched_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> waiters_{0};  // Wait calls answered from their own thread
  std::string stop_reason_;
};

absl::StatusOr<int> RegisterNode(rpc::Controller::Stub& stub, const AgentOptions& o, const std::string& token,
                                 const std::string& agent_address) {
  rpc::RegisterNodeRequest req;
  req.set_node_rank(o.node_rank);
  req.set_agent_address(agent_address);
  req.set_node_address(o.bind);
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  req.set_hostname(host);
  req.set_cpu_cores(HostCores());
  req.set_cuda_devices(CountCudaDevices());
  req.set_pid(getpid());
  const absl::Time deadline = absl::Now() + absl::Seconds(o.connect_timeout_s);
  grpc::Status last;
  while (absl::Now() < deadline && g_signal.load() == 0) {
    grpc::ClientContext ctx;
    rpc::PrepareContext(&ctx, token, std::min(absl::Seconds(2), deadline - absl::Now()));
    ctx.set_wait_for_ready(true);
    rpc::RegisterNodeReply reply;
    last = stub.RegisterNode(&ctx, req, &reply);
    if (last.ok()) return reply.node_rank();
    if (last.error_code() != grpc::StatusCode::UNAVAILABLE &&
        last.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      return Annotate(rpc::FromGrpc(last), absl::StrCat("controller ", o.controller, " refused this node"));
    }
    // The controller may not be up yet, or not expecting nodes yet.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return absl::DeadlineExceededError(absl::StrCat("could not register with the controller at ", o.controller,
                                                  " within ", o.connect_timeout_s, " s (--connect-timeout-s): ",
                                                  last.error_message()));
}

}  // namespace

int RunAgent(const AgentOptions& o) {
  auto fail = [](const absl::Status& s) {
    spdlog::error("roll agent: {}", std::string(s.message()));
    return 1;
  };
  auto token = o.token_file.empty() ? absl::StatusOr<std::string>(o.token) : ReadTokenFile(o.token_file, "--token-file");
  if (!token.ok()) return fail(token.status());
  absl::Status tls = rpc::ConfigureTls({o.tls_cert_file, o.tls_key_file, o.tls_ca_file});
  if (!tls.ok()) return fail(tls);
  std::error_code ec;
  fs::create_directories(o.log_dir, ec);
  if (ec) return fail(absl::InvalidArgumentError(absl::StrCat("--log-dir '", o.log_dir, "': ", ec.message())));

  signal(SIGTERM, OnSignal);
  signal(SIGINT, OnSignal);
  AgentService service(o, *token);
  grpc::ServerBuilder builder;
  rpc::ConfigureServerBuilder(&builder);
  int port = 0;
  builder.AddListeningPort(absl::StrCat(o.bind, ":0"), rpc::ServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return fail(absl::UnavailableError(absl::StrCat("cannot listen on ", o.bind, " (--bind)")));
  }
  const std::string address = absl::StrCat(o.bind, ":", port);
  auto stub = rpc::Controller::NewStub(rpc::MakeChannel(o.controller));
  auto node = RegisterNode(*stub, o, *token, address);
  if (!node.ok()) {
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    return fail(node.status());
  }
  spdlog::info("node {} of the job at {}: agent at {}, workers bind to {}, logs in {}", *node, o.controller,
               address, o.bind, o.log_dir);

  // Heartbeat: the job is over when the controller says so or stays
  // unreachable for longer than the grace period.
  int code = 0;
  absl::Status lost = rpc::WatchController(
      o.controller, *token, "agent", *node, o.controller_grace_s, [&](std::chrono::milliseconds period) {
        const int sig = g_signal.load();
        if (sig != 0 && service.RequestStop(absl::StrCat("signal ", sig, " (", strsignal(sig), ")"))) code = 1;
        return service.WaitStop(period);
      });
  if (!lost.ok()) {
    service.RequestStop(absl::IsUnavailable(lost) ? absl::StrCat(lost.message(), " (--controller-grace-s)")
                                                  : absl::StrCat("the controller refused this agent: ", lost.message()));
    code = 2;
  }
  spdlog::info("agent of node {} exiting: {}", *node, service.stop_reason());
  service.EndWorkers();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  return code;
}

}  // namespace roll
