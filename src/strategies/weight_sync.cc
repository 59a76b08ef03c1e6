#include "roll/strategies/weight_sync.h"

#include <torch/torch.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include "absl/strings/str_cat.h"
#include "roll/models/transformer.h"
#include "roll/strategies/communicator.h"

namespace roll {

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

absl::Status SharedWeights::Publish(int64_t version, const std::function<absl::Status(const at::Tensor&)>& fill) {
  auto* h = static_cast<SharedHeader*>(base_);
  h->version.store(-1, std::memory_order_release);
  ROLL_RETURN_IF_ERROR(fill(at::from_blob(static_cast<uint8_t*>(base_) + kHeaderBytes, {bytes_}, at::kByte)));
  h->version.store(version, std::memory_order_release);
  return absl::OkStatus();
}

absl::Status SharedWeights::Publish(const std::vector<at::Tensor>& params, int64_t version) {
  return Publish(version, [&](const at::Tensor&) {
    return CopyParams(params, static_cast<uint8_t*>(base_) + kHeaderBytes, bytes_, true);
  });
}

absl::Status SharedWeights::Read(int64_t version, absl::Duration timeout,
                                 const std::function<absl::Status(const at::Tensor&)>& read) {
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
  return read(at::from_blob(static_cast<uint8_t*>(base_) + kHeaderBytes, {bytes_}, at::kByte));
}

absl::Status SharedWeights::Read(const std::vector<at::Tensor>& params, int64_t version, absl::Duration timeout) {
  return Read(version, timeout, [&](const at::Tensor&) {
    return CopyParams(params, static_cast<uint8_t*>(base_) + kHeaderBytes, bytes_, false);
  });
}

ParameterBroadcaster::ParameterBroadcaster(int64_t buffer_bytes)
    : chunk_bytes_(std::max<int64_t>(4096, buffer_bytes / kSlots) / 64 * 64) {}

absl::Status ParameterBroadcaster::Pipeline(Communicator& comm, const std::vector<Window>& windows,
                                            const at::TensorOptions& byte_options,
                                            const std::function<absl::Status(size_t, const at::Tensor&)>& slot_fn) {
  if (windows.empty()) return absl::OkStatus();
  if (static_cast<int>(slots_.size()) != kSlots || slots_.front().device() != byte_options.device()) {
    slots_.clear();
    for (int s = 0; s < kSlots; ++s) slots_.push_back(at::empty({chunk_bytes_}, byte_options).zero_());
  }
  const bool sender = comm.rank() == 0;
  // Window i uses in-flight entry (and staging slot) i % kSlots.
  std::vector<std::unique_ptr<CollectiveWork>> in_flight(kSlots);
  auto wait = [&](size_t i) -> absl::Status {
    auto& work = in_flight[i % kSlots];
    if (work == nullptr) return absl::OkStatus();
    absl::Status s = work->Wait();
    work.reset();
    return s;
  };
  auto buffer = [&](size_t i) {
    const Window& w = windows[i];
    return w.direct.defined() ? w.direct : slots_[i % kSlots].narrow(0, 0, w.bytes);
  };
  auto issue = [&](size_t i) -> absl::Status {
    at::Tensor buf = buffer(i);
    if (sender && !windows[i].direct.defined()) ROLL_RETURN_IF_ERROR(slot_fn(i, buf));
    // c10d keeps its own reference to the tensor until the work is done.
    ROLL_ASSIGN_OR_RETURN(in_flight[i % kSlots], comm.BroadcastAsync(buf, 0));
    return absl::OkStatus();
  };
  const size_t n = windows.size();
  if (sender) {
    for (size_t i = 0; i < n; ++i) {
      ROLL_RETURN_IF_ERROR(wait(i));  // the slot's previous window has left
      ROLL_RETURN_IF_ERROR(issue(i));
    }
    for (size_t i = n > kSlots ? n - kSlots : 0; i < n; ++i) ROLL_RETURN_IF_ERROR(wait(i));
    return absl::OkStatus();
  }
  for (size_t i = 0; i < std::min<size_t>(n, kSlots); ++i) ROLL_RETURN_IF_ERROR(issue(i));
  for (size_t i = 0; i < n; ++i) {
    ROLL_RETURN_IF_ERROR(wait(i));
    if (!windows[i].direct.defined()) ROLL_RETURN_IF_ERROR(slot_fn(i, buffer(i)));
    if (i + kSlots < n) ROLL_RETURN_IF_ERROR(issue(i + kSlots));
  }
  return absl::OkStatus();
}

absl::Status ParameterBroadcaster::Run(Communicator& comm, const std::vector<at::Tensor>& params) {
  torch::NoGradGuard no_grad;
  // The stream: the parameters' bytes back to back, cut into windows of
  // chunk_bytes_. Parameters that lie back to back in one storage
  // (FlattenParameters) make one span, so a window inside a span needs no
  // copy; only a window across two spans goes through a slot. The windows
  // depend on the total only: the two sides may lay their parameters out
  // differently.
  std::vector<at::Tensor> spans;
  for (size_t k = 0; k < params.size(); ++k) {
    const at::Tensor& p = params[k];
    if (!p.is_contiguous()) {
      return absl::InvalidArgumentError(absl::StrCat("weight sync: parameter ", k, " is not contiguous"));
    }
    at::Tensor b = p.detach().view({-1}).view(at::kByte);
    if (b.numel() == 0) continue;
    at::Tensor* last = spans.empty() ? nullptr : &spans.back();
    if (last != nullptr && last->storage().is_alias_of(b.storage()) &&
        last->storage_offset() + last->numel() == b.storage_offset()) {
      *last = last->as_strided({last->numel() + b.numel()}, {1});  // grow over b
    } else {
      spans.push_back(b);
    }
  }
  std::vector<Window> windows(1);
  for (const at::Tensor& b : spans) {
    for (int64_t off = 0; off < b.numel();) {
      if (windows.back().bytes == chunk_bytes_) windows.emplace_back();
      Window& w = windows.back();
      const int64_t take = std::min(chunk_bytes_ - w.bytes, b.numel() - off);
      w.parts.push_back(b.narrow(0, off, take));
      w.bytes += take;
      off += take;
    }
  }
  if (windows.back().bytes == 0) return absl::OkStatus();
  for (Window& w : windows) {
    if (w.parts.size() == 1) w.direct = std::move(w.parts.front());
  }
  const bool sender = comm.rank() == 0;
  ROLL_RETURN_IF_ERROR(Pipeline(comm, windows, params.front().options().dtype(at::kByte),
                                [&](size_t i, const at::Tensor& slot) {
                                  int64_t off = 0;
                                  for (const at::Tensor& b : windows[i].parts) {
                                    at::Tensor part = slot.narrow(0, off, b.numel());
                                    sender ? part.copy_(b) : b.copy_(part);
                                    off += b.numel();
                                  }
                                  return absl::OkStatus();
                                }));
  // Writes through a span bump only its first parameter's version counter:
  // mark every parameter written, so whatever caches a copy of one (the
  // decode path's fused weights) sees the new values.
  for (const at::Tensor& p : params) torch::autograd::impl::bump_version(p);
  return absl::OkStatus();
}

std::vector<ParameterBroadcaster::Window> ParameterBroadcaster::SlotWindows(int64_t total_bytes) const {
  std::vector<Window> windows;
  for (int64_t off = 0; off < total_bytes; off += chunk_bytes_) {
    windows.emplace_back();
    windows.back().bytes = std::min(chunk_bytes_, total_bytes - off);
  }
  return windows;
}

absl::Status ParameterBroadcaster::Receive(Communicator& comm, int64_t total_bytes, const at::TensorOptions& options,
                                           const std::function<absl::Status(int64_t, const at::Tensor&)>& deliver) {
  if (comm.rank() == 0) return absl::InvalidArgumentError("weight sync: Receive on the sending rank");
  torch::NoGradGuard no_grad;
  return Pipeline(comm, SlotWindows(total_bytes), options.dtype(at::kByte), [&](size_t i, const at::Tensor& slot) {
    return deliver(static_cast<int64_t>(i) * chunk_bytes_, slot);
  });
}

absl::Status ParameterBroadcaster::Send(Communicator& comm, int64_t total_bytes, const at::TensorOptions& options,
                                        const std::function<absl::Status(int64_t, const at::Tensor&)>& fill) {
  if (comm.rank() != 0) return absl::InvalidArgumentError("weight sync: Send on a receiving rank");
  torch::NoGradGuard no_grad;
  return Pipeline(comm, SlotWindows(total_bytes), options.dtype(at::kByte), [&](size_t i, const at::Tensor& slot) {
    return fill(static_cast<int64_t>(i) * chunk_bytes_, slot);
  });
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

// Copies elements [offset, offset + data.numel()) of the flattened whole
// parameter `name` of shape `shape` between `data` and the slices' parts of
// it: into every slice (`into`), or out of them (a replicated parameter out
// of slice 0).
void CopyWithSlices(const std::string& name, const std::vector<int64_t>& shape, int64_t offset,
                    const at::Tensor& data, const std::vector<std::map<std::string, at::Tensor>>& slices, bool into) {
  const int dim = TensorParallelDim(name);
  const int64_t n = data.numel();
  if (dim < 0) {
    if (!into) {
      data.copy_(slices.front().at(name).view({-1}).narrow(0, offset, n));
      return;
    }
    for (const auto& m : slices) m.at(name).view({-1}).narrow(0, offset, n).copy_(data);
    return;
  }
  // Around the split dimension the whole is [A, P, part * inner] and slice k
  // holds [A, part * inner], its [:, k, :]: element i of the whole is row
  // a = i / row, slice k = (i % row) / seg, element a * seg + i % seg of it.
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(dim) + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t num = static_cast<int64_t>(slices.size());
  const int64_t seg = shape[dim] / num * inner, row = seg * num;
  std::vector<at::Tensor> flat;
  for (const auto& m : slices) flat.push_back(m.at(name).view({-1}));
  auto copy = [into](const at::Tensor& slice_part, const at::Tensor& data_part) {
    into ? slice_part.copy_(data_part) : data_part.copy_(slice_part);
  };
  // A run within one slice's segment of one row: a single copy.
  auto run = [&](int64_t i, int64_t end) {
    const int64_t stop = std::min(end, (i / seg + 1) * seg);
    copy(flat[(i % row) / seg].narrow(0, i / row * seg + i % seg, stop - i), data.narrow(0, i - offset, stop - i));
    return stop;
  };
  const int64_t end = offset + n;
  int64_t i = offset;
  while (i < end && i % row != 0) i = run(i, end);
  // Whole rows: one strided copy per slice.
  if (const int64_t rows = (end - i) / row; rows > 0) {
    const at::Tensor block = data.narrow(0, i - offset, rows * row).view({rows, num, seg});
    for (int64_t k = 0; k < num; ++k) copy(flat[k].view({-1, seg}).narrow(0, i / row, rows), block.select(1, k));
    i += rows * row;
  }
  while (i < end) i = run(i, end);
}

}  // namespace

absl::Status ReceiveShardedUpdateIntoSlices(ParameterBroadcaster& broadcaster,
                                            const std::vector<std::unique_ptr<Communicator>>& groups,
                                            const std::vector<CausalLM*>& slices, std::optional<ShardLayout>* layout) {
  const int world = static_cast<int>(groups.size());
  ROLL_RETURN_IF_ERROR(EnsureLayout(WholeShapes(slices), world, layout));
  const at::TensorOptions options = slices.front()->Parameters().front().options();
  for (int r = 0; r < world; ++r) {
    // Trainer rank r sends its pieces unit by unit (ReceiveShardedUpdate's
    // order): the same pieces as one stream, written into the slices.
    std::vector<SliceStream::Segment> segments;
    for (const std::vector<ShardPiece>& unit : PiecesByUnit(**layout, r)) {
      for (const ShardPiece& p : unit) segments.push_back({p.param, p.param_offset, p.numel});
    }
    SliceStream shard(slices, segments);
    absl::Status s = broadcaster.Receive(*groups[r], shard.total_bytes(), options,
                                         [&](int64_t offset, const at::Tensor& bytes) { return shard.Write(offset, bytes); });
    if (s.ok()) s = shard.Finish();
    ROLL_RETURN_IF_ERROR(Annotate(s, absl::StrCat("receiving the shard of trainer rank ", r)));
  }
  return absl::OkStatus();
}

std::vector<std::pair<std::string, std::vector<int64_t>>> WholeShapes(const std::vector<CausalLM*>& slices) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& [name, mine] : slices.at(0)->NamedParametersOrdered()) {
    std::vector<int64_t> shape = mine.sizes().vec();
    if (const int dim = TensorParallelDim(name); dim >= 0) shape[dim] *= static_cast<int64_t>(slices.size());
    out.emplace_back(name, std::move(shape));
  }
  return out;
}

namespace {

// Every parameter of the slices' whole model, whole.
std::vector<SliceStream::Segment> WholeSegments(const std::vector<CausalLM*>& slices) {
  std::vector<SliceStream::Segment> out;
  for (const auto& [name, shape] : WholeShapes(slices)) {
    const int64_t numel = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
    out.push_back({out.size(), 0, numel});
  }
  return out;
}

}  // namespace

SliceStream::SliceStream(const std::vector<CausalLM*>& slices) : SliceStream(slices, WholeSegments(slices)) {}

SliceStream::SliceStream(const std::vector<CausalLM*>& slices, const std::vector<Segment>& segments) {
  for (CausalLM* s : slices) parts_.push_back(s->NamedParameters());
  const std::vector<std::pair<std::string, std::vector<int64_t>>> whole = WholeShapes(slices);
  for (const Segment& seg : segments) {
    const auto& [name, shape] = whole.at(seg.param);
    const at::Tensor& mine = parts_.front().at(name);
    Param p;
    p.dtype = mine.scalar_type();
    p.element_size = static_cast<int64_t>(mine.element_size());
    p.first = seg.first;
    p.start = total_;
    p.bytes = seg.numel * p.element_size;
    p.name = name;
    p.shape = shape;
    total_ += p.bytes;
    if (p.bytes > 0) params_.push_back(std::move(p));
  }
}

void SliceStream::Copy(const Param& p, int64_t element, const at::Tensor& bytes, bool into) {
  const int64_t first_element = p.first + element;
  // A byte view reads as the parameter's dtype only from an aligned offset.
  const bool aligned = bytes.storage_offset() % p.element_size == 0;
  if (into) {
    CopyWithSlices(p.name, p.shape, first_element, (aligned ? bytes : bytes.clone()).view(p.dtype), parts_, true);
  } else if (aligned) {
    CopyWithSlices(p.name, p.shape, first_element, bytes.view(p.dtype), parts_, false);
  } else {
    at::Tensor tmp = at::empty({bytes.numel() / p.element_size}, bytes.options().dtype(p.dtype));
    CopyWithSlices(p.name, p.shape, first_element, tmp, parts_, false);
    bytes.copy_(tmp.view(at::kByte));
  }
}

absl::Status SliceStream::Transfer(int64_t offset, const at::Tensor& bytes, bool into) {
  torch::NoGradGuard no_grad;
  const int64_t end = offset + bytes.numel();
  if (offset < 0 || end > total_) {
    return absl::InvalidArgumentError(absl::StrCat("tensor-parallel update: bytes [", offset, ", ", end,
                                                   ") lie outside the model's ", total_, " bytes of parameters"));
  }
  uint8_t* data = bytes.data_ptr<uint8_t>();
  // The first parameter that ends after `offset`.
  auto it = std::upper_bound(params_.begin(), params_.end(), offset,
                             [](int64_t off, const Param& p) { return off < p.start + p.bytes; });
  for (int64_t pos = offset; pos < end; ++it) {
    const Param& p = *it;
    const int64_t es = p.element_size;
    int64_t b = pos - p.start;  // bytes into the parameter
    const int64_t b_end = std::min(end, p.start + p.bytes) - p.start;
    uint8_t* at_b = data + (pos - offset);
    if (into && !carry_.empty()) {  // finish the element the last piece began
      const int64_t take = std::min<int64_t>(es - static_cast<int64_t>(carry_.size()), b_end - b);
      carry_.insert(carry_.end(), at_b, at_b + take);
      b += take;
      if (static_cast<int64_t>(carry_.size()) == es) {
        Copy(p, b / es - 1, at::from_blob(carry_.data(), {es}, at::kByte).clone(), true);
        carry_.clear();
      }
    } else if (!into && b % es != 0) {  // the end of an element the last piece began
      const int64_t take = std::min(es - b % es, b_end - b);
      at::Tensor element = at::empty({es}, at::kByte);
      Copy(p, b / es, element, false);
      std::memcpy(at_b, element.data_ptr<uint8_t>() + b % es, static_cast<size_t>(take));
      b += take;
    }
    const int64_t whole_end = b + (b_end - b) / es * es;
    if (whole_end > b) Copy(p, b / es, bytes.narrow(0, p.start + b - offset, whole_end - b), into);
    if (whole_end < b_end) {  // an element the next piece ends
      uint8_t* from = data + (p.start + whole_end - offset);
      if (into) {
        carry_.assign(from, from + (b_end - whole_end));
      } else {
        at::Tensor element = at::empty({es}, at::kByte);
        Copy(p, whole_end / es, element, false);
        std::memcpy(from, element.data_ptr<uint8_t>(), static_cast<size_t>(b_end - whole_end));
      }
    }
    pos = p.start + b_end;
  }
  return absl::OkStatus();
}

absl::Status SliceStream::Write(int64_t offset, const at::Tensor& bytes) {
  if (offset != next_) {
    return absl::InternalError(absl::StrCat("tensor-parallel update: a piece at byte ", offset, ", expected ", next_));
  }
  ROLL_RETURN_IF_ERROR(Transfer(offset, bytes, true));
  next_ = offset + bytes.numel();
  return absl::OkStatus();
}

absl::Status SliceStream::Read(int64_t offset, const at::Tensor& bytes) { return Transfer(offset, bytes, false); }

absl::Status SliceStream::Finish() const {
  if (next_ != total_ || !carry_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor-parallel update: ended after ", next_, " of the model's ",
                                                   total_, " bytes of parameters"));
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
    // Straight into the parameters: the broadcast's windows depend only on
    // the byte total, so pieces that lie back to back (a flattened model)
    // take a window without a copy and the rest go through its slots.
    std::vector<at::Tensor> pieces;
    for (const std::vector<ShardPiece>& unit : PiecesByUnit(**layout, r)) {
      for (const ShardPiece& p : unit) {
        pieces.push_back(named[p.param].second.detach().view({-1}).narrow(0, p.param_offset, p.numel));
      }
    }
    ROLL_RETURN_IF_ERROR(Annotate(broadcaster.Run(*groups[r], pieces),
                                  absl::StrCat("receiving the shard of trainer rank ", r)));
  }
  return absl::OkStatus();
}

}  // namespace roll
