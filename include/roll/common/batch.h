#pragma once
// Batch: the unit of data that moves between the controller and workers.
//
// A Batch holds `size()` samples as named tensors whose first dimension is
// the sample dimension, named per-sample string columns ("non-tensors":
// prompts, ground truths, domain tags) and batch-wide key/value metadata
// (`meta`). Operations return new Batches; tensors are shared, not copied,
// where LibTorch allows (Select and Concat copy, Chunk and Slice view).
//
// A Batch is a value type; it is not thread-safe to mutate one Batch from
// two threads, but distinct Batches sharing tensors may be read concurrently.

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>

#include "roll/common/status.h"

namespace roll {

class Batch {
 public:
  Batch() = default;

  // Number of samples. 0 for an empty batch. Taken from the first tensor or
  // column; Validate() checks that all agree.
  int64_t size() const;
  bool empty() const { return size() == 0; }

  // Named tensors, dim 0 = sample.
  std::map<std::string, at::Tensor>& tensors() { return tensors_; }
  const std::map<std::string, at::Tensor>& tensors() const { return tensors_; }
  // Per-sample string columns, each of length size().
  std::map<std::string, std::vector<std::string>>& columns() { return columns_; }
  const std::map<std::string, std::vector<std::string>>& columns() const { return columns_; }
  // Batch-wide metadata; not split by Chunk, copied to every piece.
  std::map<std::string, std::string>& meta() { return meta_; }
  const std::map<std::string, std::string>& meta() const { return meta_; }

  // Convenience accessors. Set* replace an existing entry.
  void SetTensor(std::string name, at::Tensor t) { tensors_[std::move(name)] = std::move(t); }
  void SetColumn(std::string name, std::vector<std::string> v) { columns_[std::move(name)] = std::move(v); }
  void SetMeta(std::string key, std::string value) { meta_[std::move(key)] = std::move(value); }
  bool HasTensor(std::string_view name) const { return tensors_.count(std::string(name)) > 0; }
  // Error naming the key (and the keys that exist) when absent.
  absl::StatusOr<at::Tensor> Tensor(std::string_view name) const;
  absl::StatusOr<const std::vector<std::string>*> Column(std::string_view name) const;
  // Meta value or `fallback` when absent.
  std::string MetaOr(std::string_view key, std::string_view fallback) const;

  // Every tensor has dim >= 1 and all tensors and columns agree on size().
  absl::Status Validate() const;

  // Samples [begin, end).
  absl::StatusOr<Batch> Slice(int64_t begin, int64_t end) const;
  // Splits into `n` contiguous pieces whose sizes differ by at most one
  // (the first size() % n pieces get the extra sample). n may exceed size();
  // then trailing pieces are empty-sized but keep the keys.
  absl::StatusOr<std::vector<Batch>> Chunk(int n) const;
  // Concatenates along the sample dimension. All parts must have the same
  // tensor and column keys, with matching dtypes and trailing shapes. Meta
  // is taken from the first part.
  static absl::StatusOr<Batch> Concat(const std::vector<Batch>& parts);
  // Samples at `indices` (in that order, repeats allowed).
  absl::StatusOr<Batch> Select(const std::vector<int64_t>& indices) const;
  // Adds the keys of `other` (same size()). A key present in both must hold
  // equal values, otherwise it is an error naming the key.
  absl::Status Union(const Batch& other);
  // Each sample `times` times. interleave=true: a a b b; false: a b a b.
  Batch Repeat(int times, bool interleave = true) const;

 private:
  std::map<std::string, at::Tensor> tensors_;
  std::map<std::string, std::vector<std::string>> columns_;
  std::map<std::string, std::string> meta_;
};

// Compact binary wire encoding: a small header, then raw little-endian
// tensor bytes (contiguous, CPU). Decode validates everything it reads and
// returns InvalidArgument naming what is wrong for truncated or malformed
// input; it never crashes on hostile bytes.
std::string EncodeBatch(const Batch& batch);
void EncodeBatchTo(const Batch& batch, std::string* out);
absl::StatusOr<Batch> DecodeBatch(std::string_view bytes);

}  // namespace roll
