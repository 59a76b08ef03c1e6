#pragma once
// Batched next-token sampling for the generation engine.
//
// One call samples a token for every row of a [B, vocab] logits tensor, each
// row with its own temperature, top-k, top-p and random draw. Rows are
// grouped by what they need (greedy rows take an argmax, rows without
// truncation skip the sort, truncated rows share one top-k or sort), and each
// group is processed with a handful of tensor ops; nothing here syncs with
// the host.
//
// The processed distribution of a row (the one its token is drawn from and
// whose log-prob is returned):
//   greedy (temperature 0): the raw logits; the token is their argmax and the
//     log-prob is log_softmax(raw logits) at it.
//   otherwise: logits / temperature, then top-k (keep the k largest; ties at
//     the boundary are broken by the sort), then top-p over the renormalized
//     top-k survivors (keep the shortest prefix, in descending order, whose
//     mass reaches top_p: a token is kept when the mass strictly before it is
//     below top_p, so the most likely token always survives). The log-prob
//     is log_softmax of these masked logits at the sampled token, i.e. the
//     log of its renormalized probability.
//
// Randomness is a per-row uniform in [0, 1) supplied by the caller (the
// engine derives it from the request's seed and the token's position with
// CounterUniform), mapped through the inverse CDF of the processed
// distribution: a row's token depends only on its own logits, parameters
// and draw, not on the other rows.
//
// Thread-safety: stateless functions.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "roll/common/status.h"

namespace roll::strategies_internal {

struct RowSampling {
  double temperature = 1.0;  // 0: greedy; must be >= 0
  int64_t top_k = 0;         // <= 0 or >= vocab: off
  double top_p = 1.0;        // in (0, 1]; 1: off
  double uniform = 0.0;      // the row's random draw, in [0, 1)
};

struct SampledTokens {
  at::Tensor ids;       // [B] int64, on the logits' device
  at::Tensor logprobs;  // [B] float32: log-prob under the processed distribution
};

// Samples one token per row of `logits` [B, V] (any floating dtype).
// InvalidArgument when rows.size() != B or a parameter is out of range.
absl::StatusOr<SampledTokens> SampleTokens(const at::Tensor& logits,
                                           const std::vector<RowSampling>& rows);

// The processed logits of every row as [B, V] float32 in vocabulary order,
// -inf where top-k/top-p removed a token (greedy rows: the raw logits). For
// tests and inspection; SampleTokens works on the same values.
absl::StatusOr<at::Tensor> ProcessedLogits(const at::Tensor& logits,
                                           const std::vector<RowSampling>& rows);

// A uniform in [0, 1) (24 random bits: the resolution of a float32 CDF)
// that depends only on (seed, counter): a counter-based generator, so a
// sample's draws do not depend on what else runs in the batch.
double CounterUniform(uint64_t seed, uint64_t counter);

// Combines two 64-bit values into a well-mixed seed (e.g. a request seed and
// a sample index).
uint64_t MixSeed(uint64_t a, uint64_t b);

}  // namespace roll::strategies_internal
