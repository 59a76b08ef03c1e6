#pragma once
// Private to the transformer: the per-layer parameter block, the fused
// inference weights, and the math shared by the full-sequence and the
// incremental paths (kept in one place so both follow the HF formulas
// identically).

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_join.h"
#include "models/fast_decode.h"
#include "roll/models/transformer.h"

namespace roll {

struct CausalLM::Layer {
  at::Tensor input_norm, post_norm;
  at::Tensor q_w, q_b, k_w, k_b, v_w, v_b, o_w, o_b;  // biases undefined when absent
  at::Tensor q_norm, k_norm;                          // qwen3 only
  at::Tensor gate_w, gate_b, up_w, up_b, down_w, down_b;
};

// Runtime-only concatenations of parameters for the decode path. `sources`
// records each parameter's storage and version counter at build time, so a
// later in-place update (optimizer step, weight sync, load) or a replaced
// tensor is noticed and the fusion rebuilt.
struct CausalLM::FusedWeights {
  struct Source {
    const void* data = nullptr;
    int64_t version = 0;
  };
  struct LayerWeights {
    at::Tensor qkv_w, qkv_b;          // [(H + 2 KV) * hd, hidden], bias or undefined
    at::Tensor qk_norm;               // qwen3: [H + KV, hd] (q_norm rows then k_norm rows)
    at::Tensor gate_up_w, gate_up_b;  // [2 * intermediate, hidden]
  };
  std::vector<Source> sources;
  std::vector<LayerWeights> layers;
  // Raw views for FastDecode (cache pointers filled per step); set when the
  // model qualifies: float32 on the CPU, every weight contiguous.
  std::optional<models_internal::FastDecodeModel> fast;
  at::Tensor lm_head;  // float32 copy when fp32 logits need one, else the weight itself
};

namespace models_internal {

enum class Init { kNormal, kZero, kOne };

inline std::string ShapeString(const std::vector<int64_t>& shape) {
  return "[" + absl::StrJoin(shape, ", ") + "]";
}

// HF RMSNorm: normalize in float32, cast back, then scale by the weight.
inline at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, float eps) {
  const bool is_float = x.scalar_type() == at::kFloat;
  at::Tensor xf = is_float ? x : x.to(at::kFloat);
  at::Tensor inv = at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  at::Tensor y = xf * inv;
  if (!is_float) y = y.to(x.scalar_type());
  return weight * y;
}

// cos and sin of position * inv_freq, [B, T, 1, hd/2] in `dtype` (HF
// computes them in float32 and casts to the activations' dtype).
inline std::tuple<at::Tensor, at::Tensor> RopeCosSin(const at::Tensor& positions,
                                                     const at::Tensor& inv_freq,
                                                     c10::ScalarType dtype) {
  at::Tensor freqs = positions.to(at::kFloat).unsqueeze(-1) * inv_freq;
  at::Tensor cos = freqs.cos().unsqueeze(2);
  at::Tensor sin = freqs.sin().unsqueeze(2);
  if (dtype != at::kFloat) {
    cos = cos.to(dtype);
    sin = sin.to(dtype);
  }
  return {cos, sin};
}

// HF's x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1) and
// cos/sin repeated over both halves, written on the halves directly.
// x: [B, T, heads, hd]; cos, sin: [B, T, 1, hd/2].
inline at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  at::Tensor x1 = x.narrow(-1, 0, half);
  at::Tensor x2 = x.narrow(-1, half, half);
  return at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
}

// Grouped-query attention without repeating K/V: the G = H / KV query heads
// that share a key/value head are stacked as rows of one matrix product.
// q: [B, Tq, H, hd]; k, v: [B, KV, L, hd] (any strides); blocked: bool,
// broadcastable to [B, KV, G, Tq, L], true where a query must not look.
// Returns [B, Tq, H * hd]. Softmax runs in float32 as in HF.
// `inplace` scales and masks the scores in the product's own buffer.
inline at::Tensor Attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& blocked, bool inplace) {
  const int64_t B = q.size(0), Tq = q.size(1), H = q.size(2), hd = q.size(3);
  const int64_t KV = k.size(1), L = k.size(2), G = H / KV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  at::Tensor qg = q.permute({0, 2, 1, 3}).reshape({B, KV, G * Tq, hd});
  at::Tensor scores = at::matmul(qg, k.transpose(-1, -2)).view({B, KV, G, Tq, L});
  if (inplace) {
    scores.mul_(scale).masked_fill_(blocked, -std::numeric_limits<float>::infinity());
  } else {
    scores = (scores * scale).masked_fill(blocked, -std::numeric_limits<float>::infinity());
  }
  at::Tensor probs = at::softmax(scores, -1, at::kFloat);
  if (q.scalar_type() != at::kFloat) probs = probs.to(q.scalar_type());
  at::Tensor out = at::matmul(probs.view({B, KV, G * Tq, L}), v);  // [B, KV, G*Tq, hd]
  return out.view({B, H, Tq, hd}).permute({0, 2, 1, 3}).reshape({B, Tq, H * hd});
}

}  // namespace models_internal
}  // namespace roll
