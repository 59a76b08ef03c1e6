#include "rpc/store_service.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "roll/common/status.h"
#include "rpc/rpc_util.h"

namespace roll::rpc {
namespace {

grpc::Status Invalid(const std::string& why) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, absl::StrCat("store: ", why));
}

grpc::Status CheckKey(const std::string& key) {
  return key.empty() ? Invalid("empty key") : grpc::Status::OK;
}

grpc::Status CheckWait(double wait_s) {
  return std::isfinite(wait_s) && wait_s >= 0
             ? grpc::Status::OK
             : Invalid(absl::StrCat("wait_s must be a finite number >= 0, got ", wait_s));
}

grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* ctx, const grpc::Status& status) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

}  // namespace

// ---------------------------------------------------------------------------
// StoreService

StoreService::StoreService(std::string token) : token_(std::move(token)) {
  timer_ = std::thread([this] { TimerLoop(); });
}

StoreService::~StoreService() { Close(); }

void StoreService::Close() {
  std::vector<Finished> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    for (Parked& p : parked_) {
      done.push_back({p.reactor, grpc::Status(grpc::StatusCode::UNAVAILABLE, "store: closed")});
    }
    parked_.clear();
  }
  timer_cv_.notify_all();
  if (timer_.joinable()) timer_.join();
  FinishAll(done);
}

grpc::Status StoreService::Admit(grpc::CallbackServerContext* ctx) const {
  if (!HasToken(ctx, token_)) return TokenRefused();
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "store: closed");
  return grpc::Status::OK;
}

bool StoreService::HasAllLocked(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [&](const std::string& k) { return data_.count(k) > 0; });
}

void StoreService::WakeLocked(std::vector<Finished>* done) {
  auto ready = std::partition(parked_.begin(), parked_.end(), [&](const Parked& p) { return !HasAllLocked(p.keys); });
  for (auto it = ready; it != parked_.end(); ++it) {
    if (it->value != nullptr) {
      it->value->set_found(true);
      it->value->set_value(data_.at(it->keys.front()));
    } else {
      it->present->set_value(true);
    }
    done->push_back({it->reactor, grpc::Status::OK});
  }
  parked_.erase(ready, parked_.end());
}

void StoreService::FinishAll(std::vector<Finished>& done) {
  for (Finished& f : done) f.reactor->Finish(f.status);
  done.clear();
}

grpc::ServerUnaryReactor* StoreService::ParkOrFinish(Parked p, double wait_s) {
  grpc::ServerUnaryReactor* reactor = p.reactor;
  grpc::Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) {
      status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "store: closed");
    } else if (const bool ready = HasAllLocked(p.keys); ready || wait_s <= 0) {
      if (p.value != nullptr) {
        p.value->set_found(ready);
        if (ready) p.value->set_value(data_.at(p.keys.front()));
      } else {
        p.present->set_value(ready);
      }
    } else {
      const auto park = std::min<std::chrono::duration<double>>(std::chrono::duration<double>(wait_s), kStoreMaxPark);
      p.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(park);
      parked_.push_back(std::move(p));
      timer_cv_.notify_all();
      return reactor;
    }
  }
  reactor->Finish(status);
  return reactor;
}

void StoreService::TimerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!closed_) {
    auto next = Clock::time_point::max();
    for (const Parked& p : parked_) next = std::min(next, p.deadline);
    if (next == Clock::time_point::max()) {
      timer_cv_.wait(lock);
    } else {
      timer_cv_.wait_until(lock, next);
    }
    if (closed_) break;
    const auto now = Clock::now();
    std::vector<Finished> done;
    auto expired = std::partition(parked_.begin(), parked_.end(), [&](const Parked& p) { return p.deadline > now; });
    for (auto it = expired; it != parked_.end(); ++it) {
      // Not there yet: the reply says so and the client asks again.
      if (it->value != nullptr) {
        it->value->set_found(false);
      } else {
        it->present->set_value(false);
      }
      done.push_back({it->reactor, grpc::Status::OK});
    }
    parked_.erase(expired, parked_.end());
    if (!done.empty()) {
      lock.unlock();
      FinishAll(done);
      lock.lock();
    }
  }
}

grpc::ServerUnaryReactor* StoreService::Set(grpc::CallbackServerContext* ctx, const rpc::StoreSetRequest* req,
                                            rpc::StoreSetReply*) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return FinishNow(ctx, s);
  if (grpc::Status s = CheckKey(req->key()); !s.ok()) return FinishNow(ctx, s);
  std::vector<Finished> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    data_[req->key()] = req->value();
    WakeLocked(&done);
  }
  FinishAll(done);
  return FinishNow(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* StoreService::CompareSet(grpc::CallbackServerContext* ctx,
                                                   const rpc::StoreCompareSetRequest* req,
                                                   rpc::StoreValueReply* reply) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return FinishNow(ctx, s);
  if (grpc::Status s = CheckKey(req->key()); !s.ok()) return FinishNow(ctx, s);
  std::vector<Finished> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(req->key());
    const bool absent = it == data_.end();
    if ((absent && req->expected().empty()) || (!absent && it->second == req->expected())) {
      data_[req->key()] = req->desired();
      reply->set_value(req->desired());
      WakeLocked(&done);
    } else {
      // Absent with a non-empty expectation: nothing is set.
      reply->set_value(absent ? req->expected() : it->second);
    }
    reply->set_found(true);
  }
  FinishAll(done);
  return FinishNow(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* StoreService::Get(grpc::CallbackServerContext* ctx, const rpc::StoreGetRequest* req,
                                            rpc::StoreValueReply* reply) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return FinishNow(ctx, s);
  if (grpc::Status s = CheckKey(req->key()); !s.ok()) return FinishNow(ctx, s);
  if (grpc::Status s = CheckWait(req->wait_s()); !s.ok()) return FinishNow(ctx, s);
  Parked p;
  p.keys = {req->key()};
  p.reactor = ctx->DefaultReactor();
  p.value = reply;
  return ParkOrFinish(std::move(p), req->wait_s());
}

grpc::ServerUnaryReactor* StoreService::Add(grpc::CallbackServerContext* ctx, const rpc::StoreAddRequest* req,
                                            rpc::StoreCountReply* reply) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return FinishNow(ctx, s);
  if (grpc::Status s = CheckKey(req->key()); !s.ok()) return FinishNow(ctx, s);
  std::vector<Finished> done;
  grpc::Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t value = 0;
    if (auto it = data_.find(req->key()); it != data_.end() && !absl::SimpleAtoi(it->second, &value)) {
      status = Invalid(absl::StrCat("add: key '", req->key(), "' holds a value that is not an integer"));
    } else {
      value += req->delta();
      data_[req->key()] = absl::StrCat(value);
      reply->set_value(value);
      WakeLocked(&done);
    }
  }
  FinishAll(done);
  return FinishNow(ctx, status);
}

grpc::ServerUnaryReactor* StoreService::Wait(grpc::CallbackServerContext* ctx, const rpc::StoreWaitRequest* req,
                                             rpc::StoreBoolReply* reply) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return FinishNow(ctx, s);
  for (const std::string& key : req->keys()) {
    if (grpc::Status s = CheckKey(key); !s.ok()) return FinishNow(ctx, s);
  }
  if (grpc::Status s = CheckWait(req->wait_s()); !s.ok()) return FinishNow(ctx, s);
  Parked p;
  p.keys.assign(req->keys().begin(), req->keys().end());
  p.reactor = ctx->DefaultReactor();
  p.present = reply;
  return ParkOrFinish(std::move(p), req->wait_s());
}

grpc::ServerUnaryReactor* StoreService::Delete(grpc::CallbackServerContext* ctx, const rpc::StoreDeleteRequest* req,
                                               rpc::StoreBoolReply* reply) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return FinishNow(ctx, s);
  if (grpc::Status s = CheckKey(req->key()); !s.ok()) return FinishNow(ctx, s);
  {
    std::lock_guard<std::mutex> lock(mu_);
    reply->set_value(data_.erase(req->key()) > 0);
  }
  return FinishNow(ctx, grpc::Status::OK);
}

grpc::ServerUnaryReactor* StoreService::NumKeys(grpc::CallbackServerContext* ctx, const rpc::StoreNumKeysRequest*,
                                                rpc::StoreCountReply* reply) {
  if (grpc::Status s = Admit(ctx); !s.ok()) return FinishNow(ctx, s);
  {
    std::lock_guard<std::mutex> lock(mu_);
    reply->set_value(static_cast<int64_t>(data_.size()));
  }
  return FinishNow(ctx, grpc::Status::OK);
}

// ---------------------------------------------------------------------------
// RemoteStore

struct RemoteStore::Impl {
  std::string address;
  std::string token;
  std::chrono::milliseconds timeout;
  std::unique_ptr<rpc::Store::Stub> stub;

  absl::Status Failed(const grpc::Status& s, const char* op) const {
    const std::string text = absl::StrCat("store at ", address, ": ", op, ": ", s.error_message());
    switch (s.error_code()) {
      case grpc::StatusCode::UNAVAILABLE:
        return absl::UnavailableError(absl::StrCat(text, " (store unreachable or closed)"));
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        // The store itself did not answer: not a peer that is late.
        return absl::UnavailableError(absl::StrCat(text, " (the store did not answer within its deadline)"));
      default:
        return absl::Status(static_cast<absl::StatusCode>(s.error_code()), text);
    }
  }

  // One call, bounded by the client's timeout plus `park` (how long the
  // server may hold it).
  template <class Req, class Reply>
  absl::Status Call(grpc::Status (rpc::Store::Stub::*method)(grpc::ClientContext*, const Req&, Reply*),
                    const Req& req, Reply* reply, const char* op, double park_s = 0) {
    grpc::ClientContext ctx;
    PrepareContext(&ctx, token, absl::FromChrono(timeout) + absl::Seconds(park_s));
    grpc::Status s = (stub.get()->*method)(&ctx, req, reply);
    return s.ok() ? absl::OkStatus() : Failed(s, op);
  }

  // Long poll: `ask(park_s)` until it reports true or `wait` passed, each
  // ask parked on the server for at most kStoreMaxPark; then
  // DeadlineExceeded "<what>: timed out after N ms".
  absl::Status Poll(std::chrono::milliseconds wait, const std::function<absl::StatusOr<bool>(double)>& ask,
                    const std::string& what) const {
    wait = std::min<std::chrono::milliseconds>(wait, std::chrono::hours(24 * 365));  // no overflow below
    const auto deadline = std::chrono::steady_clock::now() + wait;
    while (true) {
      const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
      ROLL_ASSIGN_OR_RETURN(bool done, ask(std::clamp(left, 0.0, static_cast<double>(kStoreMaxPark.count()))));
      if (done) return absl::OkStatus();
      if (std::chrono::steady_clock::now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("store at ", address, ": ", what, ": timed out after ", wait.count(), " ms"));
      }
    }
  }
};

RemoteStore::RemoteStore(std::string address, std::string token, std::chrono::milliseconds timeout)
    : impl_(new Impl{std::move(address), std::move(token), timeout, nullptr}) {
  impl_->stub = rpc::Store::NewStub(MakeChannel(impl_->address));
}
RemoteStore::~RemoteStore() = default;
RemoteStore::RemoteStore(RemoteStore&&) noexcept = default;
const std::string& RemoteStore::address() const { return impl_->address; }

absl::Status RemoteStore::Set(const std::string& key, const std::string& value) {
  rpc::StoreSetRequest req;
  req.set_key(key);
  req.set_value(value);
  rpc::StoreSetReply reply;
  return impl_->Call(&rpc::Store::Stub::Set, req, &reply, "set");
}

absl::StatusOr<std::string> RemoteStore::CompareSet(const std::string& key, const std::string& expected,
                                                    const std::string& desired) {
  rpc::StoreCompareSetRequest req;
  req.set_key(key);
  req.set_expected(expected);
  req.set_desired(desired);
  rpc::StoreValueReply reply;
  ROLL_RETURN_IF_ERROR(impl_->Call(&rpc::Store::Stub::CompareSet, req, &reply, "compare-set"));
  return reply.value();
}

absl::StatusOr<std::string> RemoteStore::Get(const std::string& key, std::chrono::milliseconds timeout) {
  rpc::StoreGetRequest req;
  req.set_key(key);
  rpc::StoreValueReply reply;
  ROLL_RETURN_IF_ERROR(impl_->Poll(
      timeout,
      [&](double park_s) -> absl::StatusOr<bool> {
        req.set_wait_s(park_s);
        ROLL_RETURN_IF_ERROR(impl_->Call(&rpc::Store::Stub::Get, req, &reply, "get", park_s));
        return reply.found();
      },
      absl::StrCat("get: key '", key, "' did not appear")));
  return reply.value();
}

absl::StatusOr<int64_t> RemoteStore::Add(const std::string& key, int64_t delta) {
  rpc::StoreAddRequest req;
  req.set_key(key);
  req.set_delta(delta);
  rpc::StoreCountReply reply;
  ROLL_RETURN_IF_ERROR(impl_->Call(&rpc::Store::Stub::Add, req, &reply, "add"));
  return reply.value();
}

absl::StatusOr<bool> RemoteStore::Check(const std::vector<std::string>& keys) {
  rpc::StoreWaitRequest req;
  for (const std::string& k : keys) req.add_keys(k);
  rpc::StoreBoolReply reply;
  ROLL_RETURN_IF_ERROR(impl_->Call(&rpc::Store::Stub::Wait, req, &reply, "check"));
  return reply.value();
}

absl::Status RemoteStore::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  rpc::StoreWaitRequest req;
  for (const std::string& k : keys) req.add_keys(k);
  rpc::StoreBoolReply reply;
  const std::vector<std::string> shown(keys.begin(), keys.begin() + std::min<size_t>(keys.size(), 4));
  return impl_->Poll(
      timeout,
      [&](double park_s) -> absl::StatusOr<bool> {
        req.set_wait_s(park_s);
        ROLL_RETURN_IF_ERROR(impl_->Call(&rpc::Store::Stub::Wait, req, &reply, "wait", park_s));
        return reply.value();
      },
      absl::StrCat("wait for ", keys.size(), " key(s) (", absl::StrJoin(shown, ", "), keys.size() > 4 ? ", ..." : "",
                   ")"));
}

absl::StatusOr<bool> RemoteStore::Delete(const std::string& key) {
  rpc::StoreDeleteRequest req;
  req.set_key(key);
  rpc::StoreBoolReply reply;
  ROLL_RETURN_IF_ERROR(impl_->Call(&rpc::Store::Stub::Delete, req, &reply, "delete"));
  return reply.value();
}

absl::StatusOr<int64_t> RemoteStore::NumKeys() {
  rpc::StoreNumKeysRequest req;
  rpc::StoreCountReply reply;
  ROLL_RETURN_IF_ERROR(impl_->Call(&rpc::Store::Stub::NumKeys, req, &reply, "count keys"));
  return reply.value();
}

// ---------------------------------------------------------------------------
// StoreHost

struct StoreHost::Impl {
  int port = 0;
  std::string token;
  // Declared before the server: it must outlive it.
  std::unique_ptr<StoreService> service;
  std::unique_ptr<grpc::Server> server;

  ~Impl() {
    if (service) service->Close();
    if (server) server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  }
};

StoreHost::StoreHost(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreHost::~StoreHost() = default;
int StoreHost::port() const { return impl_->port; }
const std::string& StoreHost::token() const { return impl_->token; }

absl::StatusOr<std::unique_ptr<StoreHost>> StoreHost::Start(const std::string& host, int port, std::string token) {
  auto impl = std::make_unique<Impl>();
  impl->token = token.empty() ? RandomToken() : std::move(token);
  impl->service = std::make_unique<StoreService>(impl->token);
  grpc::ServerBuilder builder;
  ConfigureServerBuilder(&builder);
  builder.AddListeningPort(absl::StrCat(host, ":", port), ServerCredentials(), &impl->port);
  builder.RegisterService(impl->service.get());
  impl->server = builder.BuildAndStart();
  if (!impl->server || impl->port == 0) {
    return absl::UnavailableError(absl::StrCat("store server cannot listen on ", host, ":", port,
                                               " (not an address of this machine, or the port is in use)"));
  }
  return std::unique_ptr<StoreHost>(new StoreHost(std::move(impl)));
}

}  // namespace roll::rpc
