// env_type "external": an environment served over gRPC by a server in any
// language (src/rpc/environment.proto, docs/environments.md).
//
// Options the framework reads; every other option goes to the server:
//   address            host:port or unix:PATH of a running server
//   command            a shell command that serves the protocol on the
//                      address in $ROLL_ENV_ADDRESS (a Unix socket the
//                      framework picks); started on first use, once per
//                      process, and stopped when the process ends
//   timeout_s          deadline of each Reset/Step/Describe call (default 30)
//   startup_timeout_s  how long a started server has to answer (default 60)
//
// A server started here runs in its own process group with its output in
// server.log beside its socket; it gets SIGTERM when this process ends
// (PR_SET_PDEATHSIG, so also when this process is killed), and the whole
// group SIGTERM then SIGKILL at a normal exit.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/fork_thread.h"
#include "common/spawn.h"
#include "envs/env_options.h"
#include "roll/common/exit_hooks.h"
#include "roll/rpc/environment.grpc.pb.h"
#include "rpc/rpc_util.h"

namespace roll::envs_internal {
namespace {

namespace fs = std::filesystem;
namespace pb = ::roll::env::v1;
using Options = std::map<std::string, std::string>;

// Every fork runs on one thread that lives as long as the process (never
// destroyed): the threads that call into environments come and go, and a
// child's PR_SET_PDEATHSIG fires when the thread that forked it ends.
common_internal::ForkThread& Forks() {
  static auto* t = new common_internal::ForkThread();
  return *t;
}

// The last `lines` lines of a file (a failed server's log), indented.
std::string Tail(const fs::path& file, int lines) {
  std::ifstream in(file);
  std::deque<std::string> last;
  for (std::string line; std::getline(in, line);) {
    last.push_back(line);
    if (static_cast<int>(last.size()) > lines) last.pop_front();
  }
  return last.empty() ? "(no output)" : absl::StrJoin(last, "\n  ");
}

// One server, shared by every episode of the process that names the same
// address or command.
class Server {
 public:
  // The server of `address` or `command`; a command is started on first use.
  static absl::StatusOr<std::shared_ptr<Server>> Get(const std::string& address, const std::string& command,
                                                     absl::Duration startup_timeout) {
    static std::mutex mu;
    static auto* servers = new std::map<std::string, std::shared_ptr<Server>>();  // never destroyed
    const std::string key = command.empty() ? "address " + address : "command " + command;
    std::lock_guard<std::mutex> lock(mu);
    auto it = servers->find(key);
    if (it != servers->end()) {
      // A started server that died since is started again.
      if (!it->second->Exited()) return it->second;
      servers->erase(it);
    }
    auto server = std::shared_ptr<Server>(new Server(key));
    if (command.empty()) {
      server->Connect(address);
    } else {
      ROLL_RETURN_IF_ERROR(server->Start(command, startup_timeout));
    }
    servers->emplace(key, server);
    return server;
  }

  // "external environment (command 'python3 env.py')", for every error.
  const std::string& name() const { return name_; }
  pb::EnvironmentService::Stub& stub() { return *stub_; }

  // Describe, once per set of options.
  absl::StatusOr<pb::DescribeReply> Describe(const Options& options, absl::Duration timeout) {
    const std::string key = absl::StrJoin(options, ";", absl::PairFormatter("="));
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = described_.find(key); it != described_.end()) return it->second;
    }
    pb::DescribeRequest req;
    req.mutable_options()->insert(options.begin(), options.end());
    pb::DescribeReply reply;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout));
    ROLL_RETURN_IF_ERROR(Check(stub_->Describe(&ctx, req, &reply), "Describe", timeout));
    std::lock_guard<std::mutex> lock(mu_);
    described_[key] = reply;
    return reply;
  }

  // The call's error named: which server, which call, and for a deadline
  // how long it was given.
  absl::Status Check(const grpc::Status& s, const char* call, absl::Duration timeout) const {
    if (s.ok()) return absl::OkStatus();
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return absl::DeadlineExceededError(absl::StrCat(name_, ": ", call, " did not answer within ",
                                                      absl::FormatDuration(timeout), " (timeout_s)"));
    }
    std::string why = s.error_message();
    if (pid_ > 0 && Exited()) why += absl::StrCat("; the server exited; its last output:\n  ", Tail(log_, 20));
    return absl::Status(rpc::FromGrpc(s).code(), absl::StrCat(name_, ": ", call, " failed: ", why));
  }

  bool Exited() const {
    if (pid_ <= 0) return false;
    std::lock_guard<std::mutex> lock(mu_);
    if (!exit_.empty()) return true;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
    exit_ = WIFEXITED(status) ? absl::StrCat("exit code ", WEXITSTATUS(status))
                              : absl::StrCat("signal ", WTERMSIG(status));
    return true;
  }

 private:
  explicit Server(const std::string& key) : name_(absl::StrCat("external environment (", key, ")")) {}

  void Connect(const std::string& address) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
    channel_ = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    stub_ = pb::EnvironmentService::NewStub(channel_);
  }

  absl::Status Start(const std::string& command, absl::Duration startup_timeout) {
    std::string tmpl = (fs::temp_directory_path() / "roll-env-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      return absl::InternalError(absl::StrCat(name_, ": cannot make a directory for its socket: ",
                                              std::strerror(errno)));
    }
    dir_ = tmpl;
    AtExit().Add(dir_);
    log_ = dir_ / "server.log";
    const std::string address = absl::StrCat("unix:", (dir_ / "env.sock").string());
    common_internal::SpawnOptions spawn;
    spawn.argv = {"/bin/sh", "-c", "exec " + command};
    spawn.env = {{"ROLL_ENV_ADDRESS", address}};
    spawn.log_path = log_.string();
    spawn.truncate_log = true;
    spawn.new_process_group = true;
    spawn.death_signal = SIGTERM;
    auto pid = Forks().Run([&] { return common_internal::SpawnProcess(spawn); });
    if (!pid.ok()) return absl::InternalError(absl::StrCat(name_, ": cannot start: ", pid.status().message()));
    pid_ = *pid;
    AtExit().Add(pid_);
    Connect(address);
    // Ready when the channel connects; a server that exits first fails now,
    // with its output.
    const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(startup_timeout);
    while (true) {
      if (Exited()) {
        return absl::UnavailableError(absl::StrCat(name_, " exited (", exit_, ") before it served ", address,
                                                   "; its output:\n  ", Tail(log_, 20)));
      }
      if (channel_->WaitForConnected(std::chrono::system_clock::now() + std::chrono::milliseconds(100))) break;
      if (std::chrono::steady_clock::now() > deadline) {
        kill(-pid_, SIGKILL);
        return absl::DeadlineExceededError(absl::StrCat(
            name_, " did not serve ", address, " within ", absl::FormatDuration(startup_timeout),
            " (startup_timeout_s); its output:\n  ", Tail(log_, 20)));
      }
    }
    return absl::OkStatus();
  }

  // What this process leaves when it exits normally (AtProcessExit, which
  // the worker runtime runs before its _exit too): the servers it
  // started (their process groups get SIGTERM, then SIGKILL after 2 s) and
  // then their directories (socket and log), so nothing stays behind in the
  // temporary directory.
  class ExitCleanup {
   public:
    void Add(pid_t pid) { Locked([&] { pids_.push_back(pid); }); }
    void Add(const fs::path& dir) { Locked([&] { dirs_.push_back(dir); }); }

   private:
    template <class Fn>
    void Locked(Fn&& fn) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!registered_) {
        AtProcessExit([] { AtExit().Run(); });
        registered_ = true;
      }
      fn();
    }
    void Run() {
      std::lock_guard<std::mutex> lock(mu_);
      for (pid_t p : pids_) kill(-p, SIGTERM);
      for (int i = 0; i < 40; ++i) {
        bool any = false;
        for (pid_t p : pids_) any = any || waitpid(p, nullptr, WNOHANG) == 0;
        if (!any) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      for (pid_t p : pids_) kill(-p, SIGKILL);
      std::error_code ignored;
      for (const fs::path& d : dirs_) fs::remove_all(d, ignored);
    }

    std::mutex mu_;
    bool registered_ = false;
    std::vector<pid_t> pids_;
    std::vector<fs::path> dirs_;
  };
  static ExitCleanup& AtExit() {
    static auto* cleanup = new ExitCleanup();
    return *cleanup;
  }

  std::string name_;
  fs::path dir_, log_;
  pid_t pid_ = -1;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::EnvironmentService::Stub> stub_;
  mutable std::mutex mu_;
  mutable std::string exit_;  // how the started server ended; empty while it runs
  std::map<std::string, pb::DescribeReply> described_;
};

// Episode ids unique across the processes that share a server.
std::string NewEpisodeId() {
  static const std::string prefix = [] {
    std::random_device rd;
    return absl::StrCat(getpid(), "-", absl::Hex(rd(), absl::kZeroPad8), "-");
  }();
  static std::atomic<uint64_t> next{0};
  return absl::StrCat(prefix, next.fetch_add(1));
}

class ExternalEnvironment : public Environment {
 public:
  ExternalEnvironment(std::shared_ptr<Server> server, Options options, pb::DescribeReply described,
                      absl::Duration timeout)
      : server_(std::move(server)), options_(std::move(options)), described_(std::move(described)),
        timeout_(timeout), id_(NewEpisodeId()) {}

  // Closes the episode without waiting for the answer (a hung server costs
  // nothing here).
  ~ExternalEnvironment() override {
    if (!started_) return;
    struct Call {
      std::shared_ptr<Server> server;  // keeps the stub alive until the answer
      grpc::ClientContext ctx;
      pb::CloseRequest req;
      pb::CloseReply reply;
    };
    auto* call = new Call{server_, {}, {}, {}};
    call->req.set_episode_id(id_);
    call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    server_->stub().async()->Close(&call->ctx, &call->req, &call->reply, [call](grpc::Status) { delete call; });
  }

  absl::StatusOr<std::string> Reset(uint64_t seed) override {
    pb::ResetRequest req;
    req.set_episode_id(id_);
    req.set_seed(seed);
    req.mutable_options()->insert(options_.begin(), options_.end());
    pb::ResetReply reply;
    grpc::ClientContext ctx;
    Deadline(&ctx);
    ROLL_RETURN_IF_ERROR(server_->Check(server_->stub().Reset(&ctx, req, &reply), "Reset", timeout_));
    started_ = true;
    done_ = false;
    return reply.observation();
  }

  absl::StatusOr<EnvStep> Step(std::string_view action) override {
    if (!started_) return absl::FailedPreconditionError(absl::StrCat(server_->name(), ": step before reset"));
    if (done_) return absl::FailedPreconditionError(absl::StrCat(server_->name(), ": step after the episode is done"));
    pb::StepRequest req;
    req.set_episode_id(id_);
    req.set_action(std::string(action));
    pb::StepReply reply;
    grpc::ClientContext ctx;
    Deadline(&ctx);
    ROLL_RETURN_IF_ERROR(server_->Check(server_->stub().Step(&ctx, req, &reply), "Step", timeout_));
    EnvStep s;
    s.observation = reply.observation();
    s.reward = reply.reward();
    s.done = reply.done() || reply.truncated();
    s.success = reply.success();
    s.truncated = reply.truncated();
    s.action_valid = !reply.action_invalid();
    done_ = s.done;
    return s;
  }

  std::string Instructions() const override { return described_.instructions(); }
  std::vector<std::string> Actions() const override {
    return {described_.actions().begin(), described_.actions().end()};
  }

 private:
  void Deadline(grpc::ClientContext* ctx) const {
    ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoNanoseconds(timeout_));
  }

  std::shared_ptr<Server> server_;
  Options options_;
  pb::DescribeReply described_;
  absl::Duration timeout_;
  std::string id_;
  bool started_ = false, done_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Environment>> MakeExternal(EnvOptions* o) {
  const std::string address = o->String("address");
  const std::string command = o->String("command");
  ROLL_ASSIGN_OR_RETURN(const double timeout_s, o->Double("timeout_s", 30, 0.001, 86400));
  ROLL_ASSIGN_OR_RETURN(const double startup_s, o->Double("startup_timeout_s", 60, 0.001, 86400));
  if (address.empty() == command.empty()) {
    return absl::InvalidArgumentError(
        "env_options: env_type external needs exactly one of address=HOST:PORT (or unix:PATH) of a running "
        "server and command=... that starts one");
  }
  Options rest = o->TakeRest();
  ROLL_ASSIGN_OR_RETURN(std::shared_ptr<Server> server,
                        Server::Get(address, command, absl::Seconds(startup_s)));
  const absl::Duration timeout = absl::Seconds(timeout_s);
  ROLL_ASSIGN_OR_RETURN(pb::DescribeReply described, server->Describe(rest, timeout));
  return std::unique_ptr<Environment>(
      new ExternalEnvironment(std::move(server), std::move(rest), std::move(described), timeout));
}

}  // namespace roll::envs_internal
