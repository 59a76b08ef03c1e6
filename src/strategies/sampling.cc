#include "strategies/sampling.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace roll::strategies_internal {

namespace {

enum class Kind { kGreedy, kPlain, kTruncated };

bool TopKActive(const RowSampling& r, int64_t vocab) { return r.top_k > 0 && r.top_k < vocab; }

Kind KindOf(const RowSampling& r, int64_t vocab) {
  if (r.temperature == 0.0) return Kind::kGreedy;
  return TopKActive(r, vocab) || r.top_p < 1.0 ? Kind::kTruncated : Kind::kPlain;
}

absl::Status Validate(const at::Tensor& logits, const std::vector<RowSampling>& rows) {
  if (!logits.defined() || logits.dim() != 2 || !c10::isFloatingType(logits.scalar_type())) {
    return absl::InvalidArgumentError("sampling: logits must be a floating [batch, vocab] tensor");
  }
  if (logits.size(0) != static_cast<int64_t>(rows.size())) {
    return absl::InvalidArgumentError(absl::StrCat("sampling: ", logits.size(0), " logit rows but ",
                                                   rows.size(), " sampling parameter sets"));
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const RowSampling& r = rows[i];
    if (!(r.temperature >= 0.0) || !std::isfinite(r.temperature)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling: row ", i, ": temperature ", r.temperature, " must be >= 0"));
    }
    if (!(r.top_p > 0.0 && r.top_p <= 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling: row ", i, ": top_p ", r.top_p, " must be in (0, 1]"));
    }
    if (!(r.uniform >= 0.0 && r.uniform < 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("sampling: row ", i, ": uniform draw ", r.uniform, " not in [0, 1)"));
    }
  }
  return absl::OkStatus();
}

template <typename T>
at::Tensor HostTensor(const std::vector<T>& values, at::ScalarType dtype, const at::Device& dev) {
  at::Tensor t = at::empty({static_cast<int64_t>(values.size())}, dtype);
  std::copy(values.begin(), values.end(), t.data_ptr<T>());
  return dev.is_cpu() ? t : t.to(dev);
}

// Inverse-CDF draw: for each row the first position whose cumulative mass
// exceeds uniform * total. The target is kept strictly below the total so
// that rounding can never select a zero-probability tail position (the CDF
// is flat over them, so searching "right" skips them).
at::Tensor DrawFromCdf(const at::Tensor& cdf, const at::Tensor& uniform) {
  const at::Tensor total = cdf.select(1, cdf.size(1) - 1);
  at::Tensor target = at::minimum(uniform * total, at::nextafter(total, at::zeros_like(total)));
  return at::searchsorted(cdf, target.unsqueeze(1).contiguous(), /*out_int32=*/false,
                          /*right=*/true)
      .squeeze(1);
}

struct Group {
  std::vector<int64_t> rows;
  std::vector<float> inv_temperature, top_p, uniform;
  std::vector<int64_t> top_k;
  bool any_top_p = false;
  bool all_top_k = true;  // every row has an active top-k
  int64_t max_top_k = 0;
};

struct GroupResult {
  at::Tensor ids, logprobs;
  at::Tensor processed;  // [G, V], only when asked for
};

GroupResult RunGroup(Kind kind, const Group& g, const at::Tensor& logits, bool want_processed) {
  const at::Device dev = logits.device();
  const int64_t V = logits.size(1);
  const int64_t G = static_cast<int64_t>(g.rows.size());
  at::Tensor sub =
      G == logits.size(0) ? logits : logits.index_select(0, HostTensor(g.rows, at::kLong, dev));
  GroupResult out;
  if (kind == Kind::kGreedy) {
    auto [best, arg] = sub.max(1);
    out.ids = arg;
    out.logprobs = best - sub.logsumexp(1);
    if (want_processed) out.processed = sub;
    return out;
  }
  const at::Tensor uniform = HostTensor(g.uniform, at::kFloat, dev);
  at::Tensor scaled = sub * HostTensor(g.inv_temperature, at::kFloat, dev).unsqueeze(1);
  if (kind == Kind::kPlain) {
    const at::Tensor lse = scaled.logsumexp(1, /*keepdim=*/true);
    const at::Tensor cdf = (scaled - lse).exp_().cumsum(1);
    out.ids = DrawFromCdf(cdf, uniform);
    out.logprobs = (scaled.gather(1, out.ids.unsqueeze(1)) - lse).squeeze(1);
    if (want_processed) out.processed = scaled;
    return out;
  }
  // Truncated rows work in descending order. Top-p acts on the top-k
  // survivors only, so when every row has a top-k the largest k suffices.
  at::Tensor vals, order;
  if (g.all_top_k) {
    std::tie(vals, order) = scaled.topk(g.max_top_k, 1, /*largest=*/true, /*sorted=*/true);
  } else {
    std::tie(vals, order) = scaled.sort(1, /*descending=*/true);
  }
  const int64_t K = vals.size(1);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const at::Tensor rank = at::arange(K, at::TensorOptions().dtype(at::kLong).device(dev));
  vals = vals.masked_fill(rank.unsqueeze(0) >= HostTensor(g.top_k, at::kLong, dev).unsqueeze(1),
                          neg_inf);
  if (g.any_top_p) {
    const at::Tensor probs = vals.softmax(1);
    const at::Tensor mass_before = probs.cumsum(1) - probs;
    vals =
        vals.masked_fill(mass_before >= HostTensor(g.top_p, at::kFloat, dev).unsqueeze(1), neg_inf);
  }
  const at::Tensor lse = vals.logsumexp(1, /*keepdim=*/true);
  const at::Tensor cdf = (vals - lse).exp().cumsum(1);
  const at::Tensor pos = DrawFromCdf(cdf, uniform).unsqueeze(1);
  out.ids = order.gather(1, pos).squeeze(1);
  out.logprobs = (vals.gather(1, pos) - lse).squeeze(1);
  if (want_processed) {
    out.processed = at::full({G, V}, neg_inf, vals.options()).scatter_(1, order, vals);
  }
  return out;
}

absl::StatusOr<std::pair<SampledTokens, at::Tensor>> Run(const at::Tensor& logits_in,
                                                         const std::vector<RowSampling>& rows,
                                                         bool want_processed) {
  ROLL_RETURN_IF_ERROR(Validate(logits_in, rows));
  try {
    c10::InferenceMode guard;
    const at::Tensor logits =
        logits_in.scalar_type() == at::kFloat ? logits_in : logits_in.to(at::kFloat);
    const int64_t B = logits.size(0), V = logits.size(1);
    Group groups[3];
    for (int64_t i = 0; i < B; ++i) {
      const RowSampling& r = rows[i];
      const Kind kind = KindOf(r, V);
      Group& g = groups[static_cast<int>(kind)];
      g.rows.push_back(i);
      if (kind == Kind::kGreedy) continue;
      g.inv_temperature.push_back(static_cast<float>(1.0 / r.temperature));
      g.uniform.push_back(static_cast<float>(r.uniform));
      const bool top_k = TopKActive(r, V);
      g.top_k.push_back(top_k ? r.top_k : V);
      g.all_top_k = g.all_top_k && top_k;
      g.max_top_k = std::max(g.max_top_k, top_k ? r.top_k : V);
      // Rows without top-p get a bound the mass before a token never reaches
      // (1.0 could be, by rounding, and would cut the tail).
      g.top_p.push_back(r.top_p < 1.0 ? static_cast<float>(r.top_p) : 2.0f);
      g.any_top_p = g.any_top_p || r.top_p < 1.0;
    }
    SampledTokens out;
    at::Tensor processed;
    int used = 0;
    for (const Group& g : groups) used += g.rows.empty() ? 0 : 1;
    for (int k = 0; k < 3; ++k) {
      const Group& g = groups[k];
      if (g.rows.empty()) continue;
      GroupResult r = RunGroup(static_cast<Kind>(k), g, logits, want_processed);
      if (used == 1) {  // the common case: one group holds every row, in order
        out.ids = r.ids;
        out.logprobs = r.logprobs;
        processed = r.processed;
        break;
      }
      if (!out.ids.defined()) {
        out.ids = at::empty({B}, r.ids.options());
        out.logprobs = at::empty({B}, r.logprobs.options());
        if (want_processed) processed = at::empty({B, V}, logits.options());
      }
      const at::Tensor index = HostTensor(g.rows, at::kLong, logits.device());
      out.ids.index_copy_(0, index, r.ids);
      out.logprobs.index_copy_(0, index, r.logprobs);
      if (want_processed) processed.index_copy_(0, index, r.processed);
    }
    return std::make_pair(std::move(out), std::move(processed));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("sampling: ", e.what_without_backtrace()));
  }
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

absl::StatusOr<SampledTokens> SampleTokens(const at::Tensor& logits,
                                           const std::vector<RowSampling>& rows) {
  ROLL_ASSIGN_OR_RETURN(auto out, Run(logits, rows, /*want_processed=*/false));
  return std::move(out.first);
}

absl::StatusOr<at::Tensor> ProcessedLogits(const at::Tensor& logits,
                                           const std::vector<RowSampling>& rows) {
  ROLL_ASSIGN_OR_RETURN(auto out, Run(logits, rows, /*want_processed=*/true));
  return std::move(out.second);
}

uint64_t MixSeed(uint64_t a, uint64_t b) {
  return SplitMix64(SplitMix64(a) ^ (b * 0xD6E8FEB86659FD93ull));
}

double CounterUniform(uint64_t seed, uint64_t counter) {
  const uint64_t bits = MixSeed(seed, counter) >> 40;  // top 24 bits
  return static_cast<double>(bits) * (1.0 / static_cast<double>(1ull << 24));
}

}  // namespace roll::strategies_internal
