#include "models/fast_decode.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

namespace roll::models_internal {
namespace {

#define ROLL_AVX2 __attribute__((target("avx2,fma")))

ROLL_AVX2 inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The eight sums of c0..c7, in order, as one vector: a tree of horizontal
// adds (9 instructions instead of 8 separate reductions).
ROLL_AVX2 inline __m256 HSum8(__m256 c0, __m256 c1, __m256 c2, __m256 c3, __m256 c4, __m256 c5, __m256 c6,
                              __m256 c7) {
  const __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(c0, c1), _mm256_hadd_ps(c2, c3));
  const __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(c4, c5), _mm256_hadd_ps(c6, c7));
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// The four sums of c0..c3, in order.
ROLL_AVX2 inline __m128 HSum4(__m256 c0, __m256 c1, __m256 c2, __m256 c3) {
  const __m256 u = _mm256_hadd_ps(_mm256_hadd_ps(c0, c1), _mm256_hadd_ps(c2, c3));
  return _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
}

ROLL_AVX2 float Dot(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float s = HSum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// e^x for eight floats: x = n ln2 + r with |r| <= ln2/2, e^r by its
// degree-6 Taylor polynomial (relative error below 2e-7 on that range,
// about float32's rounding), times 2^n built in the exponent bits. Inputs
// are clamped to [-87.3, 88.376], where e^x is a normal float; a NaN stays
// NaN (min/max return their second operand when either is NaN).
ROLL_AVX2 inline __m256 Exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(88.3762626f), _mm256_max_ps(_mm256_set1_ps(-87.3f), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // r = x - n ln2, ln2 split in two so that n * ln2_hi is exact.
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// v[t] = e^(v[t] - shift) over n floats; returns their sum.
ROLL_AVX2 float ExpShifted(float* v, int64_t n, float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = Exp8(_mm256_sub_ps(_mm256_loadu_ps(v + i), s));
    _mm256_storeu_ps(v + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = HSum(acc);
  for (; i < n; ++i) {
    v[i] = std::exp(v[i] - shift);
    sum += v[i];
  }
  return sum;
}

// out[i] = silu(gate[i]) * up[i] = gate / (1 + e^-gate) * up.
ROLL_AVX2 void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 den = _mm256_add_ps(one, Exp8(_mm256_sub_ps(_mm256_setzero_ps(), g)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, den), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

// y += a * x over n floats.
ROLL_AVX2 void Axpy(float a, const float* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

// Rows [lo, hi) of y[M, N] = x[M, K] W[N, K]^T + bias, added to y when
// `accumulate` (the residual). Four weight rows against two input rows at a
// time: eight accumulators, each weight vector loaded once per pair.
ROLL_AVX2 void LinearRows(const float* x, int64_t M, int64_t K, const float* W, const float* bias,
                          int64_t N, int64_t lo, int64_t hi, float* y, bool accumulate) {
  auto put = [&](int64_t m, int64_t j, float v) {
    float& o = y[m * N + j];
    const float t = bias != nullptr ? bias[j] + v : v;
    o = accumulate ? o + t : t;
  };
  int64_t i = lo;
  for (; i + 4 <= hi; i += 4) {
    const float* w0 = W + i * K;
    const float* w1 = w0 + K;
    const float* w2 = w1 + K;
    const float* w3 = w2 + K;
    {
      // Ask for the rows two blocks ahead now (weights and cached keys come
      // from memory); prefetching past the end of W does not fault.
      const char* ahead = reinterpret_cast<const char*>(W + (i + 8) * K);
      for (int64_t b = 0; b < 4 * K * 4; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
    }
    int64_t m = 0;
    for (; m + 2 <= M; m += 2) {
      const float* x0 = x + m * K;
      const float* x1 = x0 + K;
      __m256 c00 = _mm256_setzero_ps(), c01 = c00, c02 = c00, c03 = c00;
      __m256 c10 = c00, c11 = c00, c12 = c00, c13 = c00;
      int64_t k = 0;
      for (; k + 8 <= K; k += 8) {
        const __m256 a = _mm256_loadu_ps(x0 + k), b = _mm256_loadu_ps(x1 + k);
        const __m256 v0 = _mm256_loadu_ps(w0 + k), v1 = _mm256_loadu_ps(w1 + k);
        const __m256 v2 = _mm256_loadu_ps(w2 + k), v3 = _mm256_loadu_ps(w3 + k);
        c00 = _mm256_fmadd_ps(v0, a, c00);
        c01 = _mm256_fmadd_ps(v1, a, c01);
        c02 = _mm256_fmadd_ps(v2, a, c02);
        c03 = _mm256_fmadd_ps(v3, a, c03);
        c10 = _mm256_fmadd_ps(v0, b, c10);
        c11 = _mm256_fmadd_ps(v1, b, c11);
        c12 = _mm256_fmadd_ps(v2, b, c12);
        c13 = _mm256_fmadd_ps(v3, b, c13);
      }
      alignas(32) float r[8];
      _mm256_store_ps(r, HSum8(c00, c01, c02, c03, c10, c11, c12, c13));
      for (; k < K; ++k) {
        r[0] += w0[k] * x0[k];
        r[1] += w1[k] * x0[k];
        r[2] += w2[k] * x0[k];
        r[3] += w3[k] * x0[k];
        r[4] += w0[k] * x1[k];
        r[5] += w1[k] * x1[k];
        r[6] += w2[k] * x1[k];
        r[7] += w3[k] * x1[k];
      }
      for (int j = 0; j < 4; ++j) {
        put(m, i + j, r[j]);
        put(m + 1, i + j, r[4 + j]);
      }
    }
    for (; m < M; ++m) {
      const float* x0 = x + m * K;
      __m256 c0 = _mm256_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
      int64_t k = 0;
      for (; k + 8 <= K; k += 8) {
        const __m256 a = _mm256_loadu_ps(x0 + k);
        c0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), a, c0);
        c1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + k), a, c1);
        c2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + k), a, c2);
        c3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + k), a, c3);
      }
      alignas(16) float r[4];
      _mm_store_ps(r, HSum4(c0, c1, c2, c3));
      for (; k < K; ++k) {
        r[0] += w0[k] * x0[k];
        r[1] += w1[k] * x0[k];
        r[2] += w2[k] * x0[k];
        r[3] += w3[k] * x0[k];
      }
      for (int j = 0; j < 4; ++j) put(m, i + j, r[j]);
    }
  }
  for (; i < hi; ++i) {
    for (int64_t m = 0; m < M; ++m) put(m, i, Dot(x + m * K, W + i * K, K));
  }
}

// out[:] = sum_t p[t] * v[t, :] over L rows of width n: the output chunk
// stays in registers while the rows stream by. Eight accumulators, so that
// the FMAs are not waiting on each other: a 64-float chunk in one pass over
// the rows, a 32-float chunk with even and odd rows apart.
ROLL_AVX2 void WeightedSum(const float* p, int64_t L, const float* v, int64_t n, float* out) {
  int64_t d = 0;
  for (; d + 64 <= n; d += 64) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (int64_t t = 0; t < L; ++t) {
      const __m256 w = _mm256_set1_ps(p[t]);
      const float* r = v + t * n + d;
      const char* ahead = reinterpret_cast<const char*>(r + 8 * n);  // 8 rows ahead
      _mm_prefetch(ahead, _MM_HINT_T0);
      _mm_prefetch(ahead + 64, _MM_HINT_T0);
      _mm_prefetch(ahead + 128, _MM_HINT_T0);
      _mm_prefetch(ahead + 192, _MM_HINT_T0);
      a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r), a0);
      a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + 8), a1);
      a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + 16), a2);
      a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + 24), a3);
      a4 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + 32), a4);
      a5 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + 40), a5);
      a6 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + 48), a6);
      a7 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + 56), a7);
    }
    _mm256_storeu_ps(out + d, a0);
    _mm256_storeu_ps(out + d + 8, a1);
    _mm256_storeu_ps(out + d + 16, a2);
    _mm256_storeu_ps(out + d + 24, a3);
    _mm256_storeu_ps(out + d + 32, a4);
    _mm256_storeu_ps(out + d + 40, a5);
    _mm256_storeu_ps(out + d + 48, a6);
    _mm256_storeu_ps(out + d + 56, a7);
  }
  for (; d + 32 <= n; d += 32) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    int64_t t = 0;
    for (; t + 2 <= L; t += 2) {
      const __m256 w = _mm256_set1_ps(p[t]), u = _mm256_set1_ps(p[t + 1]);
      const float* r = v + t * n + d;
      const float* q = r + n;
      a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r), a0);
      a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + 8), a1);
      a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + 16), a2);
      a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + 24), a3);
      b0 = _mm256_fmadd_ps(u, _mm256_loadu_ps(q), b0);
      b1 = _mm256_fmadd_ps(u, _mm256_loadu_ps(q + 8), b1);
      b2 = _mm256_fmadd_ps(u, _mm256_loadu_ps(q + 16), b2);
      b3 = _mm256_fmadd_ps(u, _mm256_loadu_ps(q + 24), b3);
    }
    for (; t < L; ++t) {
      const __m256 w = _mm256_set1_ps(p[t]);
      const float* r = v + t * n + d;
      a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r), a0);
      a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + 8), a1);
      a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + 16), a2);
      a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(r + 24), a3);
    }
    _mm256_storeu_ps(out + d, _mm256_add_ps(a0, b0));
    _mm256_storeu_ps(out + d + 8, _mm256_add_ps(a1, b1));
    _mm256_storeu_ps(out + d + 16, _mm256_add_ps(a2, b2));
    _mm256_storeu_ps(out + d + 24, _mm256_add_ps(a3, b3));
  }
  if (d < n) {
    std::fill(out + d, out + n, 0.0f);
    for (int64_t t = 0; t < L; ++t) Axpy(p[t], v + t * n + d, out + d, n - d);
  }
}

// v[t] *= a over n floats; returns the largest result (-inf when n is 0).
ROLL_AVX2 float ScaleMax(float* v, int64_t n, float a) {
  const __m256 av = _mm256_set1_ps(a);
  __m256 mx = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(v + i), av);
    _mm256_storeu_ps(v + i, x);
    mx = _mm256_max_ps(mx, x);
  }
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  float r = _mm_cvtss_f32(m);
  for (; i < n; ++i) {
    v[i] *= a;
    r = std::max(r, v[i]);
  }
  return r;
}

// v[i] *= a over n floats.
ROLL_AVX2 void Scale(float* v, int64_t n, float a) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(v + i, _mm256_mul_ps(_mm256_loadu_ps(v + i), av));
  for (; i < n; ++i) v[i] *= a;
}

// y[M, N] (+)= x W^T + bias. Up to kFastDecodeSmallBatch rows: the
// kernel above, output rows split over the intra-op threads in chunks of at
// least ~64K weights. More rows make it a matrix product, LibTorch's GEMM,
// with the output columns split over the intra-op threads here and each
// block one single-threaded product. Left to MKL's own threading (LibTorch
// 2.11), these few-row products between the decode step's other parallel
// regions made batch-64 decode 1.2-1.3x slower on 2 cores
// (docs/benchmarks.md).
void Linear(const float* x, int64_t M, int64_t K, const float* W, const float* bias, int64_t N, float* y,
            bool accumulate) {
  if (M > kFastDecodeSmallBatch) {
    // The bias as a plain loop over the rows: a few microseconds of work,
    // less than starting a parallel region for it.
    if (bias != nullptr) {
      for (int64_t m = 0; m < M; ++m) {
        float* row = y + m * N;
        if (accumulate) {
          for (int64_t j = 0; j < N; ++j) row[j] += bias[j];
        } else {
          std::copy_n(bias, N, row);
        }
      }
    }
    const float beta = (accumulate || bias != nullptr) ? 1.0f : 0.0f;  // 0: y is not read
    const at::TensorOptions f32 = at::TensorOptions().dtype(at::kFloat);
    at::Tensor xt = at::from_blob(const_cast<float*>(x), {M, K}, f32);
    at::Tensor wt = at::from_blob(const_cast<float*>(W), {N, K}, f32);
    at::Tensor yt = at::from_blob(y, {M, N}, f32);
    // Column blocks of at least 64, one per thread; a block's product runs
    // inside the parallel region, where LibTorch and the BLAS stay serial.
    const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
    const int64_t block = std::max<int64_t>(64, (N + threads - 1) / threads);
    // The pool's threads do not inherit the caller's inference mode, and the
    // views of inference tensors must be made in it.
    const bool inference = c10::InferenceMode::is_enabled();
    at::parallel_for(0, N, block, [&](int64_t lo, int64_t hi) {
      c10::InferenceMode mode(inference);
      at::Tensor ys = yt.narrow(1, lo, hi - lo);
      ys.addmm_(xt, wt.narrow(0, lo, hi - lo).t(), beta);
    });
    return;
  }
  const int64_t grain = std::max<int64_t>(64, (int64_t{1} << 16) / std::max<int64_t>(K, 1));
  at::parallel_for(0, N, grain, [&](int64_t lo, int64_t hi) {
    LinearRows(x, M, K, W, bias, N, lo, hi, y, accumulate);
  });
}

// HF RMSNorm: weight * (x * rsqrt(mean(x^2) + eps)).
ROLL_AVX2 void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out) {
  const float mean = Dot(x, x, n) / static_cast<float>(n);
  const float inv = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = w[i] * (x[i] * inv);
}

}  // namespace

bool FastDecodeAvailable() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
}

namespace {
std::atomic<int64_t> fast_decode_steps{0};
}  // namespace

int64_t FastDecodeSteps() { return fast_decode_steps.load(std::memory_order_relaxed); }

void FastDecode(const FastDecodeModel& m, const int64_t* slots, const int64_t* positions,
                const int64_t* tokens, int64_t B, float* logits) {
  fast_decode_steps.fetch_add(1, std::memory_order_relaxed);
  const int64_t D = m.hidden, H = m.heads, KV = m.kv_heads, hd = m.head_dim, half = hd / 2;
  const int64_t G = H / KV, I = m.inter, QKV = (H + 2 * KV) * hd;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));

  int64_t max_pos = 0;
  for (int64_t b = 0; b < B; ++b) max_pos = std::max(max_pos, positions[b]);
  std::vector<float> scratch(2 * B * D + B * QKV + B * H * hd + 3 * B * I + 2 * B * half);
  float* x = scratch.data();
  float* h = x + B * D;
  float* qkv = h + B * D;
  float* attn = qkv + B * QKV;
  float* gu = attn + B * H * hd;
  float* act = gu + 2 * B * I;
  float* cosv = act + B * I;
  float* sinv = cosv + B * half;

  for (int64_t b = 0; b < B; ++b) {
    std::copy_n(m.embed + tokens[b] * D, D, x + b * D);
    const float p = static_cast<float>(positions[b]);
    for (int64_t i = 0; i < half; ++i) {
      const float f = p * m.inv_freq[i];
      cosv[b * half + i] = std::cos(f);
      sinv[b * half + i] = std::sin(f);
    }
  }

  for (const FastDecodeLayer& l : m.layers) {
    for (int64_t b = 0; b < B; ++b) RmsNorm(x + b * D, l.input_norm, D, m.eps, h + b * D);
    Linear(h, B, D, l.qkv_w, l.qkv_b, QKV, qkv, false);
    at::parallel_for(0, B, 4, [&](int64_t b_lo, int64_t b_hi) {
    std::vector<float> scores(G * (max_pos + 1));
    for (int64_t b = b_lo; b < b_hi; ++b) {
      float* row = qkv + b * QKV;
      const float* c = cosv + b * half;
      const float* s = sinv + b * half;
      // q and k heads: optional per-head norm, then rotary on the halves.
      for (int64_t head = 0; head < H + KV; ++head) {
        float* v = row + head * hd;
        if (l.qk_norm != nullptr) RmsNorm(v, l.qk_norm + head * hd, hd, m.eps, v);
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = v[i], x2 = v[i + half];
          v[i] = x1 * c[i] - x2 * s[i];
          v[i + half] = x2 * c[i] + x1 * s[i];
        }
      }
      const int64_t slot = slots[b], pos = positions[b];
      for (int64_t g = 0; g < KV; ++g) {
        const int64_t at_pos = ((slot * KV + g) * m.max_len + pos) * hd;
        std::copy_n(row + (H + g) * hd, hd, l.k_cache + at_pos);
        std::copy_n(row + (H + KV + g) * hd, hd, l.v_cache + at_pos);
      }
      // Attention of each query head over positions 0..pos of its KV head:
      // the G query heads of a KV head (adjacent in the row) score all
      // cached keys in one small product.
      const int64_t L = pos + 1;
      for (int64_t g = 0; g < KV; ++g) {
        const float* keys = l.k_cache + (slot * KV + g) * m.max_len * hd;
        const float* values = l.v_cache + (slot * KV + g) * m.max_len * hd;
        LinearRows(row + g * G * hd, G, hd, keys, nullptr, L, 0, L, scores.data(), false);
        for (int64_t j = 0; j < G; ++j) {
          // Softmax over the scaled scores; its normalization is applied
          // to the weighted sum (hd products instead of L).
          float* sc = scores.data() + j * L;
          const float mx = ScaleMax(sc, L, scale);
          const float sum = ExpShifted(sc, L, mx);
          float* out = attn + (b * H + g * G + j) * hd;
          WeightedSum(sc, L, values, hd, out);
          Scale(out, hd, 1.0f / sum);
        }
      }
    }
    });
    Linear(attn, B, H * hd, l.o_w, l.o_b, D, x, true);
    for (int64_t b = 0; b < B; ++b) RmsNorm(x + b * D, l.post_norm, D, m.eps, h + b * D);
    Linear(h, B, D, l.gate_up_w, l.gate_up_b, 2 * I, gu, false);
    for (int64_t b = 0; b < B; ++b) {
      const float* g = gu + b * 2 * I;
      SiluMul(g, g + I, I, act + b * I);
    }
    Linear(act, B, I, l.down_w, l.down_b, D, x, true);
  }
  for (int64_t b = 0; b < B; ++b) RmsNorm(x + b * D, m.norm, D, m.eps, h + b * D);
  Linear(h, B, D, m.lm_head, nullptr, m.vocab, logits, false);
}

}  // namespace roll::models_internal
