#pragma once
// KvCache: preallocated key/value memory for incremental decoding with many
// sequences in flight (continuous batching).
//
// The cache has `num_slots` independent slots; a slot holds the keys and
// values of one sequence, up to `max_len` positions. Per layer there is one
// K and one V buffer of shape [num_slots, num_kv_heads, max_len, head_dim]:
// a slot's keys for one head are contiguous, so attention over a slot is a
// plain matrix product, and a contiguous range of slots is a zero-copy view.
// The buffers are allocated once by Create() and reused; Reset() only marks
// a slot empty (stale data past a slot's length is never read because
// attention is masked by length).
//
// CausalLM::Prefill / DecodeStep write into the cache and advance the
// lengths; the generation engine decides which slot serves which sequence.
// CopyPrefix() lets the n samples of one prompt share a single prefill.
//
// Ownership: the cache owns its buffers; keys()/values() return handles that
// alias them. Thread-safety: none; use one cache from one thread at a time
// (the model's decode methods mutate it).

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "roll/common/status.h"

namespace roll {

class CausalLM;

struct KvCacheOptions {
  int64_t num_layers = 0;    // required, > 0
  int64_t num_kv_heads = 0;  // required, > 0
  int64_t head_dim = 0;      // required, > 0
  int64_t num_slots = 0;     // required, > 0
  int64_t max_len = 0;       // required, > 0: positions per slot
  c10::ScalarType dtype = c10::ScalarType::Float;  // default: float32
  c10::Device device = c10::Device(c10::DeviceType::CPU);  // default: CPU
};

class KvCache {
 public:
  // Allocates 2 * num_layers buffers (zero-filled). InvalidArgument for a
  // non-positive size; ResourceExhausted when the allocation fails.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(const KvCacheOptions& options);

  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  const KvCacheOptions& options() const { return options_; }
  int64_t num_slots() const { return options_.num_slots; }
  int64_t max_len() const { return options_.max_len; }
  int64_t num_layers() const { return options_.num_layers; }
  // Bytes held by all buffers.
  int64_t nbytes() const;

  // Positions currently cached in `slot` (0 for an empty slot). Slots out of
  // range return 0; use CheckSlot() to validate.
  int64_t length(int64_t slot) const;
  const std::vector<int64_t>& lengths() const { return lengths_; }

  // OutOfRange naming the slot when it is not in [0, num_slots).
  absl::Status CheckSlot(int64_t slot) const;

  // Marks `slot` (or every slot) empty. The memory stays allocated.
  absl::Status Reset(int64_t slot);
  void ResetAll();
  // Keeps the first `length` cached positions of `slot` (a prefix to extend
  // from). OutOfRange when `length` is negative or above length(slot).
  absl::Status Truncate(int64_t slot, int64_t length);

  // Copies the cached prefix of `src` (its first length(src) positions, every
  // layer) into each slot of `dsts` and sets their lengths to length(src).
  // `dsts` must not contain `src`.
  absl::Status CopyPrefix(int64_t src, const std::vector<int64_t>& dsts);

  // Per-layer buffers [num_slots, num_kv_heads, max_len, head_dim].
  const at::Tensor& keys(int64_t layer) const { return keys_[layer]; }
  const at::Tensor& values(int64_t layer) const { return values_[layer]; }

 private:
  friend class CausalLM;  // writes positions and advances lengths
  explicit KvCache(const KvCacheOptions& options) : options_(options) {}

  KvCacheOptions options_;
  std::vector<at::Tensor> keys_;
  std::vector<at::Tensor> values_;
  std::vector<int64_t> lengths_;
};

}  // namespace roll
