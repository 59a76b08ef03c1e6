#include "roll/models/kv_cache.h"

#include <torch/torch.h>

#include <algorithm>

namespace roll {

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(const KvCacheOptions& options) {
  const std::pair<const char*, int64_t> sizes[] = {
      {"num_layers", options.num_layers}, {"num_kv_heads", options.num_kv_heads},
      {"head_dim", options.head_dim},     {"num_slots", options.num_slots},
      {"max_len", options.max_len},
  };
  for (const auto& [name, value] : sizes) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvCache: ", name, " must be positive, got ", value));
    }
  }
  std::unique_ptr<KvCache> cache(new KvCache(options));
  try {
    // Normal (non-inference) tensors, so the cache can be reset or inspected
    // outside InferenceMode too.
    at::NoGradGuard no_grad;
    const auto opts = at::TensorOptions().dtype(options.dtype).device(options.device);
    for (int64_t l = 0; l < options.num_layers; ++l) {
      const std::vector<int64_t> shape = {options.num_slots, options.num_kv_heads, options.max_len,
                                          options.head_dim};
      cache->keys_.push_back(at::zeros(shape, opts));
      cache->values_.push_back(at::zeros(shape, opts));
    }
  } catch (const c10::Error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KvCache: allocating ", options.num_layers, " layers x ", options.num_slots,
                     " slots x ", options.max_len, " positions failed: ", e.what_without_backtrace()));
  }
  cache->lengths_.assign(options.num_slots, 0);
  return cache;
}

int64_t KvCache::nbytes() const {
  int64_t total = 0;
  for (const auto& t : keys_) total += t.numel() * t.element_size();
  for (const auto& t : values_) total += t.numel() * t.element_size();
  return total;
}

int64_t KvCache::length(int64_t slot) const {
  if (slot < 0 || slot >= num_slots()) return 0;
  return lengths_[slot];
}

absl::Status KvCache::CheckSlot(int64_t slot) const {
  if (slot < 0 || slot >= num_slots()) {
    return absl::OutOfRangeError(
        absl::StrCat("KvCache: slot ", slot, " out of range [0, ", num_slots(), ")"));
  }
  return absl::OkStatus();
}

absl::Status KvCache::Reset(int64_t slot) {
  ROLL_RETURN_IF_ERROR(CheckSlot(slot));
  lengths_[slot] = 0;
  return absl::OkStatus();
}

absl::Status KvCache::Truncate(int64_t slot, int64_t length) {
  ROLL_RETURN_IF_ERROR(CheckSlot(slot));
  if (length < 0 || length > lengths_[slot]) {
    return absl::OutOfRangeError(absl::StrCat("KvCache::Truncate: slot ", slot, " holds ", lengths_[slot],
                                              " positions; cannot keep ", length));
  }
  lengths_[slot] = length;
  return absl::OkStatus();
}

void KvCache::ResetAll() { std::fill(lengths_.begin(), lengths_.end(), 0); }

absl::Status KvCache::CopyPrefix(int64_t src, const std::vector<int64_t>& dsts) {
  ROLL_RETURN_IF_ERROR(CheckSlot(src));
  for (int64_t d : dsts) {
    ROLL_RETURN_IF_ERROR(CheckSlot(d));
    if (d == src) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvCache::CopyPrefix: destination slot ", d, " is the source slot"));
    }
  }
  const int64_t n = lengths_[src];
  if (n > 0 && !dsts.empty()) {
    try {
      c10::InferenceMode guard;
      for (int64_t l = 0; l < num_layers(); ++l) {
        for (at::Tensor* buf : {&keys_[l], &values_[l]}) {
          const at::Tensor from = buf->select(0, src).narrow(1, 0, n);
          for (int64_t d : dsts) buf->select(0, d).narrow(1, 0, n).copy_(from);
        }
      }
    } catch (const c10::Error& e) {
      return absl::InternalError(
          absl::StrCat("KvCache::CopyPrefix: ", e.what_without_backtrace()));
    }
  }
  for (int64_t d : dsts) lengths_[d] = n;
  return absl::OkStatus();
}

}  // namespace roll
