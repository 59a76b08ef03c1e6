#include "roll/strategies/communicator.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <signal.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <csignal>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "roll/common/status.h"
#include "rpc/store_client.h"
#include "strategies/communicator_internal.h"

namespace roll {

std::string_view ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------
// StoreServer

struct StoreServer::Impl {
  std::string host;
  std::unique_ptr<rpc::StoreHost> server;
};

StoreServer::StoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreServer::~StoreServer() = default;
const std::string& StoreServer::host() const { return impl_->host; }
int StoreServer::port() const { return impl_->server->port(); }
const std::string& StoreServer::token() const { return impl_->server->token(); }

absl::StatusOr<std::unique_ptr<StoreServer>> StoreServer::Start(const std::string& host, int port,
                                                                std::string token) {
  if (host.empty()) return absl::InvalidArgumentError("store server: host is empty");
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("store server: port ", port, " is out of range"));
  }
  auto impl = std::make_unique<Impl>();
  impl->host = host;
  ROLL_ASSIGN_OR_RETURN(impl->server, rpc::StoreHost::Start(host, port, std::move(token)));
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl)));
}

// ---------------------------------------------------------------------------
// Blocking collectives: one implementation for every backend.

absl::Status Communicator::AllReduce(at::Tensor& tensor, ReduceOp op,
                                     std::chrono::milliseconds timeout) {
  ROLL_ASSIGN_OR_RETURN(auto work, AllReduceAsync(tensor, op));
  return work->Wait(timeout);
}

absl::Status Communicator::Broadcast(at::Tensor& tensor, int root,
                                     std::chrono::milliseconds timeout) {
  ROLL_ASSIGN_OR_RETURN(auto work, BroadcastAsync(tensor, root));
  return work->Wait(timeout);
}

absl::StatusOr<std::vector<at::Tensor>> Communicator::AllGather(const at::Tensor& input,
                                                                std::chrono::milliseconds timeout) {
  std::vector<at::Tensor> outputs;
  ROLL_ASSIGN_OR_RETURN(auto work, AllGatherAsync(input, &outputs));
  ROLL_RETURN_IF_ERROR(work->Wait(timeout));
  return outputs;
}

absl::Status Communicator::ReduceScatter(const at::Tensor& input, at::Tensor* output,
                                         ReduceOp op, std::chrono::milliseconds timeout) {
  ROLL_ASSIGN_OR_RETURN(auto work, ReduceScatterAsync(input, output, op));
  return work->Wait(timeout);
}

absl::Status Communicator::Barrier(std::chrono::milliseconds timeout) {
  ROLL_ASSIGN_OR_RETURN(auto work, BarrierAsync());
  return work->Wait(timeout);
}

// ---------------------------------------------------------------------------
// Factory

namespace {

absl::Status ValidateOptions(const CommunicatorOptions& o) {
  auto bad = [&](auto&&... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("communicator options for group '", o.group_name, "': ", parts...));
  };
  if (o.backend != "gloo" && o.backend != "nccl") {
    return bad("unknown backend '", o.backend, "' (use \"gloo\" or \"nccl\")");
  }
  if (o.group_name.empty()) return bad("group_name is empty");
  // A '/' would let "a" + "/b/..." alias "a/b" + "/...": keep prefixes disjoint.
  for (char c : o.group_name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') {
      return bad("group_name may only hold letters, digits, '_', '-' and '.'");
    }
  }
  if (o.store_host.empty()) return bad("store_host is empty");
  if (o.store_token.empty()) return bad("store_token is empty (the job token; a StoreServer's token())");
  if (o.store_port <= 0 || o.store_port > 65535) {
    return bad("store_port ", o.store_port, " is out of range 1..65535");
  }
  if (o.world_size < 1) return bad("world_size ", o.world_size, " must be >= 1");
  if (o.rank < 0 || o.rank >= o.world_size) {
    return bad("rank ", o.rank, " is outside [0, ", o.world_size, ")");
  }
  if (o.timeout <= std::chrono::milliseconds(0)) {
    return bad("timeout must be positive, got ", o.timeout.count(), " ms");
  }
  if (o.backend == "gloo" && o.gloo_interface.empty() && o.gloo_hostname.empty()) {
    return bad("gloo needs gloo_interface or gloo_hostname");
  }
  if (o.backend == "nccl" && o.cuda_device < 0) {
    return bad("cuda_device ", o.cuda_device, " is negative");
  }
  return absl::OkStatus();
}

std::string JoinedKey(int rank) { return absl::StrCat("roll/joined/", rank); }

bool ContainsNoCase(std::string_view haystack, std::string_view needle) {
  auto it = std::search(haystack.begin(), haystack.end(), needle.begin(), needle.end(),
                        [](char a, char b) { return std::tolower(a) == std::tolower(b); });
  return it != haystack.end();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicator(
    const CommunicatorOptions& options) {
  ROLL_RETURN_IF_ERROR(ValidateOptions(options));
  // Gloo writes to its peers' sockets without MSG_NOSIGNAL: a dead peer must
  // fail the collective (the error names the group), not raise SIGPIPE.
  static const bool sigpipe_ignored = [] {
    struct sigaction old {};
    if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
    return true;
  }();
  (void)sigpipe_ignored;
  ROLL_ASSIGN_OR_RETURN(auto store, internal::ConnectGroupStore(options));
  ROLL_RETURN_IF_ERROR(internal::JoinGroup(*store, options));
  if (options.backend == "gloo") return internal::CreateGlooCommunicator(options, std::move(store));
#ifdef ROLL_WITH_NCCL
  return internal::CreateNcclCommunicator(options, std::move(store));
#else
  return absl::UnimplementedError(absl::StrCat(internal::GroupLabel(options),
                                               ": backend \"nccl\" needs a build configured with "
                                               "-DROLL_WITH_NCCL=ON"));
#endif
}

namespace internal {

std::string DescribeTensor(const at::Tensor& t) {
  return absl::StrCat(Sv(std::string_view(c10::toString(t.scalar_type()))), "[", t.numel(), "]");
}

std::string GroupLabel(const CommunicatorOptions& o) {
  return absl::StrCat("group '", o.group_name, "' (rank ", o.rank, " of ", o.world_size, ")");
}

absl::Status StatusFromException(std::exception_ptr error, std::string_view context) {
  std::string message;
  try {
    std::rethrow_exception(error);
  } catch (const StoreError& e) {
    return absl::Status(e.status().code(), absl::StrCat(Sv(context), ": ", e.status().message()));
  } catch (const c10::Error& e) {
    message = e.what_without_backtrace();
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "unknown exception";
  }
  // Keep the first line: c10 messages may still carry a source location.
  if (auto nl = message.find('\n'); nl != std::string::npos) message.resize(nl);
  std::string text = absl::StrCat(Sv(context), ": ", message);
  if (ContainsNoCase(message, "timeout") || ContainsNoCase(message, "timed out")) {
    return absl::DeadlineExceededError(text);
  }
  if (ContainsNoCase(message, "connection") || ContainsNoCase(message, "closed by peer") ||
      ContainsNoCase(message, "broken pipe")) {
    return absl::UnavailableError(text);
  }
  return absl::InternalError(text);
}

namespace {

// c10d's view of the control-plane store (what ProcessGroupGloo and the NCCL
// id exchange call). c10d reports failures as exceptions: a failed call
// throws StoreError carrying its Status.
class ControlPlaneStore final : public c10d::Store {
 public:
  ControlPlaneStore(rpc::RemoteStore remote, std::string token, std::chrono::milliseconds timeout)
      : c10d::Store(timeout), token_(std::move(token)), remote_(std::move(remote)) {}

  // LibTorch 2.x's c10d asks a store for a clone of itself (a client of the
  // same store); 1.13 has no such virtual, hence no `override` here.
  c10::intrusive_ptr<c10d::Store> clone() {
    return c10::make_intrusive<ControlPlaneStore>(rpc::RemoteStore(remote_.address(), token_, timeout_), token_,
                                                  timeout_);
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    Throw(remote_.Set(key, Text(value)));
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return Bytes(Value(remote_.CompareSet(key, Text(expected), Text(desired))));
  }
  std::vector<uint8_t> get(const std::string& key) override {
    return Bytes(Value(remote_.Get(key, Bounded(timeout_))));
  }
  int64_t add(const std::string& key, int64_t value) override { return Value(remote_.Add(key, value)); }
  bool deleteKey(const std::string& key) override { return Value(remote_.Delete(key)); }
  bool check(const std::vector<std::string>& keys) override { return Value(remote_.Check(keys)); }
  int64_t getNumKeys() override { return Value(remote_.NumKeys()); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    Throw(remote_.Wait(keys, Bounded(timeout)));
  }

 private:
  static std::string Text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
  static std::vector<uint8_t> Bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
  // c10d's kNoTimeout (0) means no limit; a day stands in for it.
  static std::chrono::milliseconds Bounded(std::chrono::milliseconds t) {
    return t == c10d::Store::kNoTimeout ? std::chrono::hours(24) : t;
  }
  static void Throw(const absl::Status& s) {
    if (!s.ok()) throw StoreError(s);
  }
  template <class T>
  static T Value(absl::StatusOr<T> v) {
    Throw(v.status());
    return *std::move(v);
  }

  std::string token_;
  rpc::RemoteStore remote_;
};

}  // namespace

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectGroupStore(
    const CommunicatorOptions& options) {
  rpc::RemoteStore remote(absl::StrCat(options.store_host, ":", options.store_port), options.store_token,
                          options.timeout);
  // One round trip up front: an unreachable store or a refused token is
  // reported as such, not as a rendezvous that never completes. A failed
  // connection is tried again until the timeout: a first connect to a store
  // that is listening can fail on a loaded machine, and one rank giving up
  // at once leaves every other rank waiting out the timeout for it.
  const auto give_up = std::chrono::steady_clock::now() + options.timeout;
  absl::StatusOr<int64_t> probe = remote.NumKeys();
  while (absl::IsUnavailable(probe.status()) && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    probe = remote.NumKeys();
  }
  if (!probe.ok()) {
    return absl::Status(probe.status().code(), absl::StrCat(GroupLabel(options), ": connecting to the store: ",
                                                            probe.status().message()));
  }
  return c10::intrusive_ptr<c10d::Store>(
      c10::make_intrusive<c10d::PrefixStore>(options.group_name,
                                             c10::make_intrusive<ControlPlaneStore>(std::move(remote), options.store_token,
                                                                                    options.timeout)));
}

absl::Status JoinGroup(c10d::Store& group_store, const CommunicatorOptions& options) {
  const std::string label = GroupLabel(options);
  std::vector<std::string> keys;
  keys.reserve(options.world_size);
  for (int r = 0; r < options.world_size; ++r) keys.push_back(JoinedKey(r));
  try {
    if (group_store.add(JoinedKey(options.rank), 1) > 1) {
      return absl::FailedPreconditionError(
          absl::StrCat(label, ": this rank already joined a group of that name on store ",
                       options.store_host, ":", options.store_port,
                       "; group names must be unique per store"));
    }
    group_store.wait(keys, options.timeout);
    return absl::OkStatus();
  } catch (...) {
    absl::Status cause = StatusFromException(std::current_exception(), label);
    if (!absl::IsDeadlineExceeded(cause)) return cause;
  }
  std::vector<int> missing;
  try {
    for (int r = 0; r < options.world_size; ++r) {
      if (!group_store.check({JoinedKey(r)})) missing.push_back(r);
    }
  } catch (...) {
    missing.clear();
  }
  std::string who = missing.empty() ? "some ranks"
                                    : absl::StrCat("rank(s) ", absl::StrJoin(missing, ", "));
  return absl::DeadlineExceededError(absl::StrCat(label, ": ", who, " of world_size ",
                                                  options.world_size, " did not join within ",
                                                  options.timeout.count(), " ms"));
}

absl::Status BrokenState::Check(std::string_view label) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (cause_.ok()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      Sv(label), ": communicator is broken by an earlier failure (", cause_.message(),
      "); create the group again under a new name"));
}

void BrokenState::Break(const absl::Status& cause) {
  std::lock_guard<std::mutex> lock(mu_);
  if (cause_.ok()) cause_ = cause;
}

absl::Status CheckDenseContiguous(const at::Tensor& tensor, std::string_view what,
                                  std::string_view label) {
  if (!tensor.defined()) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(label), ": ", Sv(what), ": tensor is undefined"));
  }
  if (tensor.layout() != c10::kStrided) {
    return absl::InvalidArgumentError(
        absl::StrCat(Sv(label), ": ", Sv(what), ": tensor must be dense (strided)"));
  }
  if (!tensor.is_contiguous()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(label), ": ", Sv(what), ": tensor must be contiguous (call .contiguous() first)"));
  }
  return absl::OkStatus();
}

absl::Status CheckReduceScatterShapes(const at::Tensor& input, const at::Tensor* output,
                                      int world_size, std::string_view label) {
  if (output == nullptr || !output->defined()) {
    return absl::InvalidArgumentError(absl::StrCat(Sv(label), ": reducescatter: no output tensor"));
  }
  if (!input.defined() || input.scalar_type() != output->scalar_type() ||
      input.numel() != world_size * output->numel()) {
    return absl::InvalidArgumentError(absl::StrCat(
        Sv(label), ": reducescatter: input must hold ", world_size, " chunks of the output's ",
        output->numel(), " ", Sv(std::string_view(c10::toString(output->scalar_type()))),
        " elements, got ", input.defined() ? input.numel() : 0, " ",
        input.defined() ? Sv(std::string_view(c10::toString(input.scalar_type()))) : "undefined"));
  }
  return absl::OkStatus();
}

}  // namespace internal
}  // namespace roll
