#include "workers/rl/rl_common.h"

#include <torch/torch.h>

#include <fcntl.h>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include <spdlog/spdlog.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "roll/models/tokenizer.h"
#include "roll/models/transformer.h"
#include "roll/strategies/communicator.h"
#include "roll/strategies/tensor_parallel.h"
#include "roll/strategies/train_strategy.h"

namespace roll::rl_internal {

c10::ScalarType ToScalarType(DType dtype) {
  switch (dtype) {
    case DType::kBf16:
      return at::kBFloat16;
    case DType::kFp16:
      return at::kHalf;
    case DType::kFp32:
      break;
  }
  return at::kFloat;
}

absl::StatusOr<std::unique_ptr<CausalLM>> LoadRoleModel(const WorkerConfig& role, const std::string& device_type,
                                                        bool trainable, bool value_head, uint64_t seed) {
  const std::string& dir = role.model_args.model_name_or_path;
  if (dir.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(role.name, ".model_args.model_name_or_path: a model directory is required"));
  }
  ModelOptions o;
  if (device_type == "cuda") {
    // The worker sees only its own devices (CUDA_VISIBLE_DEVICES); the
    // model goes on the first of them.
    if (!torch::cuda::is_available()) {
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      return absl::FailedPreconditionError(absl::StrCat(
          role.name, ": device_type is cuda, but this process sees no CUDA device (CUDA_VISIBLE_DEVICES=",
          visible ? visible : "unset", "; this LibTorch is ", at::hasCUDA() ? "built with CUDA" : "built without CUDA",
          ")"));
    }
    o.device = c10::Device(c10::DeviceType::CUDA, 0);
  }
  o.dtype = ToScalarType(role.model_args.dtype);
  o.fp32_logits = role.model_args.fp32_lm_head;
  o.requires_grad = trainable;
  o.value_head = value_head;
  o.lm_head = !value_head;
  o.seed = seed;
  auto model = CausalLM::FromPretrained(dir, o);
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat(role.name, ".model_args.model_name_or_path: ",
                                     model.status().message()));
  }
  // One contiguous buffer: the model update then sends it in one transfer.
  FlattenParameters((*model)->Parameters());
  return std::move(*model);
}

void FlattenParameters(const std::vector<at::Tensor>& params) {
  if (params.empty()) return;
  const c10::Device device = params.front().device();
  std::vector<at::Tensor> unique;
  std::vector<int64_t> offsets;  // in bytes
  std::set<const void*> seen;    // a tied weight appears once
  int64_t total = 0;
  for (const at::Tensor& p : params) {
    if (p.device() != device || !p.is_contiguous()) return;
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    // Each parameter starts at a multiple of its element size; between
    // parameters of one dtype (and after a wider one) there is no gap.
    const int64_t size = static_cast<int64_t>(p.element_size());
    total = (total + size - 1) / size * size;
    unique.push_back(p);
    offsets.push_back(total);
    total += static_cast<int64_t>(p.nbytes());
  }
  // Already laid out so (a model allocates its parameters this way): done.
  const c10::StorageImpl* storage = unique.front().storage().unsafeGetStorageImpl();
  bool laid_out = unique.front().storage().nbytes() == static_cast<size_t>(total);
  for (size_t i = 0; i < unique.size() && laid_out; ++i) {
    const at::Tensor& p = unique[i];
    laid_out = p.storage().unsafeGetStorageImpl() == storage &&
               p.storage_offset() * static_cast<int64_t>(p.element_size()) == offsets[i];
  }
  if (laid_out) return;
  torch::NoGradGuard no_grad;
  // One byte buffer; each parameter a view of its own dtype into it.
  at::Tensor flat = at::empty({total}, at::TensorOptions().dtype(at::kByte).device(device));
  for (size_t i = 0; i < unique.size(); ++i) {
    const at::Tensor& p = unique[i];
    at::Tensor part = flat.narrow(0, offsets[i], static_cast<int64_t>(p.nbytes()))
                          .view(p.scalar_type())
                          .view(p.sizes());
    part.copy_(p);
    // Same tensor object (the optimizer and any tie still refer to it),
    // now stored inside `flat`.
    p.set_data(part);
  }
}

absl::StatusOr<std::optional<Tokenizer>> LoadDirTokenizer(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "tokenizer.json").string();
  if (!std::filesystem::exists(path)) return std::optional<Tokenizer>();
  ROLL_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::FromFile(path));
  return std::optional<Tokenizer>(std::move(tok));
}

absl::StatusOr<int64_t> MetaInt(const Batch& b, const std::string& key,
                                std::optional<int64_t> fallback) {
  auto it = b.meta().find(key);
  if (it == b.meta().end()) {
    if (fallback) return *fallback;
    return absl::InvalidArgumentError(absl::StrCat("meta '", key, "' is required"));
  }
  int64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("meta '", key, "': expected an integer, got '", it->second, "'"));
  }
  return v;
}

absl::StatusOr<double> MetaDouble(const Batch& b, const std::string& key,
                                  std::optional<double> fallback) {
  auto it = b.meta().find(key);
  if (it == b.meta().end()) {
    if (fallback) return *fallback;
    return absl::InvalidArgumentError(absl::StrCat("meta '", key, "' is required"));
  }
  double v = 0;
  if (!absl::SimpleAtod(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("meta '", key, "': expected a number, got '", it->second, "'"));
  }
  return v;
}

absl::StatusOr<CommunicatorOptions> ControllerStoreOptions(const WorkerContext& ctx, int64_t timeout_s) {
  // The controller hosts the rendezvous store at its own address.
  const size_t colon = ctx.controller.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(ctx.controller.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("collectives: the controller address '", ctx.controller, "' is not host:port"));
  }
  CommunicatorOptions base;
  base.store_host = ctx.controller.substr(0, colon);
  base.store_port = port;
  base.store_token = ctx.token;
  base.timeout = std::chrono::seconds(timeout_s);
  // Peers reach this rank at its node's address.
  base.gloo_hostname = ctx.host;
  return base;
}

absl::StatusOr<std::unique_ptr<TensorParallelGroup>> MakeTensorParallelGroup(const WorkerContext& ctx,
                                                                             const CausalLM& whole, int tp) {
  ROLL_ASSIGN_OR_RETURN(CommunicatorOptions base, ControllerStoreOptions(ctx, 120));
  base.gloo_hostname = "127.0.0.1";  // the group lives in this process
  base.group_name = absl::StrCat(ctx.cluster, ".", ctx.rank, ".tp.", getpid());
  return TensorParallelGroup::Create(whole, tp, base);
}

absl::StatusOr<std::unique_ptr<TrainStrategy>> CreateTrainStrategy(const WorkerContext& ctx,
                                                                   std::unique_ptr<CausalLM> model,
                                                                   int64_t total_updates, Communicator* dp) {
  const WorkerConfig& role = *ctx.role;
  TrainStrategyOptions o = TrainStrategyOptions::FromTrainingArgs(role.training_args, total_updates);
  o.fully_sharded = role.strategy_args.strategy_name == kFullyShardedStrategyName;
  std::unique_ptr<TensorParallelGroup> slices;
  if (const int tp = role.strategy_args.strategy_config.tensor_model_parallel_size; tp > 1) {
    ROLL_ASSIGN_OR_RETURN(slices, MakeTensorParallelGroup(ctx, *model, tp));
    spdlog::info("{} trains {} tensor-parallel slices of the model", ctx.cluster, tp);
  }
  return TrainStrategy::Create(std::move(model), o, dp, std::move(slices));
}

absl::Status JoinCollectives(const Batch& in, const WorkerContext& ctx, Collectives* out) {
  const int rank = ctx.rank;
  const int world_size = ctx.world_size;
  ROLL_ASSIGN_OR_RETURN(int64_t timeout_s, MetaInt(in, "timeout_s", 120));
  ROLL_ASSIGN_OR_RETURN(CommunicatorOptions base, ControllerStoreOptions(ctx, timeout_s));
  const std::string group = in.MetaOr("group", "");
  if (!group.empty() && world_size > 1) {
    CommunicatorOptions o = base;
    o.group_name = group;
    o.rank = rank;
    o.world_size = world_size;
    ROLL_ASSIGN_OR_RETURN(out->dp, CreateCommunicator(o));
  }
  ROLL_ASSIGN_OR_RETURN(int64_t sync_rank, MetaInt(in, "sync_rank", -1));
  ROLL_ASSIGN_OR_RETURN(int64_t sync_world, MetaInt(in, "sync_world", 0));
  out->sync_rank = static_cast<int>(sync_rank);
  // A generator of a fully sharded trainer joins one group per trainer
  // rank ("<sync_group>.shard<r>"); everyone else joins one group.
  ROLL_ASSIGN_OR_RETURN(int64_t sync_shards, MetaInt(in, "sync_shards", 0));
  out->sync_shards.clear();
  if (sync_rank >= 0 && sync_world > 1) {
    CommunicatorOptions o = base;
    o.group_name = in.MetaOr("sync_group", "weight_sync");
    o.rank = static_cast<int>(sync_rank);
    o.world_size = static_cast<int>(sync_world);
    if (sync_shards > 0) {
      for (int64_t r = 0; r < sync_shards; ++r) {
        CommunicatorOptions shard = o;
        shard.group_name = absl::StrCat(o.group_name, ".shard", r);
        ROLL_ASSIGN_OR_RETURN(auto comm, CreateCommunicator(shard));
        out->sync_shards.push_back(std::move(comm));
      }
    } else {
      ROLL_ASSIGN_OR_RETURN(out->sync, CreateCommunicator(o));
    }
  }
  return absl::OkStatus();
}

namespace {

// Header of a SharedWeights region; the data starts at kHeaderBytes.
struct SharedHeader {
  std::atomic<int64_t> version;  // -1: being written
  int64_t bytes;
};
constexpr int64_t kHeaderBytes = 64;

int64_t ParamBytes(const std::vector<at::Tensor>& params) {
  int64_t n = 0;
  for (const auto& p : params) n += p.numel() * static_cast<int64_t>(p.element_size());
  return n;
}

// The parameters' bytes and the region's data, side by side as uint8
// tensors; `to_region` picks the direction of the copy. Parameters on a GPU
// are copied to and from host memory (copy_ across devices).
absl::Status CopyParams(const std::vector<at::Tensor>& params, uint8_t* data, int64_t bytes, bool to_region) {
  torch::NoGradGuard no_grad;
  const int64_t need = ParamBytes(params);
  if (need != bytes) {
    return absl::InvalidArgumentError(absl::StrCat("shared weights: the parameters hold ", need,
                                                   " bytes, the shared region ", bytes));
  }
  int64_t off = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    const at::Tensor& p = params[k];
    if (!p.is_contiguous()) {
      return absl::InvalidArgumentError(absl::StrCat("shared weights: parameter ", k, " is not contiguous"));
    }
    const int64_t n = p.numel() * static_cast<int64_t>(p.element_size());
    if (n == 0) continue;
    at::Tensor mine = p.detach().view({-1}).view(at::kByte);
    at::Tensor region = at::from_blob(data + off, {n}, at::kByte);
    if (to_region) {
      region.copy_(mine);
    } else {
      mine.copy_(region);
    }
    off += n;
  }
  return absl::OkStatus();
}

}  // namespace

SharedWeights::SharedWeights(int fd, void* base, int64_t bytes, std::string path)
    : fd_(fd), base_(base), bytes_(bytes), path_(std::move(path)) {}

SharedWeights::~SharedWeights() {
  munmap(base_, static_cast<size_t>(kHeaderBytes + bytes_));
  close(fd_);
}

absl::StatusOr<std::unique_ptr<SharedWeights>> SharedWeights::Create(const std::vector<at::Tensor>& params) {
  const int64_t bytes = ParamBytes(params);
  const int fd = memfd_create("roll-weights", MFD_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("shared weights: memfd_create: ", strerror(errno)));
  if (ftruncate(fd, kHeaderBytes + bytes) != 0) {
    const int err = errno;
    close(fd);
    return absl::ResourceExhaustedError(
        absl::StrCat("shared weights: cannot size a region of ", kHeaderBytes + bytes, " bytes: ", strerror(err)));
  }
  void* base = mmap(nullptr, static_cast<size_t>(kHeaderBytes + bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("shared weights: mmap: ", strerror(err)));
  }
  auto* h = new (base) SharedHeader;
  h->version.store(-1, std::memory_order_relaxed);
  h->bytes = bytes;
  return std::unique_ptr<SharedWeights>(
      new SharedWeights(fd, base, bytes, absl::StrCat("/proc/", getpid(), "/fd/", fd)));
}

absl::StatusOr<std::unique_ptr<SharedWeights>> SharedWeights::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("shared weights: cannot open the sender's region ", path, ": ",
                                               strerror(errno), " (is the sender on this node?)"));
  }
  const off_t size = lseek(fd, 0, SEEK_END);
  if (size < kHeaderBytes) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("shared weights: ", path, " is not a weight region"));
  }
  void* base = mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("shared weights: mmap ", path, ": ", strerror(err)));
  }
  const int64_t bytes = static_cast<SharedHeader*>(base)->bytes;
  if (bytes != size - kHeaderBytes) {
    munmap(base, static_cast<size_t>(size));
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("shared weights: ", path, " has a corrupt header"));
  }
  return std::unique_ptr<SharedWeights>(new SharedWeights(fd, base, bytes, path));
}

absl::Status SharedWeights::Publish(const std::vector<at::Tensor>& params, int64_t version) {
  auto* h = static_cast<SharedHeader*>(base_);
  h->version.store(-1, std::memory_order_release);
  ROLL_RETURN_IF_ERROR(CopyParams(params, static_cast<uint8_t*>(base_) + kHeaderBytes, bytes_, true));
  h->version.store(version, std::memory_order_release);
  return absl::OkStatus();
}

absl::Status SharedWeights::Read(const std::vector<at::Tensor>& params, int64_t version, absl::Duration timeout) {
  auto* h = static_cast<SharedHeader*>(base_);
  const absl::Time deadline = absl::Now() + timeout;
  auto pause = std::chrono::microseconds(20);
  while (h->version.load(std::memory_order_acquire) != version) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("shared weights: version ", version, " was not published within ",
                                                      absl::FormatDuration(timeout), " (", path_, ")"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
  return CopyParams(params, static_cast<uint8_t*>(base_) + kHeaderBytes, bytes_, false);
}

ParameterBroadcaster::ParameterBroadcaster(int64_t buffer_bytes)
    : chunk_bytes_(std::max<int64_t>(4096, buffer_bytes / kSlots) / 64 * 64) {}

absl::Status ParameterBroadcaster::Run(Communicator& comm, const std::vector<at::Tensor>& params,
                                       bool merge_adjacent) {
  torch::NoGradGuard no_grad;
  const bool sender = comm.rank() == 0;
  // One transfer is either a large parameter's own bytes (sent from and
  // received into the parameter: no copy) or a run of consecutive small
  // parameters packed into a staging slot.
  struct Transfer {
    at::Tensor direct;               // defined: a large parameter's bytes
    std::vector<at::Tensor> packed;  // else: the small parameters' bytes
    int64_t bytes = 0;
  };
  // Parameters that lie back to back in one storage (FlattenParameters)
  // become one span of bytes.
  std::vector<at::Tensor> spans;
  for (size_t k = 0; k < params.size(); ++k) {
    const at::Tensor& p = params[k];
    if (!p.is_contiguous()) {
      return absl::InvalidArgumentError(absl::StrCat("weight sync: parameter ", k, " is not contiguous"));
    }
    at::Tensor b = p.detach().view({-1}).view(at::kByte);
    if (b.numel() == 0) continue;
    at::Tensor* last = spans.empty() ? nullptr : &spans.back();
    if (merge_adjacent && last != nullptr && last->storage().is_alias_of(b.storage()) &&
        last->storage_offset() + last->numel() == b.storage_offset()) {
      *last = last->as_strided({last->numel() + b.numel()}, {1});  // grow over b
    } else {
      spans.push_back(b);
    }
  }
  std::vector<Transfer> transfers;
  for (const at::Tensor& b : spans) {
    const int64_t n = b.numel();
    if (n >= chunk_bytes_) {
      transfers.push_back(Transfer{b, {}, n});
      continue;
    }
    if (transfers.empty() || transfers.back().direct.defined() || transfers.back().bytes + n > chunk_bytes_) {
      transfers.emplace_back();
    }
    transfers.back().packed.push_back(b);
    transfers.back().bytes += n;
  }
  if (transfers.empty()) return absl::OkStatus();
  const at::TensorOptions byte_options = params.front().options().dtype(at::kByte);
  if (static_cast<int>(slots_.size()) != kSlots || slots_.front().device() != byte_options.device()) {
    slots_.clear();
    for (int s = 0; s < kSlots; ++s) slots_.push_back(at::empty({chunk_bytes_}, byte_options).zero_());
  }
  // Transfer i uses in-flight entry (and staging slot) i % kSlots.
  std::vector<std::unique_ptr<CollectiveWork>> in_flight(kSlots);
  auto wait = [&](size_t i) -> absl::Status {
    auto& work = in_flight[i % kSlots];
    if (work == nullptr) return absl::OkStatus();
    absl::Status s = work->Wait();
    work.reset();
    return s;
  };
  // Copies the small parameters of transfer i into its slot (pack) or back.
  auto copy_packed = [&](size_t i, bool pack) {
    at::Tensor slot = slots_[i % kSlots];
    int64_t off = 0;
    for (const at::Tensor& b : transfers[i].packed) {
      at::Tensor part = slot.narrow(0, off, b.numel());
      pack ? part.copy_(b) : b.copy_(part);
      off += b.numel();
    }
  };
  auto issue = [&](size_t i) -> absl::Status {
    const Transfer& t = transfers[i];
    if (sender && !t.direct.defined()) copy_packed(i, /*pack=*/true);
    // c10d keeps its own reference to the tensor until the work is done.
    at::Tensor buf = t.direct.defined() ? t.direct : slots_[i % kSlots].narrow(0, 0, t.bytes);
    ROLL_ASSIGN_OR_RETURN(in_flight[i % kSlots], comm.BroadcastAsync(buf, 0));
    return absl::OkStatus();
  };
  const size_t n = transfers.size();
  if (sender) {
    for (size_t i = 0; i < n; ++i) {
      ROLL_RETURN_IF_ERROR(wait(i));  // the slot's previous transfer has left
      ROLL_RETURN_IF_ERROR(issue(i));
    }
    for (size_t i = n > kSlots ? n - kSlots : 0; i < n; ++i) ROLL_RETURN_IF_ERROR(wait(i));
    return absl::OkStatus();
  }
  for (size_t i = 0; i < std::min<size_t>(n, kSlots); ++i) ROLL_RETURN_IF_ERROR(issue(i));
  for (size_t i = 0; i < n; ++i) {
    ROLL_RETURN_IF_ERROR(wait(i));
    if (!transfers[i].direct.defined()) copy_packed(i, /*pack=*/false);
    if (i + kSlots < n) ROLL_RETURN_IF_ERROR(issue(i + kSlots));
  }
  // Writes through a span bump only its first parameter's version counter:
  // mark every parameter written, so whatever caches a copy of one (the
  // decode path's fused weights) sees the new values.
  for (const at::Tensor& p : params) torch::autograd::impl::bump_version(p);
  return absl::OkStatus();
}

absl::Status ReceiveShardedUpdate(ParameterBroadcaster& broadcaster,
                                  const std::vector<std::unique_ptr<Communicator>>& groups,
                                  const CausalLM& model, std::optional<ShardLayout>* layout) {
  return ReceiveShardedUpdate(broadcaster, groups, model.NamedParametersOrdered(), layout);
}

namespace {

// *layout for `world` trainer ranks over parameters `shapes` (kept while
// the rank count stays).
absl::Status EnsureLayout(const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes, int world,
                          std::optional<ShardLayout>* layout) {
  if (layout->has_value() && (*layout)->world_size() == world) return absl::OkStatus();
  ROLL_ASSIGN_OR_RETURN(ShardLayout fresh, ShardLayout::Create(shapes, world));
  *layout = std::move(fresh);
  return absl::OkStatus();
}

// Trainer rank `rank`'s pieces grouped by unit (each unit one transfer),
// units without a piece left out.
std::vector<std::vector<ShardPiece>> PiecesByUnit(const ShardLayout& layout, int rank) {
  std::vector<std::vector<ShardPiece>> by_unit(layout.units().size());
  for (const ShardPiece& p : layout.Pieces(rank)) by_unit[p.unit].push_back(p);
  by_unit.erase(std::remove_if(by_unit.begin(), by_unit.end(), [](const auto& u) { return u.empty(); }),
                by_unit.end());
  return by_unit;
}

// Writes `src`, elements [offset, offset + src.numel()) of the flattened
// whole parameter `name` of shape `shape`, into each slice's part of it.
void ScatterIntoSlices(const std::string& name, const std::vector<int64_t>& shape, int64_t offset,
                       const at::Tensor& src, const std::vector<std::map<std::string, at::Tensor>>& slices) {
  const int dim = TensorParallelDim(name);
  const int64_t n = src.numel();
  if (dim < 0) {
    for (const auto& m : slices) m.at(name).view({-1}).narrow(0, offset, n).copy_(src);
    return;
  }
  // Element i of the whole is (a, c, b) in a [A, W, B] view around the split
  // dimension; slice c / w holds it at (a, c % w, b) of its [A, w, B].
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(dim) + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t width = shape[dim], part = width / static_cast<int64_t>(slices.size());
  const at::Tensor i = at::arange(offset, offset + n, at::kLong);
  const at::Tensor outer = at::div(i, width * inner, "floor");
  const at::Tensor c = at::div(i.remainder(width * inner), inner, "floor");
  const at::Tensor local = outer * (part * inner) + c.remainder(part) * inner + i.remainder(inner);
  const at::Tensor owner = at::div(c, part, "floor");
  for (size_t k = 0; k < slices.size(); ++k) {
    const at::Tensor mine = owner.eq(static_cast<int64_t>(k));
    at::Tensor flat = slices[k].at(name).view({-1});
    flat.index_put_({local.masked_select(mine)}, src.masked_select(mine));
  }
}

}  // namespace

absl::Status ReceiveShardedUpdateIntoSlices(
    ParameterBroadcaster& broadcaster, const std::vector<std::unique_ptr<Communicator>>& groups,
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& whole, const std::vector<CausalLM*>& slices,
    std::optional<ShardLayout>* layout) {
  const int world = static_cast<int>(groups.size());
  ROLL_RETURN_IF_ERROR(EnsureLayout(whole, world, layout));
  std::vector<std::map<std::string, at::Tensor>> parts;
  for (CausalLM* s : slices) parts.push_back(s->NamedParameters());
  torch::NoGradGuard no_grad;
  for (int r = 0; r < world; ++r) {
    const std::vector<std::vector<ShardPiece>> by_unit = PiecesByUnit(**layout, r);
    std::vector<at::Tensor> stages;
    for (const std::vector<ShardPiece>& pieces : by_unit) {
      int64_t total = 0;
      for (const ShardPiece& p : pieces) total += p.numel;
      stages.push_back(at::empty({total}, parts[0].at(whole[pieces[0].param].first).options()));
    }
    ROLL_RETURN_IF_ERROR(Annotate(broadcaster.Run(*groups[r], stages, /*merge_adjacent=*/false),
                                  absl::StrCat("receiving the shard of trainer rank ", r)));
    for (size_t u = 0; u < by_unit.size(); ++u) {
      int64_t off = 0;
      for (const ShardPiece& p : by_unit[u]) {
        const auto& [name, shape] = whole[p.param];
        ScatterIntoSlices(name, shape, p.param_offset, stages[u].narrow(0, off, p.numel), parts);
        off += p.numel;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ReceiveShardedUpdate(ParameterBroadcaster& broadcaster,
                                  const std::vector<std::unique_ptr<Communicator>>& groups,
                                  const std::vector<std::pair<std::string, at::Tensor>>& named,
                                  std::optional<ShardLayout>* layout) {
  const int world = static_cast<int>(groups.size());
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto& [name, p] : named) shapes.emplace_back(name, p.sizes().vec());
  ROLL_RETURN_IF_ERROR(EnsureLayout(shapes, world, layout));
  torch::NoGradGuard no_grad;
  for (int r = 0; r < world; ++r) {
    // One transfer per unit: straight into the parameters when the unit's
    // pieces lie back to back in one storage (a flattened model), else
    // through a staging tensor copied out after.
    std::vector<std::vector<at::Tensor>> by_unit;
    for (const std::vector<ShardPiece>& unit : PiecesByUnit(**layout, r)) {
      by_unit.emplace_back();
      for (const ShardPiece& p : unit) {
        by_unit.back().push_back(named[p.param].second.detach().view({-1}).narrow(0, p.param_offset, p.numel));
      }
    }
    std::vector<at::Tensor> targets;
    std::vector<std::pair<at::Tensor, std::vector<at::Tensor>>> staged;
    for (const std::vector<at::Tensor>& pieces : by_unit) {
      int64_t total = pieces[0].numel();
      bool adjacent = true;
      for (size_t i = 1; i < pieces.size(); ++i) {
        const at::Tensor& a = pieces[i - 1];
        adjacent = adjacent && pieces[i].scalar_type() == a.scalar_type() &&
                   pieces[i].storage().is_alias_of(a.storage()) &&
                   pieces[i].storage_offset() == a.storage_offset() + a.numel();
        total += pieces[i].numel();
      }
      if (adjacent) {
        targets.push_back(pieces[0].as_strided({total}, {1}));
      } else {
        at::Tensor stage = at::empty({total}, pieces[0].options());
        targets.push_back(stage);
        staged.emplace_back(stage, pieces);
      }
    }
    ROLL_RETURN_IF_ERROR(Annotate(broadcaster.Run(*groups[r], targets, /*merge_adjacent=*/false),
                                  absl::StrCat("receiving the shard of trainer rank ", r)));
    for (auto& [stage, pieces] : staged) {
      int64_t off = 0;
      for (at::Tensor& p : pieces) {
        p.copy_(stage.narrow(0, off, p.numel()));
        off += p.numel();
      }
    }
    // Writes through a run bump only its first parameter's version counter:
    // mark every parameter, so the decode path's fused weights are rebuilt.
    for (const auto& pieces : by_unit) {
      for (const at::Tensor& p : pieces) torch::autograd::impl::bump_version(p);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> LossMask(const Batch& batch) {
  ROLL_ASSIGN_OR_RETURN(at::Tensor ids, batch.Tensor("input_ids"));
  at::Tensor mask = batch.HasTensor("response_mask") ? *batch.Tensor("response_mask")
                                                     : at::ones_like(ids);
  if (batch.HasTensor("attention_mask")) mask = mask * *batch.Tensor("attention_mask");
  return mask.slice(1, 1).to(at::kFloat);
}

absl::StatusOr<ScoredTokens> ScoreTokens(const CausalLM& model, const Batch& batch, int64_t micro,
                                         bool with_entropy) {
  torch::NoGradGuard no_grad;
  ROLL_ASSIGN_OR_RETURN(at::Tensor ids, batch.Tensor("input_ids"));
  at::Tensor attn = batch.HasTensor("attention_mask") ? *batch.Tensor("attention_mask")
                                                      : at::ones_like(ids);
  ROLL_ASSIGN_OR_RETURN(at::Tensor mask, LossMask(batch));
  std::vector<at::Tensor> lps, ents;
  for (int64_t b = 0; b < ids.size(0); b += micro) {
    const int64_t e = std::min<int64_t>(ids.size(0), b + micro);
    at::Tensor mids = ids.slice(0, b, e);
    ROLL_ASSIGN_OR_RETURN(at::Tensor logits, model.Forward(mids, attn.slice(0, b, e)));
    ROLL_ASSIGN_OR_RETURN(TokenLogProbs t, LogProbsFromLogits(logits, mids, with_entropy));
    at::Tensor m = mask.slice(0, b, e);
    lps.push_back(t.log_probs * m);
    if (with_entropy) ents.push_back(t.entropy * m);
  }
  ScoredTokens out;
  out.log_probs = at::cat(lps);
  if (with_entropy) out.entropy = at::cat(ents);
  return out;
}

StateOffload::StateOffload(std::string who, std::string spill_dir)
    : who_(std::move(who)), offloader_(std::move(spill_dir)) {}

absl::StatusOr<Batch> StateOffload::Offload(const std::vector<at::Tensor>& tensors, int64_t also_freed) {
  if (!offloaded_) {
    if (!warned_in_memory_ &&
        std::any_of(tensors.begin(), tensors.end(),
                    [](const at::Tensor& t) { return t.defined() && t.device().is_cpu(); }) &&
        offloader_.spill_in_memory()) {
      warned_in_memory_ = true;
      spdlog::warn("{}: offload_dir {} is a memory file system (tmpfs): offloaded CPU tensors stay in memory",
                   who_, offloader_.spill_dir());
    }
    ROLL_RETURN_IF_ERROR(Annotate(offloader_.Offload(tensors), absl::StrCat(who_, ": offload_states")));
    offloaded_ = true;
    // Give the freed heap pages back to the system, so resident memory
    // reflects the offload.
    malloc_trim(0);
  }
  Batch out;
  out.SetMeta("offloaded_bytes", absl::StrCat(offloader_.offloaded_bytes() + also_freed));
  out.SetMeta("resident_bytes", absl::StrCat(ResidentBytes()));
  return out;
}

absl::StatusOr<Batch> StateOffload::Onload() {
  ROLL_RETURN_IF_ERROR(Annotate(offloader_.Onload(), absl::StrCat(who_, ": load_states")));
  offloaded_ = false;
  Batch out;
  out.SetMeta("resident_bytes", absl::StrCat(ResidentBytes()));
  return out;
}

absl::Status StateOffload::Check(std::string_view method) const {
  if (!offloaded_) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(who_, ": '", Sv(method), "' while its states are offloaded; call load_states first"));
}

}  // namespace roll::rl_internal
