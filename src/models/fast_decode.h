#pragma once
// Private to the transformer: the decode step of a float32 model on the CPU
// for small batches, as plain loops over raw memory with AVX2/FMA kernels.
//
// Why: at batch 1..8 a decode step reads every weight once and does little
// else, so its time is the matrix-vector products plus the cost of issuing
// some twenty LibTorch ops per layer. LibTorch's products with a single row
// (addmm with M = 1) run at about a third of the rate a plain
// register-blocked dot-product loop reaches on the same weights, and each op
// costs microseconds of dispatch. Here a layer is eight loops and four
// products, with no allocation beyond one scratch buffer per step.
//
// Same formulas as the LibTorch path (transformer_internal.h): HF RMSNorm in
// float32, rotary on the two halves, grouped-query attention with a float32
// softmax, SiLU-gated MLP, residual adds. Results agree with it to float32
// rounding (summation order differs), not bit for bit.
//
// Threads: the attention (split over sequences) and the small-batch
// products (split over output rows) run on LibTorch's intra-op OpenMP pool
// with at::parallel_for (fast_decode.cc is compiled with OpenMP for that);
// larger products go to the BLAS, which runs on the same pool
// (cmake/RollBlas.cmake). Callers serialize steps per model.

#include <cstdint>
#include <vector>

namespace roll::models_internal {

// Raw views of one layer's weights (row-major [out, in], as HF stores
// them) and of its KV cache buffers [slots, kv_heads, max_len, head_dim].
// Biases and the q/k norm weights are null when the model has none.
struct FastDecodeLayer {
  const float* input_norm = nullptr;
  const float* post_norm = nullptr;
  const float* qkv_w = nullptr;  // [(H + 2 KV) * hd, hidden]
  const float* qkv_b = nullptr;
  const float* qk_norm = nullptr;  // [H + KV, hd] (qwen3)
  const float* o_w = nullptr;      // [hidden, H * hd]
  const float* o_b = nullptr;
  const float* gate_up_w = nullptr;  // [2 * inter, hidden]
  const float* gate_up_b = nullptr;
  const float* down_w = nullptr;  // [hidden, inter]
  const float* down_b = nullptr;
  float* k_cache = nullptr;
  float* v_cache = nullptr;
};

struct FastDecodeModel {
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, inter = 0, vocab = 0, max_len = 0;
  float eps = 1e-6f;
  const float* embed = nullptr;     // [vocab, hidden]
  const float* norm = nullptr;      // [hidden]
  const float* lm_head = nullptr;   // [vocab, hidden]
  const float* inv_freq = nullptr;  // [head_dim / 2]
  std::vector<FastDecodeLayer> layers;
};

// Up to this many sequences the products run the hand-written kernel;
// above, they are matrix products and run LibTorch's GEMM (everything else
// stays hand-written).
inline constexpr int64_t kFastDecodeSmallBatch = 8;

// Whether this CPU has AVX2 and FMA (checked once).
bool FastDecodeAvailable();

// FastDecode calls so far in this process (tests and the bench check that
// the path ran).
int64_t FastDecodeSteps();

// One decode step for B sequences: sequence b feeds token tokens[b] at
// position positions[b] (its cached length) of cache slot slots[b]; its new
// key and value are written into every layer's cache at that position.
// Writes the next-token logits [B, vocab] to `logits`. Preconditions
// (checked by the caller): valid slots and tokens, positions < max_len,
// head_dim even.
void FastDecode(const FastDecodeModel& m, const int64_t* slots, const int64_t* positions,
                const int64_t* tokens, int64_t B, float* logits);

}  // namespace roll::models_internal
