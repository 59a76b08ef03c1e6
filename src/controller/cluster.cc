#include <signal.h>

#include <chrono>

#include <spdlog/spdlog.h>

#include "controller/cluster_impl.h"
#include "rpc/rpc_util.h"

namespace roll {

// ---------------------------------------------------------------- CallHandle

struct CallHandle::State {
  MethodSpec method;
  std::string method_name;  // owns the characters method.name points to
  std::vector<int> ranks;

  std::mutex mu;
  std::condition_variable cv;
  int remaining = 0;
  std::vector<absl::Status> status;  // per index into ranks
  std::vector<Batch> replies;
  absl::Status first_error;

  bool DoneLocked() const { return remaining == 0 || !first_error.ok(); }
  void Complete(size_t index, absl::Status s, Batch reply) {
    bool wake;
    {
      std::lock_guard<std::mutex> lock(mu);
      const bool was_done = DoneLocked();
      status[index] = s;
      if (s.ok()) {
        replies[index] = std::move(reply);
      } else if (first_error.ok()) {
        first_error = s;
      }
      --remaining;
      // Wake waiters only when their condition may have changed: the call
      // became done (Wait) or the last rank finished (WaitAll).
      wake = (!was_done && DoneLocked()) || remaining == 0;
    }
    if (wake) cv.notify_all();
  }
};

absl::Status CallHandle::Wait(absl::Duration timeout) const { return WaitFor(timeout, /*all=*/false); }
absl::Status CallHandle::WaitAll(absl::Duration timeout) const { return WaitFor(timeout, /*all=*/true); }

absl::Status CallHandle::WaitFor(absl::Duration timeout, bool all) const {
  if (!state_) return absl::FailedPreconditionError("empty CallHandle");
  std::unique_lock<std::mutex> lock(state_->mu);
  auto done = [&] { return all ? state_->remaining <= 0 : state_->DoneLocked(); };
  if (timeout == absl::InfiniteDuration()) {
    state_->cv.wait(lock, done);
  } else if (!state_->cv.wait_for(lock, absl::ToChronoMicroseconds(timeout), done)) {
    return absl::DeadlineExceededError(absl::StrCat("method '", state_->method_name, "' still running after ",
                                                    absl::FormatDuration(timeout)));
  }
  return state_->first_error;
}

bool CallHandle::Done() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->DoneLocked();
}

std::vector<absl::Status> CallHandle::RankStatus() const {
  if (!state_) return {};
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->status;
}

std::vector<int> CallHandle::ranks() const { return state_ ? state_->ranks : std::vector<int>{}; }

absl::StatusOr<std::vector<Batch>> CallHandle::Replies() const {
  ROLL_RETURN_IF_ERROR(Wait());
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->replies;
}

std::vector<Batch> CallHandle::EachReply() const {
  if (!state_) return {};
  WaitAll().IgnoreError();
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->replies;
}

absl::StatusOr<Batch> CallHandle::Get() const {
  ROLL_ASSIGN_OR_RETURN(std::vector<Batch> replies, Replies());
  return CollectReplies(state_->method, replies);
}

namespace {

// A call's state, owning a copy of the method name (callers' MethodSpecs may
// point at temporary strings).
std::shared_ptr<CallHandle::State> NewCallState(const MethodSpec& method) {
  auto state = std::make_shared<CallHandle::State>();
  state->method_name = std::string(method.name);
  state->method = method;
  state->method.name = state->method_name;
  return state;
}

CallHandle FailedHandle(const MethodSpec& method, absl::Status error) {
  auto state = NewCallState(method);
  state->first_error = std::move(error);
  return CallHandle(state);
}

}  // namespace

// ---------------------------------------------------------------- Impl

ClusterBase::Impl::Impl(ClusterSettings settings, Launcher* launcher, std::vector<WorkerInfo> infos)
    : s_(std::move(settings)), launcher_(launcher), workers_(infos.size()) {
  for (size_t i = 0; i < infos.size(); ++i) {
    workers_[i].info = std::move(infos[i]);
    workers_[i].stub = rpc::Worker::NewStub(rpc::MakeChannel(workers_[i].info.address));
    workers_[i].last_healthy = absl::Now();
  }
}

ClusterBase::Impl::~Impl() { Shutdown().IgnoreError(); }

std::vector<WorkerInfo> ClusterBase::Impl::workers() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WorkerInfo> out;
  for (const auto& w : workers_) out.push_back(w.info);
  return out;
}

std::string ClusterBase::Impl::Describe(int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  return DescribeLocked(rank);
}

std::string ClusterBase::Impl::DescribeLocked(int rank) const {
  const WorkerInfo& w = workers_[rank].info;
  if (w.node == 0) return absl::StrCat("cluster '", s_.name, "' rank ", rank, " (pid ", w.pid, ", ", w.address, ")");
  return absl::StrCat("cluster '", s_.name, "' rank ", rank, " (node ", w.node, " pid ", PidOnNode(w.pid), ", ",
                      w.address, ")");
}

absl::Status ClusterBase::Impl::AnnotateFailure(int rank, const std::string& method, const grpc::Status& s,
                                                pid_t pid) {
  std::string detail = s.error_message();
  std::string death;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (workers_[rank].info.pid != pid) {
      // The call went to a process that has been replaced since: name that one.
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          absl::StrCat("cluster '", s_.name, "' rank ", rank, " (pid ", pid,
                                       ", replaced since): method '", method, "': ", detail));
    }
    death = workers_[rank].info.death_reason;
  }
  const bool transport = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                         s.error_code() == grpc::StatusCode::CANCELLED;
  if (death.empty() && transport) {
    // The connection broke: if the process is gone, say how it ended.
    if (launcher_->WaitExit(pid, 0.5)) {
      auto how = launcher_->ExitStatus(pid);
      MarkDead(rank, absl::StrCat("worker process ", how.value_or("ended")), pid);
      std::lock_guard<std::mutex> lock(mu_);
      death = workers_[rank].info.death_reason;
    }
  }
  if (!death.empty()) absl::StrAppend(&detail, " [", death, "]");
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(Describe(rank), ": method '", method, "': ", detail));
}

CallHandle ClusterBase::Impl::Start(const MethodSpec& method, std::vector<Batch> inputs, absl::Duration timeout) {
  auto state = NewCallState(method);
  state->ranks = ExecutingRanks(method.execute, world_size());
  if (inputs.size() != state->ranks.size()) {
    return FailedHandle(method, absl::InvalidArgumentError(absl::StrCat(
                                    "cluster '", s_.name, "': method '", Sv(method.name), "' needs ",
                                    state->ranks.size(), " inputs (one per executing rank), got ",
                                    inputs.size())));
  }
  const size_t n = state->ranks.size();
  state->remaining = static_cast<int>(n);
  state->status.assign(n, absl::UnavailableError("pending"));
  state->replies.resize(n);
  if (timeout == absl::ZeroDuration()) timeout = s_.call_timeout;

  // One-to-all sends the same bytes everywhere: encode once and share the
  // request (gRPC only reads it).
  const bool shared = method.dispatch == Dispatch::kOneToAll;
  std::vector<std::shared_ptr<rpc::CallRequest>> requests(n);
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && shared) {
      requests[i] = requests[0];
      continue;
    }
    requests[i] = std::make_shared<rpc::CallRequest>();
    requests[i]->set_method(state->method_name);
    EncodeBatchTo(inputs[i], requests[i]->mutable_batch());
  }

  for (size_t i = 0; i < n; ++i) {
    const int rank = state->ranks[i];
    Worker& w = workers_[rank];
    struct Rpc {
      grpc::ClientContext ctx;
      std::shared_ptr<rpc::CallRequest> request;
      rpc::CallReply reply;
    };
    auto call = std::make_shared<Rpc>();
    call->request = requests[i];
    rpc::PrepareContext(&call->ctx, s_.token, timeout);
    std::string dead_reason;
    rpc::Worker::Stub* stub = nullptr;  // read under the lock: a replaced worker gets a new one
    pid_t pid = 0;                       // the process this call goes to
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (w.info.alive) {
        w.in_flight.insert(&call->ctx);
        stub = w.stub.get();
        pid = w.info.pid;
      } else {
        dead_reason = w.info.death_reason.empty() ? "dead" : w.info.death_reason;
      }
    }
    if (!dead_reason.empty()) {
      state->Complete(i, absl::UnavailableError(absl::StrCat(Describe(rank), ": method '", Sv(method.name),
                                                             "': worker is not alive [", dead_reason, "]")),
                      Batch());
      continue;
    }
    stub->async()->Call(&call->ctx, call->request.get(), &call->reply,
                          [this, state, call, i, rank, pid](grpc::Status s) {
                            {
                              std::lock_guard<std::mutex> lock(mu_);
                              workers_[rank].in_flight.erase(&call->ctx);
                            }
                            if (!s.ok()) {
                              state->Complete(i, AnnotateFailure(rank, state->method_name, s, pid), Batch());
                              return;
                            }
                            auto reply = DecodeBatch(call->reply.batch());
                            if (!reply.ok()) {
                              state->Complete(i, Annotate(reply.status(), Describe(rank)), Batch());
                              return;
                            }
                            state->Complete(i, absl::OkStatus(), std::move(reply).value());
                          });
  }
  return CallHandle(state);
}

absl::Status ClusterBase::Impl::Initialize(const std::vector<int>& ranks, const std::string& config_yaml,
                                          const std::vector<std::string>& extra_roles, absl::Duration timeout) {
  rpc::InitializeRequest req;
  req.set_config_yaml(config_yaml);
  for (const auto& r : extra_roles) req.add_extra_roles(r);
  const size_t n = ranks.size();
  std::vector<grpc::ClientContext> ctx(n);
  std::vector<rpc::InitializeReply> reply(n);
  std::vector<grpc::Status> status(n);
  std::vector<pid_t> pids(n);
  std::mutex m;
  std::condition_variable cv;
  size_t remaining = n;
  for (size_t i = 0; i < n; ++i) {
    rpc::PrepareContext(&ctx[i], s_.token, timeout);
    rpc::Worker::Stub* stub;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stub = workers_[ranks[i]].stub.get();
      pids[i] = workers_[ranks[i]].info.pid;
    }
    stub->async()->Initialize(&ctx[i], &req, &reply[i], [&, i](grpc::Status s) {
      std::lock_guard<std::mutex> lock(m);
      status[i] = std::move(s);
      if (--remaining == 0) cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(m);
  cv.wait(lock, [&] { return remaining == 0; });
  for (size_t i = 0; i < n; ++i) {
    if (!status[i].ok()) {
      lock.unlock();
      return AnnotateFailure(ranks[i], "initialize", status[i], pids[i]);
    }
  }
  return absl::OkStatus();
}

void ClusterBase::Impl::ReplaceWorker(WorkerInfo info) {
  auto stub = rpc::Worker::NewStub(rpc::MakeChannel(info.address));
  std::lock_guard<std::mutex> lock(mu_);
  Worker& w = workers_[info.rank];
  retired_stubs_.push_back(std::move(w.stub));
  w.stub = std::move(stub);
  w.info = std::move(info);
  w.info.alive = true;
  w.info.death_reason.clear();
  w.last_healthy = absl::Now();
}

void ClusterBase::Impl::StartMonitor() {
  monitor_ = std::thread([this] { MonitorLoop(); });
}

void ClusterBase::Impl::MonitorLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    const absl::Time now = absl::Now();
    for (int r = 0; r < world_size(); ++r) {
      Worker& w = workers_[r];
      if (!w.info.alive) continue;
      // A replaced worker has a new pid: what is learned about the old one
      // must not mark the new one dead.
      const pid_t pid = w.info.pid;
      lock.unlock();
      auto exited = launcher_->ExitStatus(pid);
      lock.lock();
      if (exited) {
        lock.unlock();
        MarkDead(r, absl::StrCat("worker process ", *exited), pid);
        lock.lock();
        continue;
      }
      if (now - w.last_healthy > s_.worker_timeout) {
        const std::string reason = absl::StrCat("no health reply for ", absl::FormatDuration(now - w.last_healthy),
                                                " (runtime.worker_timeout_s); worker killed");
        lock.unlock();
        MarkDead(r, reason, pid);
        launcher_->Signal(pid, SIGKILL);
        lock.lock();
        continue;
      }
      if (w.health_pending) continue;
      w.health_pending = true;
      struct Probe {
        grpc::ClientContext ctx;
        rpc::HealthRequest req;
        rpc::HealthReply reply;
      };
      auto probe = std::make_shared<Probe>();
      rpc::PrepareContext(&probe->ctx, s_.token, s_.worker_timeout);
      w.in_flight.insert(&probe->ctx);
      w.stub->async()->Health(&probe->ctx, &probe->req, &probe->reply, [this, r, probe](grpc::Status s) {
        std::lock_guard<std::mutex> l(mu_);
        workers_[r].in_flight.erase(&probe->ctx);
        workers_[r].health_pending = false;
        if (s.ok()) workers_[r].last_healthy = absl::Now();
      });
    }
    stop_cv_.wait_for(lock, absl::ToChronoMicroseconds(s_.health_interval), [this] { return stopping_; });
  }
}

void ClusterBase::Impl::MarkDead(int rank, const std::string& reason, pid_t pid) {
  std::lock_guard<std::mutex> lock(mu_);
  Worker& w = workers_[rank];
  if (!w.info.alive || (pid != 0 && w.info.pid != pid)) return;
  w.info.alive = false;
  w.info.death_reason = reason;
  if (!stopping_) spdlog::error("{}: {}", DescribeLocked(rank), reason);
  for (grpc::ClientContext* ctx : w.in_flight) ctx->TryCancel();
}

absl::Status ClusterBase::Impl::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return absl::OkStatus();
    shut_down_ = true;
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (monitor_.joinable()) monitor_.join();

  // Ask politely, in parallel; then kill whoever is still there.
  struct Bye {
    grpc::ClientContext ctx;
    rpc::ShutdownRequest req;
    rpc::ShutdownReply reply;
  };
  std::vector<std::shared_ptr<Bye>> byes;
  for (auto& w : workers_) {
    if (launcher_->ExitStatus(w.info.pid)) continue;
    auto bye = std::make_shared<Bye>();
    rpc::PrepareContext(&bye->ctx, s_.token, absl::Seconds(2));
    w.stub->async()->Shutdown(&bye->ctx, &bye->req, &bye->reply, [bye](grpc::Status) {});
    byes.push_back(bye);
  }
  std::string stragglers;
  for (int r = 0; r < world_size(); ++r) {
    const pid_t pid = workers_[r].info.pid;
    if (!launcher_->WaitExit(pid, 3.0)) {
      absl::StrAppend(&stragglers, stragglers.empty() ? "" : ", ", r);
      launcher_->Signal(pid, SIGKILL);
      launcher_->WaitExit(pid, 5.0);
    }
    MarkDead(r, "shut down");
  }
  // Cancel whatever is still pending so no callback outlives this object.
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : workers_) {
      for (grpc::ClientContext* ctx : w.in_flight) ctx->TryCancel();
    }
  }
  for (int spin = 0; spin < 500; ++spin) {
    bool idle = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& w : workers_) idle = idle && w.in_flight.empty();
    }
    if (idle) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (!stragglers.empty()) {
    return absl::DeadlineExceededError(
        absl::StrCat("cluster '", s_.name, "': ranks ", stragglers, " did not exit on shutdown and were killed"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- ClusterBase

ClusterBase::ClusterBase(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ClusterBase::ClusterBase(ClusterBase&& other) noexcept = default;
ClusterBase::~ClusterBase() = default;

const std::string& ClusterBase::name() const { return impl_->settings().name; }
const std::string& ClusterBase::worker_type() const { return impl_->settings().worker_type; }
int ClusterBase::world_size() const { return impl_->world_size(); }
std::vector<WorkerInfo> ClusterBase::workers() const { return impl_->workers(); }

CallHandle ClusterBase::Call(const MethodSpec& method, const Batch& input, const CallOptions& options) {
  auto inputs = SplitForDispatch(method, input, world_size());
  if (!inputs.ok()) return FailedHandle(method, Annotate(inputs.status(), absl::StrCat("cluster '", name(), "'")));
  return impl_->Start(method, *std::move(inputs), options.timeout);
}

CallHandle ClusterBase::CallEach(const MethodSpec& method, std::vector<Batch> inputs, const CallOptions& options) {
  return impl_->Start(method, std::move(inputs), options.timeout);
}

absl::Status ClusterBase::Shutdown() { return impl_->Shutdown(); }

bool LostAWorker(const ClusterBase& cluster) {
  for (const WorkerInfo& w : cluster.workers()) {
    if (!w.alive) return true;
  }
  return false;
}

CallOutcome WaitOutcome(const CallHandle& call, const ClusterBase& cluster, const std::vector<bool>& counted) {
  CallOutcome out;
  const absl::Status all = call.WaitAll();
  const std::vector<absl::Status> status = call.RankStatus();
  const std::vector<int> ranks = call.ranks();
  if (ranks.empty()) {  // failed before any RPC (bad inputs)
    out.status = all;
    return out;
  }
  const std::vector<WorkerInfo> workers = cluster.workers();
  out.ok.assign(status.size(), false);
  absl::Status live, dead;
  for (size_t i = 0; i < status.size(); ++i) {
    if (status[i].ok()) {
      out.ok[i] = true;
    } else if (!counted.empty() && !counted[ranks[i]]) {
      continue;
    } else if (workers[ranks[i]].alive) {
      if (live.ok()) live = status[i];
    } else if (dead.ok()) {
      dead = status[i];
    }
  }
  out.status = live.ok() ? dead : live;
  out.only_dead = live.ok() && !dead.ok();
  return out;
}

}  // namespace roll
