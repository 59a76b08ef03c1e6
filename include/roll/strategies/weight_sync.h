#pragma once
// Weight sync: moving a trainer's parameters into the generators, the model
// update's data path (docs/placement.md, docs/benchmarks.md "weight sync").
//
//   FlattenParameters         one contiguous buffer, so a broadcast window
//                             travels without a copy
//   ParameterBroadcaster      a stream of parameter bytes from sync rank 0 to
//                             every member of a communicator, windowed, with
//                             staging slots reused across updates
//   SliceStream               a tensor-parallel model's slices seen as the
//                             whole model's bytes
//   ReceiveShardedUpdate*     a generator's side of the update from a fully
//                             sharded trainer
//   SharedWeights             the update between colocated processes, through
//                             shared memory
//
// The actor workers drive these (send_weights / receive_weights); `roll
// bench weight-sync` measures them against the raw broadcast.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/time/time.h"
#include "roll/common/status.h"
#include "roll/strategies/sharding.h"

namespace roll {

class CausalLM;
class Communicator;

// Moves the parameters (same tensor objects, same values) into one
// contiguous buffer in the order given, so that consecutive parameters lie
// back to back and ParameterBroadcaster sends them in one transfer. Mixed
// dtypes share the buffer too (each parameter aligned to its element size:
// a narrower dtype followed by a wider one may leave a gap of a few bytes,
// where the transfer splits). Does nothing unless all are contiguous on one
// device, and nothing when they already lie so (a CausalLM allocates its
// parameters that way, so a loaded model is never copied). Call before anything keeps pointers into them (optimizer state is
// keyed by the tensor objects, which stay the same).
void FlattenParameters(const std::vector<at::Tensor>& params);

// Streams `params` from sync rank 0 to every other member of `comm`;
// receivers get the values written into theirs in place. The stream is the
// parameters' bytes back to back, cut into windows of chunk_bytes() (a
// quarter of `buffer_bytes`, model_update_buffer_size_mb): the windows
// depend only on the total, so every member must pass the same sizes in the
// same order but may lay them out as it likes. A window inside one
// contiguous storage (one large parameter, or a flattened model's
// parameters, FlattenParameters) travels straight from the sender's memory
// into the receiver's; a window across storages is packed into one of
// `kSlots` staging buffers. Up to kSlots windows are in flight, so packing
// and unpacking overlap the transfers. The staging buffers are allocated
// once and reused by every later update (fresh memory costs page faults that
// dominate a transfer on small hosts). Not thread-safe: one update at a
// time, on the thread that owns `comm`.
class ParameterBroadcaster {
 public:
  static constexpr int kSlots = 4;
  explicit ParameterBroadcaster(int64_t buffer_bytes);
  absl::Status Run(Communicator& comm, const std::vector<at::Tensor>& params);
  // A receiver's side without destination tensors: the stream of
  // `total_bytes` (what the sender's Run sends) lands window by window in
  // the staging buffers (on `options`' device), and `deliver(offset, bytes)`
  // gets each, in stream order, before its buffer is reused. Memory: the
  // staging buffers only, whatever the model's size.
  // The sender's side of the same without source tensors: `fill(offset,
  // bytes)` writes each window of a stream of `total_bytes` into a staging
  // buffer before it goes out (receivers run Run or Receive as usual).
  absl::Status Send(Communicator& comm, int64_t total_bytes, const at::TensorOptions& options,
                    const std::function<absl::Status(int64_t, const at::Tensor&)>& fill);
  absl::Status Receive(Communicator& comm, int64_t total_bytes, const at::TensorOptions& options,
                       const std::function<absl::Status(int64_t, const at::Tensor&)>& deliver);
  int64_t chunk_bytes() const { return chunk_bytes_; }

 private:
  struct Window {
    at::Tensor direct;              // defined: the window's bytes lie in one storage
    std::vector<at::Tensor> parts;  // else: the pieces packed into a slot
    int64_t bytes = 0;
  };
  // Moves `windows` with up to kSlots in flight; a window without a direct
  // tensor uses a slot, which `slot_fn(i, slot)` fills on the sender before
  // it goes and empties on a receiver after it arrived.
  absl::Status Pipeline(Communicator& comm, const std::vector<Window>& windows, const at::TensorOptions& byte_options,
                        const std::function<absl::Status(size_t, const at::Tensor&)>& slot_fn);
  std::vector<Window> SlotWindows(int64_t total_bytes) const;

  int64_t chunk_bytes_;
  std::vector<at::Tensor> slots_;  // kSlots uint8 buffers of chunk_bytes_
};

// A tensor-parallel model's slices seen as the whole model's parameter
// bytes: the parameters in order, back to back, as ParameterBroadcaster and
// SharedWeights lay them out (whole shapes: a split dimension times the
// number of slices). Write puts a stream's pieces, in order, straight into
// the slices (each element to the slice that holds it, a replicated
// parameter to each; an element cut between two pieces is put together
// first): a generator's side. Read fills any range of it from the slices
// (a replicated parameter from slice 0): a trainer's side. Either way no
// whole copy of the model is made.
class SliceStream {
 public:
  explicit SliceStream(const std::vector<CausalLM*>& slices);
  // A stream of parts of the whole model's parameters instead, back to back
  // in the order given: `numel` elements of parameter number `param` (in
  // the model's order) from element `first` of it on. A fully sharded
  // trainer rank's shard pieces, for one.
  struct Segment {
    size_t param = 0;
    int64_t first = 0, numel = 0;
  };
  SliceStream(const std::vector<CausalLM*>& slices, const std::vector<Segment>& segments);
  int64_t total_bytes() const { return total_; }
  absl::Status Write(int64_t offset, const at::Tensor& bytes);
  // After the last piece: every byte arrived.
  absl::Status Finish() const;
  absl::Status Read(int64_t offset, const at::Tensor& bytes);

 private:
  struct Param {
    std::string name;
    std::vector<int64_t> shape;  // the whole parameter's
    int64_t first = 0;             // the element of it the segment starts at
    int64_t start = 0, bytes = 0;  // in the stream
    at::ScalarType dtype;
    int64_t element_size = 0;
  };
  absl::Status Transfer(int64_t offset, const at::Tensor& bytes, bool into);
  void Copy(const Param& p, int64_t first_element, const at::Tensor& bytes, bool into);

  std::vector<Param> params_;
  std::vector<std::map<std::string, at::Tensor>> parts_;  // each slice's parameters
  int64_t total_ = 0;
  int64_t next_ = 0;  // the stream offset the next written piece must start at
  std::vector<uint8_t> carry_;  // the first bytes of an element cut between pieces
};

// A generator's side of the model update from a fully sharded trainer:
// trainer rank r's shard pieces (ShardLayout::Pieces(r), which *layout
// caches for the number of groups) arrive over groups[r], each straight
// into the part of `model`'s parameter it belongs to. No staging copy of
// the model.
absl::Status ReceiveShardedUpdate(ParameterBroadcaster& broadcaster,
                                  const std::vector<std::unique_ptr<Communicator>>& groups,
                                  const CausalLM& model, std::optional<ShardLayout>* layout);
// The same into `params` (name, tensor) in the model's order.
absl::Status ReceiveShardedUpdate(ParameterBroadcaster& broadcaster,
                                  const std::vector<std::unique_ptr<Communicator>>& groups,
                                  const std::vector<std::pair<std::string, at::Tensor>>& params,
                                  std::optional<ShardLayout>* layout);
// The same received straight into a tensor-parallel generator's slices
// (`slices` in rank order; the whole model's names and shapes are
// WholeShapes(slices)): each trainer rank's shard is a SliceStream of its
// pieces, received window by window, every element going to the slice that
// holds it (a replicated parameter to each). The receiving side keeps
// neither a whole copy of the model nor a shard's: only the broadcast's
// staging slots.
absl::Status ReceiveShardedUpdateIntoSlices(ParameterBroadcaster& broadcaster,
                                            const std::vector<std::unique_ptr<Communicator>>& groups,
                                            const std::vector<CausalLM*>& slices, std::optional<ShardLayout>* layout);

// The whole model's parameter names and shapes, in order, from its
// tensor-parallel slices (a split dimension times the number of slices).
std::vector<std::pair<std::string, std::vector<int64_t>>> WholeShapes(const std::vector<CausalLM*>& slices);

// The model update between colocated processes (the same device of one
// node: a CPU slot, or a GPU, which NCCL cannot give two ranks of one
// group): no network and no collective. Parameters on a GPU are staged
// through the region in host memory. The sender copies every parameter
// into one shared-memory region (a memfd, gone once the last process that
// maps it ends) and then publishes the version in its header; receivers
// open the region through the sender's /proc/<pid>/fd entry, wait for the
// version and copy the parameters out. The caller orders updates: a new
// Publish starts only after every receiver read the previous version.
class SharedWeights {
 public:
  // Sender side: a region sized for `params`.
  static absl::StatusOr<std::unique_ptr<SharedWeights>> Create(const std::vector<at::Tensor>& params);
  // Receiver side: the region at `path` (the sender's path()).
  static absl::StatusOr<std::unique_ptr<SharedWeights>> Open(const std::string& path);
  ~SharedWeights();
  SharedWeights(const SharedWeights&) = delete;
  SharedWeights& operator=(const SharedWeights&) = delete;

  const std::string& path() const { return path_; }
  int64_t bytes() const { return bytes_; }
  // Sender: copies `params` in and publishes `version` (>= 0).
  absl::Status Publish(const std::vector<at::Tensor>& params, int64_t version);
  // Sender: `fill` writes the region's data bytes (a uint8 tensor over the
  // shared memory, valid during the call), then `version` is published.
  absl::Status Publish(int64_t version, const std::function<absl::Status(const at::Tensor&)>& fill);
  // Receiver: waits up to `timeout` for `version`, then copies it into
  // `params` (same shapes and dtypes as the sender's, in order).
  absl::Status Read(const std::vector<at::Tensor>& params, int64_t version, absl::Duration timeout);
  // Receiver: waits the same, then hands `read` the region's data bytes (a
  // uint8 tensor over the shared memory, valid during the call).
  absl::Status Read(int64_t version, absl::Duration timeout, const std::function<absl::Status(const at::Tensor&)>& read);

 private:
  SharedWeights(int fd, void* base, int64_t bytes, std::string path);
  int fd_;
  void* base_;        // header, then the data
  int64_t bytes_;     // data bytes
  std::string path_;
};

}  // namespace roll
