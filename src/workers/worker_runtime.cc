// The worker process: a gRPC server with the fixed Worker service, one
// executor thread for methods, a watchdog that exits when the controller is
// gone, and registration with the controller at start-up.

#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <ATen/Parallel.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_join.h"
#include "common/executor.h"
#include "roll/common/cli_args.h"
#include "roll/common/cpu_load.h"
#include "roll/common/exit_hooks.h"
#include "roll/common/logging.h"
#include "roll/scheduler/device_mapping.h"
#include "roll/worker/debug_worker.h"
#include "roll/worker/worker.h"
#include "rpc/rpc_util.h"
#include "worker.grpc.pb.h"

namespace roll {
namespace {

using Clock = std::chrono::steady_clock;

struct WorkerOptions {
  std::string type;
  std::string cluster;
  int rank = 0;
  int world_size = 1;
  std::string controller;
  std::string bind = "127.0.0.1";
  std::string token;
  double controller_grace_s = 5.0;
  int threads = 1;
  // Lower the threads while other processes keep the cores busy
  // (runtime.threads_follow_load).
  bool follow_load = false;
  bool bench_raw = false;
};

absl::StatusOr<std::string> ReadToken(const std::string& token_file) {
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!in) return absl::NotFoundError(absl::StrCat("token file '", token_file, "' cannot be read"));
    std::string token;
    std::getline(in, token);
    if (token.empty()) return absl::InvalidArgumentError(absl::StrCat("token file '", token_file, "' is empty"));
    return token;
  }
  const char* env = std::getenv("ROLL_JOB_TOKEN");
  if (env == nullptr || *env == '\0') {
    return absl::InvalidArgumentError("no job token: pass --token-file or set ROLL_JOB_TOKEN");
  }
  return std::string(env);
}

absl::StatusOr<WorkerOptions> ParseWorkerOptions(int argc, char** argv) {
  std::vector<std::string> args(argv + 2, argv + argc);
  ROLL_ASSIGN_OR_RETURN(CliArgs flags,
                        CliArgs::Parse(args,
                                       {"type", "cluster", "rank", "world-size", "controller", "bind",
                                        "token-file", "controller-grace-s", "log-level", "threads", "follow-load"},
                                       {}));
  WorkerOptions o;
  ROLL_ASSIGN_OR_RETURN(o.type, flags.Required("type"));
  ROLL_ASSIGN_OR_RETURN(o.cluster, flags.Required("cluster"));
  ROLL_ASSIGN_OR_RETURN(o.controller, flags.Required("controller"));
  ROLL_ASSIGN_OR_RETURN(int64_t rank, flags.GetInt("rank", 0));
  ROLL_ASSIGN_OR_RETURN(int64_t world, flags.GetInt("world-size", 1));
  if (world < 1 || rank < 0 || rank >= world) {
    return absl::InvalidArgumentError(absl::StrCat("--rank ", rank, " is outside --world-size ", world));
  }
  o.rank = static_cast<int>(rank);
  o.world_size = static_cast<int>(world);
  o.bind = flags.Get("bind", "127.0.0.1");
  const int64_t cores = HostCores();
  ROLL_ASSIGN_OR_RETURN(int64_t threads, flags.GetInt("threads", cores));
  if (threads < 1) return absl::InvalidArgumentError(absl::StrCat("--threads must be >= 1, got ", threads));
  o.threads = static_cast<int>(threads);
  ROLL_ASSIGN_OR_RETURN(int64_t follow, flags.GetInt("follow-load", 0));
  o.follow_load = follow != 0;
  ROLL_ASSIGN_OR_RETURN(o.controller_grace_s, flags.GetDouble("controller-grace-s", 5.0));
  // Set by `roll bench dispatch` for its baseline; never on by default
  // because the raw service takes no token.
  const char* raw = std::getenv("ROLL_BENCH_RAW");
  o.bench_raw = raw != nullptr && std::string_view(raw) == "1";
  ROLL_ASSIGN_OR_RETURN(o.token, ReadToken(flags.Get("token-file")));
  ROLL_RETURN_IF_ERROR(InitLogging(absl::StrCat(o.cluster, "/", o.rank), flags.Get("log-level", "info")));
  return o;
}

// Runs a user method, turning exceptions into a Status: they must never
// cross the executor or RPC boundary.
absl::StatusOr<Batch> RunGuarded(const MethodFn& fn, const Batch& in) {
  try {
    return fn(in);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("method threw: ", e.what()));
  } catch (...) {
    return absl::InternalError("method threw a non-standard exception");
  }
}

class WorkerProcess {
 public:
  WorkerProcess(WorkerOptions options, std::unique_ptr<Worker> worker)
      : o_(std::move(options)),
        worker_(std::move(worker)),
        threads_(o_.threads, o_.follow_load),
        executor_([this] {
          // The intra-op thread count is per OS thread under OpenMP, and
          // tasks may run on any gRPC thread: set it before each task.
          const int threads = threads_.Threads();
          if (threads != last_threads_) {
            spdlog::info("{} intra-op thread(s) of {}: {}", threads, threads_.wanted(), threads_.why());
            last_threads_ = threads;
          }
          if (at::get_num_threads() != threads) at::set_num_threads(threads);
        }) {
    worker_->RegisterMethods(table_);
  }

  const WorkerOptions& options() const { return o_; }

  // --- handlers (called on gRPC threads; they validate and enqueue) ---

  grpc::ServerUnaryReactor* Initialize(grpc::CallbackServerContext* ctx,
                                       const rpc::InitializeRequest* req, rpc::InitializeReply*) {
    auto* reactor = ctx->DefaultReactor();
    if (!rpc::HasToken(ctx, o_.token)) {
      reactor->Finish(rpc::TokenRefused());
      return reactor;
    }
    executor_.Post([this, req, reactor] { reactor->Finish(rpc::ToGrpc(DoInitialize(*req))); });
    return reactor;
  }

  grpc::ServerUnaryReactor* Call(grpc::CallbackServerContext* ctx, const rpc::CallRequest* req,
                                 rpc::CallReply* reply) {
    auto* reactor = ctx->DefaultReactor();
    if (!rpc::HasToken(ctx, o_.token)) {
      reactor->Finish(rpc::TokenRefused());
      return reactor;
    }
    const MethodFn* fn = table_.Find(req->method());
    if (fn == nullptr) {
      reactor->Finish(grpc::Status(
          grpc::StatusCode::NOT_FOUND,
          absl::StrCat("worker type '", o_.type, "' has no method '", req->method(),
                       "' (methods: ", absl::StrJoin(table_.Names(), ", "), ")")));
      return reactor;
    }
    auto batch = DecodeBatch(req->batch());
    if (!batch.ok()) {
      reactor->Finish(rpc::ToGrpc(Annotate(batch.status(), absl::StrCat("method '", req->method(), "'"))));
      return reactor;
    }
    executor_.Post([this, fn, req, reply, reactor, in = std::move(batch).value()] {
      if (!initialized_.load()) {
        reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                     "worker is not initialized (Initialize was not called or failed)"));
        return;
      }
      SetRunning(req->method());
      absl::StatusOr<Batch> out = RunGuarded(*fn, in);
      SetRunning("");
      calls_done_.fetch_add(1);
      if (!out.ok()) {
        reactor->Finish(rpc::ToGrpc(out.status()));
        return;
      }
      EncodeBatchTo(*out, reply->mutable_batch());
      reactor->Finish(grpc::Status::OK);
    });
    return reactor;
  }

  grpc::ServerUnaryReactor* Health(grpc::CallbackServerContext* ctx, const rpc::HealthRequest*,
                                   rpc::HealthReply* reply) {
    auto* reactor = ctx->DefaultReactor();
    if (!rpc::HasToken(ctx, o_.token)) {
      reactor->Finish(rpc::TokenRefused());
      return reactor;
    }
    reply->set_pid(getpid());
    reply->set_initialized(initialized_.load());
    reply->set_calls_done(calls_done_.load());
    {
      std::lock_guard<std::mutex> lock(mu_);
      reply->set_running_method(running_);
      if (!running_.empty()) {
        reply->set_running_for_s(std::chrono::duration<double>(Clock::now() - running_since_).count());
      }
    }
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* Shutdown(grpc::CallbackServerContext* ctx, const rpc::ShutdownRequest*,
                                     rpc::ShutdownReply*) {
    auto* reactor = ctx->DefaultReactor();
    if (!rpc::HasToken(ctx, o_.token)) {
      reactor->Finish(rpc::TokenRefused());
      return reactor;
    }
    reactor->Finish(grpc::Status::OK);
    RequestExit(0, "shutdown requested by the controller");
    return reactor;
  }

  // --- process lifecycle ---

  void RequestExit(int code, std::string why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (exit_requested_) return;
    exit_requested_ = true;
    exit_code_ = code;
    exit_reason_ = std::move(why);
    exit_cv_.notify_all();
  }

  // Blocks until an exit is requested; returns the exit code.
  int WaitForExit() {
    std::unique_lock<std::mutex> lock(mu_);
    exit_cv_.wait(lock, [this] { return exit_requested_; });
    spdlog::info("exiting: {}", exit_reason_);
    return exit_code_;
  }

  // Pings the controller; requests an exit when it has been unreachable for
  // longer than the grace period, so no worker outlives its controller.
  void WatchController() {
    absl::Status lost = rpc::WatchController(
        o_.controller, o_.token, o_.cluster, o_.rank, o_.controller_grace_s, [this](std::chrono::milliseconds period) {
          std::unique_lock<std::mutex> lock(mu_);
          return exit_cv_.wait_for(lock, period, [this] { return exit_requested_; });
        });
    if (absl::IsUnauthenticated(lost)) {
      RequestExit(3, "the controller refused this worker's token");
    } else if (!lost.ok()) {
      RequestExit(2, std::string(lost.message()));
    }
  }

  absl::Status RegisterWithController(const std::string& address, absl::Duration timeout) {
    auto stub = rpc::Controller::NewStub(rpc::MakeChannel(o_.controller));
    grpc::ClientContext ctx;
    rpc::PrepareContext(&ctx, o_.token, timeout);
    ctx.set_wait_for_ready(true);
    rpc::RegisterRequest req;
    req.set_cluster(o_.cluster);
    req.set_rank(o_.rank);
    req.set_address(address);
    req.set_pid(getpid());
    req.set_worker_type(o_.type);
    rpc::RegisterReply reply;
    return Annotate(rpc::FromGrpc(stub->Register(&ctx, req, &reply)),
                    absl::StrCat("register with controller ", o_.controller));
  }

 private:
  absl::Status DoInitialize(const rpc::InitializeRequest& req) {
    if (initialized_.load()) return absl::FailedPreconditionError("worker is already initialized");
    LoadOptions load;
    load.extra_roles.assign(req.extra_roles().begin(), req.extra_roles().end());
    auto config = ParsePipelineConfig(req.config_yaml(), "<config from controller>", {}, load);
    if (!config.ok()) return Annotate(config.status(), "initialize");
    config_ = std::move(config).value();
    const WorkerConfig* role = config_.FindRole(o_.cluster);
    if (role == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("initialize: config has no role section '", o_.cluster, "'"));
    }
    ctx_.cluster = o_.cluster;
    ctx_.rank = o_.rank;
    ctx_.world_size = o_.world_size;
    ctx_.host = o_.bind;
    ctx_.controller = o_.controller;
    ctx_.token = o_.token;
    ctx_.config = &config_;
    ctx_.role = role;
    absl::Status s;
    try {
      s = worker_->Initialize(ctx_);
    } catch (const std::exception& e) {
      s = absl::InternalError(absl::StrCat("Initialize threw: ", e.what()));
    }
    if (s.ok()) {
      initialized_.store(true);
      spdlog::info("initialized ({} of {} in cluster '{}')", o_.rank, o_.world_size, o_.cluster);
    }
    return s;
  }

  void SetRunning(const std::string& method) {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = method;
    running_since_ = Clock::now();
  }

  WorkerOptions o_;
  std::unique_ptr<Worker> worker_;
  // Used by the executor's tasks only, one at a time.
  LoadAwareThreads threads_;
  int last_threads_ = 0;
  MethodTable table_;
  PipelineConfig config_;
  WorkerContext ctx_;
  std::atomic<bool> initialized_{false};
  std::atomic<int64_t> calls_done_{0};

  std::mutex mu_;
  std::string running_;
  Clock::time_point running_since_;
  std::condition_variable exit_cv_;
  bool exit_requested_ = false;
  int exit_code_ = 0;
  std::string exit_reason_;

  SerialExecutor executor_;
};

class WorkerServiceImpl final : public rpc::Worker::CallbackService {
 public:
  explicit WorkerServiceImpl(WorkerProcess* p) : p_(p) {}
  grpc::ServerUnaryReactor* Initialize(grpc::CallbackServerContext* c, const rpc::InitializeRequest* q,
                                       rpc::InitializeReply* r) override {
    return p_->Initialize(c, q, r);
  }
  grpc::ServerUnaryReactor* Call(grpc::CallbackServerContext* c, const rpc::CallRequest* q,
                                 rpc::CallReply* r) override {
    return p_->Call(c, q, r);
  }
  grpc::ServerUnaryReactor* Health(grpc::CallbackServerContext* c, const rpc::HealthRequest* q,
                                   rpc::HealthReply* r) override {
    return p_->Health(c, q, r);
  }
  grpc::ServerUnaryReactor* Shutdown(grpc::CallbackServerContext* c, const rpc::ShutdownRequest* q,
                                     rpc::ShutdownReply* r) override {
    return p_->Shutdown(c, q, r);
  }

 private:
  WorkerProcess* p_;
};

// The bench baseline: a plain callback-API echo, handled inline.
class BenchRawImpl final : public rpc::BenchRaw::CallbackService {
  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* ctx, const rpc::RawEcho* req,
                                 rpc::RawEcho* reply) override {
    if (!req->discard()) reply->set_payload(req->payload());
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "roll worker: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

bool IsWorkerInvocation(int argc, char** argv) {
  return argc >= 2 && std::string_view(argv[1]) == "worker";
}

int RunWorkerMain(int argc, char** argv) {
  // SIGTERM and SIGINT (the controller stopped, or died: its parent-death
  // signal) are taken on one thread of their own, blocked everywhere else
  // (before any other thread starts, so every thread inherits the mask):
  // the worker runs its exit hooks -- stops the servers it started, removes
  // its temporary directories -- and exits at once.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::thread([stop_signals] {
    int sig = 0;
    if (sigwait(&stop_signals, &sig) != 0) return;
    RunProcessExitHooks();
    _exit(128 + sig);
  }).detach();
  RegisterBuiltinWorkers();
  auto options = ParseWorkerOptions(argc, argv);
  if (!options.ok()) return Fail(options.status());
  {
    // TLS files come from the controller (or agent) through the environment.
    auto env = [](const char* k) { const char* v = std::getenv(k); return std::string(v ? v : ""); };
    absl::Status tls = rpc::ConfigureTls({env(rpc::kTlsCertEnv), env(rpc::kTlsKeyEnv), env(rpc::kTlsCaEnv)});
    if (!tls.ok()) return Fail(tls);
  }
  auto worker = WorkerRegistry::Global().Create(options->type);
  if (!worker.ok()) return Fail(worker.status());

  WorkerProcess process(*std::move(options), *std::move(worker));
  const WorkerOptions& o = process.options();
  WorkerServiceImpl service(&process);
  BenchRawImpl raw;
  grpc::ServerBuilder builder;
  rpc::ConfigureServerBuilder(&builder);
  int port = 0;
  builder.AddListeningPort(absl::StrCat(o.bind, ":0"), rpc::ServerCredentials(), &port);
  builder.RegisterService(&service);
  if (o.bench_raw) builder.RegisterService(&raw);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return Fail(absl::UnavailableError(absl::StrCat("cannot listen on ", o.bind)));
  }
  const std::string address = absl::StrCat(o.bind, ":", port);
  spdlog::info("worker type '{}' serving on {} (pid {}, {} intra-op threads{})", o.type, address, getpid(),
               o.threads, o.follow_load ? ", fewer while other processes keep the cores busy" : "");

  absl::Status reg = process.RegisterWithController(address, absl::Seconds(std::max(5.0, o.controller_grace_s)));
  if (!reg.ok()) {
    spdlog::error("{}", std::string(reg.message()));
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    return 2;
  }
  std::thread watchdog([&process] { process.WatchController(); });
  int code = process.WaitForExit();
  watchdog.join();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  // A method may still be running or queued on the executor, holding reactors
  // of calls the shutdown has cancelled: leave without unwinding them.
  // What the worker's parts must do on the way out (stop the environment
  // servers they started, remove their temporary directories).
  RunProcessExitHooks();
  spdlog::shutdown();
  std::fflush(nullptr);
  _exit(code);
}

}  // namespace roll
