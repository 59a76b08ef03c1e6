// CausalLM's incremental path: prefill and decode steps over KvCache slots.
//
// One routine (ExtendImpl) appends up to T tokens to each of B slots. Per
// step it builds the positions, the rotary tables, the length mask and the
// cache row indices once and shares them across layers; per layer it runs
// one fused q/k/v product, rotary on q and k together, two index_copy_ into
// the cache, attention over the slots' cached prefixes (a zero-copy view of
// the cache unless the slots are scattered widely), and one fused gate/up
// product.

#include <torch/torch.h>

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "models/transformer_internal.h"
#include "roll/models/kv_cache.h"
#include "roll/models/transformer.h"

namespace roll {

namespace {

// Floats in one block of MLP activations during prefill: 16 MB, below
// glibc's largest mmap threshold (32 MB), so blocks reuse heap memory.
constexpr int64_t kMlpBlockFloats = int64_t{4} << 20;

at::Tensor CatDefined(const std::vector<at::Tensor>& parts) {
  for (const at::Tensor& p : parts) {
    if (!p.defined()) return at::Tensor();
  }
  return at::cat(parts, 0);
}

at::Tensor LongTensor(const std::vector<int64_t>& values, const at::Device& device) {
  at::Tensor t = at::empty({static_cast<int64_t>(values.size())}, at::kLong);
  std::copy(values.begin(), values.end(), t.data_ptr<int64_t>());
  return device.is_cpu() ? t : t.to(device, /*non_blocking=*/false);
}

}  // namespace

const CausalLM::FusedWeights& CausalLM::Fused() const {
  const std::vector<at::Tensor> params = Parameters();
  if (fused_ && fused_->sources.size() == params.size()) {
    bool fresh = true;
    for (size_t i = 0; i < params.size() && fresh; ++i) {
      fresh = fused_->sources[i].data == params[i].data_ptr() &&
              fused_->sources[i].version == params[i]._version();
    }
    if (fresh) return *fused_;
  }
  auto f = std::make_unique<FusedWeights>();
  for (const Layer& l : layers_) {
    FusedWeights::LayerWeights w;
    w.qkv_w = at::cat({l.q_w, l.k_w, l.v_w}, 0);
    w.qkv_b = CatDefined({l.q_b, l.k_b, l.v_b});
    if (config_.QkNorm()) {
      w.qk_norm = at::cat({l.q_norm.unsqueeze(0).expand({LocalHeads(), -1}),
                           l.k_norm.unsqueeze(0).expand({LocalKvHeads(), -1})},
                          0);
    }
    w.gate_up_w = at::cat({l.gate_w, l.up_w}, 0);
    w.gate_up_b = CatDefined({l.gate_b, l.up_b});
    f->layers.push_back(std::move(w));
  }
  if (options_.lm_head) {
    const at::Tensor& head = LmHeadWeight();
    f->lm_head = (options_.fp32_logits && head.scalar_type() != at::kFloat)
                     ? head.to(at::kFloat)
                     : head;
  }
  // Raw views for the fast decode path, when the model qualifies.
  auto fast_view = [this](const FusedWeights& f) -> std::optional<models_internal::FastDecodeModel> {
    const ModelConfig& c = config_;
    // Tensor-parallel slices take the LibTorch path (it has the reductions).
    if (!embed_tokens_.device().is_cpu() || !f.lm_head.defined() || c.head_dim % 2 != 0 ||
        options_.tp_size > 1) {
      return std::nullopt;
    }
    bool ok = true;
    auto ptr = [&ok](const at::Tensor& t) -> const float* {
      if (!t.defined()) return nullptr;
      if (t.scalar_type() != at::kFloat || !t.is_contiguous()) {
        ok = false;
        return nullptr;
      }
      return t.data_ptr<float>();
    };
    models_internal::FastDecodeModel m;
    m.hidden = c.hidden_size;
    m.heads = c.num_attention_heads;
    m.kv_heads = c.num_key_value_heads;
    m.head_dim = c.head_dim;
    m.inter = c.intermediate_size;
    m.vocab = c.vocab_size;
    m.eps = static_cast<float>(c.rms_norm_eps);
    m.embed = ptr(embed_tokens_);
    m.norm = ptr(norm_);
    m.lm_head = ptr(f.lm_head);
    m.inv_freq = ptr(inv_freq_);
    for (size_t i = 0; i < layers_.size(); ++i) {
      const Layer& l = layers_[i];
      const FusedWeights::LayerWeights& w = f.layers[i];
      models_internal::FastDecodeLayer fl;
      fl.input_norm = ptr(l.input_norm);
      fl.post_norm = ptr(l.post_norm);
      fl.qkv_w = ptr(w.qkv_w);
      fl.qkv_b = ptr(w.qkv_b);
      fl.qk_norm = ptr(w.qk_norm);
      fl.o_w = ptr(l.o_w);
      fl.o_b = ptr(l.o_b);
      fl.gate_up_w = ptr(w.gate_up_w);
      fl.gate_up_b = ptr(w.gate_up_b);
      fl.down_w = ptr(l.down_w);
      fl.down_b = ptr(l.down_b);
      m.layers.push_back(fl);
    }
    if (!ok) return std::nullopt;
    return m;
  };
  f->fast = fast_view(*f);
  // Versions are read after the fusion so that nothing above counts.
  for (const at::Tensor& p : params) f->sources.push_back({p.data_ptr(), p._version()});
  fused_ = std::move(f);
  return *fused_;
}

void CausalLM::ReleaseInferenceWeights() const { fused_.reset(); }

void CausalLM::set_fp32_logits(bool on) {
  options_.fp32_logits = on;
  fused_.reset();  // the fused LM head depends on it
}

absl::StatusOr<std::unique_ptr<KvCache>> CausalLM::NewKvCache(int64_t num_slots,
                                                              int64_t max_len) const {
  KvCacheOptions o;
  o.num_layers = config_.num_hidden_layers;
  o.num_kv_heads = LocalKvHeads();
  o.head_dim = config_.head_dim;
  o.num_slots = num_slots;
  o.max_len = max_len;
  o.dtype = options_.dtype;
  o.device = embed_tokens_.device();
  return KvCache::Create(o);
}

absl::Status CausalLM::CheckCache(const KvCache& cache) const {
  const KvCacheOptions& o = cache.options();
  if (o.num_layers != config_.num_hidden_layers || o.num_kv_heads != LocalKvHeads() ||
      o.head_dim != config_.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CausalLM: KV cache shaped for ", o.num_layers, " layers x ", o.num_kv_heads,
        " kv heads x head_dim ", o.head_dim, ", model has ", config_.num_hidden_layers, " x ",
        LocalKvHeads(), " x ", config_.head_dim));
  }
  if (o.dtype != options_.dtype || o.device != embed_tokens_.device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CausalLM: KV cache is ", c10::toString(o.dtype), " on ", o.device.str(), ", model is ",
        c10::toString(options_.dtype), " on ", embed_tokens_.device().str()));
  }
  if (!options_.lm_head) {
    return absl::FailedPreconditionError("CausalLM: decoding needs a model with an LM head");
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> CausalLM::Prefill(KvCache& cache, const std::vector<int64_t>& slots,
                                             const std::vector<std::vector<int64_t>>& tokens) const {
  ROLL_RETURN_IF_ERROR(CheckCache(cache));
  if (slots.empty() || slots.size() != tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("CausalLM::Prefill: ", slots.size(),
                                                   " slots but ", tokens.size(), " token lists"));
  }
  std::set<int64_t> seen;
  int64_t T = 0;
  std::vector<int64_t> counts;
  for (size_t b = 0; b < slots.size(); ++b) {
    const int64_t slot = slots[b];
    ROLL_RETURN_IF_ERROR(cache.CheckSlot(slot));
    if (!seen.insert(slot).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("CausalLM::Prefill: slot ", slot, " appears twice"));
    }
    const int64_t n = static_cast<int64_t>(tokens[b].size());
    if (n == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("CausalLM::Prefill: no tokens for slot ", slot));
    }
    if (cache.length(slot) + n > cache.max_len()) {
      return absl::OutOfRangeError(absl::StrCat("CausalLM::Prefill: slot ", slot, " holds ",
                                                cache.length(slot), " positions; ", n,
                                                " more exceed max_len ", cache.max_len()));
    }
    for (int64_t id : tokens[b]) {
      if (id < 0 || id >= config_.vocab_size) {
        return absl::OutOfRangeError(absl::StrCat("CausalLM::Prefill: token id ", id,
                                                  " for slot ", slot, " outside vocabulary [0, ",
                                                  config_.vocab_size, ")"));
      }
    }
    counts.push_back(n);
    T = std::max(T, n);
  }
  try {
    c10::InferenceMode guard;
    const int64_t B = static_cast<int64_t>(slots.size());
    at::Tensor ids = at::zeros({B, T}, at::kLong);
    int64_t* p = ids.data_ptr<int64_t>();
    for (int64_t b = 0; b < B; ++b) std::copy(tokens[b].begin(), tokens[b].end(), p + b * T);
    return ExtendImpl(cache, slots, ids.to(embed_tokens_.device()), counts);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("CausalLM::Prefill: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<at::Tensor> CausalLM::Prefill(KvCache& cache, int64_t slot,
                                             const std::vector<int64_t>& tokens) const {
  return Prefill(cache, std::vector<int64_t>{slot}, std::vector<std::vector<int64_t>>{tokens});
}

absl::StatusOr<at::Tensor> CausalLM::DecodeStep(KvCache& cache, const std::vector<int64_t>& slots,
                                                const at::Tensor& token_ids) const {
  ROLL_RETURN_IF_ERROR(CheckCache(cache));
  const int64_t B = static_cast<int64_t>(slots.size());
  if (B == 0 || !token_ids.defined() || token_ids.numel() != B ||
      c10::isFloatingType(token_ids.scalar_type())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CausalLM::DecodeStep: need one integer token id per slot (", B, " slots)"));
  }
  std::set<int64_t> seen;
  for (int64_t slot : slots) {
    ROLL_RETURN_IF_ERROR(cache.CheckSlot(slot));
    if (!seen.insert(slot).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("CausalLM::DecodeStep: slot ", slot, " appears twice"));
    }
    if (cache.length(slot) >= cache.max_len()) {
      return absl::OutOfRangeError(absl::StrCat("CausalLM::DecodeStep: slot ", slot,
                                                " is full (max_len ", cache.max_len(), ")"));
    }
  }
  try {
    c10::InferenceMode guard;
    // Checking ids on an accelerator would cost a device sync per step; the
    // sampler only produces ids inside the vocabulary.
    if (token_ids.device().is_cpu()) {
      const int64_t lo = token_ids.min().item<int64_t>(), hi = token_ids.max().item<int64_t>();
      if (lo < 0 || hi >= config_.vocab_size) {
        return absl::OutOfRangeError(absl::StrCat("CausalLM::DecodeStep: token id ",
                                                  lo < 0 ? lo : hi, " outside vocabulary [0, ",
                                                  config_.vocab_size, ")"));
      }
    }
    at::Tensor ids = token_ids.reshape({B, 1}).to(embed_tokens_.device(), at::kLong);
    return ExtendImpl(cache, slots, ids, std::vector<int64_t>(B, 1));
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("CausalLM::DecodeStep: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<at::Tensor> CausalLM::DecodeStep(KvCache& cache, const std::vector<int64_t>& slots,
                                                const std::vector<int64_t>& token_ids) const {
  if (token_ids.size() != slots.size()) {
    return absl::InvalidArgumentError(absl::StrCat("CausalLM::DecodeStep: ", slots.size(),
                                                   " slots but ", token_ids.size(), " tokens"));
  }
  at::Tensor ids = at::empty({static_cast<int64_t>(token_ids.size())}, at::kLong);
  std::copy(token_ids.begin(), token_ids.end(), ids.data_ptr<int64_t>());
  return DecodeStep(cache, slots, ids);
}

// Preconditions (checked by the callers): distinct valid slots, counts in
// [1, T], lengths fit, running under InferenceMode.
at::Tensor CausalLM::ExtendImpl(KvCache& cache, const std::vector<int64_t>& slots,
                                const at::Tensor& tokens, const std::vector<int64_t>& counts) const {
  namespace ops = models_internal;
  const ModelConfig& c = config_;
  const FusedWeights& fw = Fused();
  const at::Device dev = embed_tokens_.device();
  const int64_t B = tokens.size(0), T = tokens.size(1);
  const int64_t H = LocalHeads(), KV = LocalKvHeads(), hd = c.head_dim;
  const int64_t inter = LocalIntermediate(), max_len = cache.max_len();
  const float eps = static_cast<float>(c.rms_norm_eps);

  if (T == 1 && fw.fast && options_.fast_decode &&
      models_internal::FastDecodeAvailable()) {
    models_internal::FastDecodeModel m = *fw.fast;
    m.max_len = max_len;
    for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
      m.layers[li].k_cache = cache.keys_[li].data_ptr<float>();
      m.layers[li].v_cache = cache.values_[li].data_ptr<float>();
    }
    std::vector<int64_t> positions(B), ids(B);
    const at::Tensor host_ids = tokens.to(at::kCPU).contiguous();
    for (int64_t b = 0; b < B; ++b) {
      positions[b] = cache.length(slots[b]);
      ids[b] = host_ids.data_ptr<int64_t>()[b];
    }
    at::Tensor logits = at::empty({B, c.vocab_size}, at::kFloat);
    models_internal::FastDecode(m, slots.data(), positions.data(), ids.data(), B, logits.data_ptr<float>());
    for (int64_t b = 0; b < B; ++b) cache.lengths_[slots[b]] += 1;
    return logits;
  }

  // How attention reaches the slots' cached keys. kView: the slots are the
  // ascending range [slots[0], slots[0] + B), a zero-copy view. kRange: the
  // slots lie in a range of at most 2B slots; attention runs over the whole
  // range as a view (rows of slots outside the batch are computed and
  // dropped), which costs less than copying. kGather: copy the slots' prefixes.
  enum class Mode { kView, kRange, kGather };
  const int64_t lo = *std::min_element(slots.begin(), slots.end());
  const int64_t range = *std::max_element(slots.begin(), slots.end()) - lo + 1;
  bool ascending = true;
  for (int64_t b = 1; b < B; ++b) ascending = ascending && slots[b] == slots[0] + b;
  const Mode mode = ascending ? Mode::kView : range <= 2 * B ? Mode::kRange : Mode::kGather;
  const int64_t A = mode == Mode::kRange ? range : B;  // rows attention runs over

  // Host-side bookkeeping, shared by all layers.
  std::vector<int64_t> pos(B * T), dst_rows, src_rows, range_rows;
  // Rows outside the batch (kRange) look at key 0 only, to stay finite.
  std::vector<int64_t> limit(A * T, 0);
  int64_t span = 0;  // cached positions attention must look at
  bool all_full = true;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = cache.length(slots[b]), n = counts[b];
    const int64_t row = mode == Mode::kRange ? slots[b] - lo : b;
    if (mode == Mode::kRange) range_rows.push_back(row);
    span = std::max(span, start + n);
    all_full = all_full && n == T;
    for (int64_t t = 0; t < T; ++t) {
      pos[b * T + t] = start + t;
      // Query t sees keys up to its own position, never past the slot's new
      // end (padded queries of short rows stay finite and are discarded).
      limit[row * T + t] = start + std::min(t, n - 1);
    }
  }
  // Cache rows of the flat [slots * KV * max_len, hd] view, in the (b, t, h)
  // order of the new keys flattened as [B * T * KV, hd]; with padding, the
  // source rows of the real tokens.
  dst_rows.reserve(B * T * KV);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = cache.length(slots[b]);
    for (int64_t t = 0; t < counts[b]; ++t) {
      for (int64_t h = 0; h < KV; ++h) {
        dst_rows.push_back((slots[b] * KV + h) * max_len + start + t);
        if (!all_full) src_rows.push_back((b * T + t) * KV + h);
      }
    }
  }

  const at::Tensor pos_t = LongTensor(pos, dev).view({B, T});
  const at::Tensor limit_t = LongTensor(limit, dev).view({A, T, 1});
  const at::Tensor key_idx = at::arange(span, at::TensorOptions().dtype(at::kLong).device(dev));
  const at::Tensor blocked = key_idx.gt(limit_t).view({A, 1, 1, T, span});
  const at::Tensor dst_t = LongTensor(dst_rows, dev);
  const at::Tensor src_t = all_full ? at::Tensor() : LongTensor(src_rows, dev);
  const at::Tensor slots_t = mode == Mode::kGather ? LongTensor(slots, dev) : at::Tensor();
  const at::Tensor range_t = mode == Mode::kRange ? LongTensor(range_rows, dev) : at::Tensor();
  auto [cos, sin] = ops::RopeCosSin(pos_t, inv_freq_, embed_tokens_.scalar_type());

  at::Tensor x = EmbedIds(tokens);  // [B, T, hidden]
  for (int64_t li = 0; li < c.num_hidden_layers; ++li) {
    const Layer& l = layers_[li];
    const FusedWeights::LayerWeights& w = fw.layers[li];
    at::Tensor h = ops::RmsNorm(x, l.input_norm, eps);
    at::Tensor qkv = at::linear(h, w.qkv_w, w.qkv_b);  // [B, T, (H + 2 KV) * hd]
    at::Tensor qk = qkv.narrow(-1, 0, (H + KV) * hd).view({B, T, H + KV, hd});
    if (c.QkNorm()) qk = ops::RmsNorm(qk, w.qk_norm, eps);
    qk = ops::ApplyRope(qk, cos, sin);  // q and k rotated together
    at::Tensor q = qk.narrow(2, 0, H);
    at::Tensor k_new = qk.narrow(2, H, KV).reshape({B * T * KV, hd});
    at::Tensor v_new = qkv.narrow(-1, (H + KV) * hd, KV * hd).reshape({B * T * KV, hd});
    if (!all_full) {
      k_new = k_new.index_select(0, src_t);
      v_new = v_new.index_select(0, src_t);
    }
    at::Tensor k_buf = cache.keys_[li];
    at::Tensor v_buf = cache.values_[li];
    k_buf.view({-1, hd}).index_copy_(0, dst_t, k_new);
    v_buf.view({-1, hd}).index_copy_(0, dst_t, v_new);
    at::Tensor attn;
    switch (mode) {
      case Mode::kView:
        attn = ops::Attend(q, k_buf.narrow(0, slots[0], B).narrow(2, 0, span),
                           v_buf.narrow(0, slots[0], B).narrow(2, 0, span), blocked,
                           /*inplace=*/true);
        break;
      case Mode::kRange: {
        at::Tensor q_range = at::zeros({range, T, H, hd}, q.options());
        q_range.index_copy_(0, range_t, q);
        attn = ops::Attend(q_range, k_buf.narrow(0, lo, range).narrow(2, 0, span),
                           v_buf.narrow(0, lo, range).narrow(2, 0, span), blocked,
                           /*inplace=*/true)
                   .index_select(0, range_t);
        break;
      }
      case Mode::kGather:
        attn = ops::Attend(q, k_buf.narrow(2, 0, span).index_select(0, slots_t),
                           v_buf.narrow(2, 0, span).index_select(0, slots_t), blocked,
                           /*inplace=*/true);
        break;
    }
    x.add_(RowParallel(attn, l.o_w, l.o_b));
    // The MLP row block by row block: its [rows, 2 * inter] activations are
    // the step's largest, and blocks of at most 4M floats stay reusable heap
    // memory instead of fresh mappings (see kMlpBlockFloats).
    at::Tensor x2 = x.view({B * T, c.hidden_size});
    const int64_t block = std::max<int64_t>(1, kMlpBlockFloats / (2 * inter));
    for (int64_t r0 = 0; r0 < B * T; r0 += block) {
      at::Tensor xs = x2.narrow(0, r0, std::min(block, B * T - r0));
      h = ops::RmsNorm(xs, l.post_norm, eps);
      at::Tensor gu = at::linear(h, w.gate_up_w, w.gate_up_b);  // [rows, 2 * inter]
      at::Tensor act = at::silu(gu.narrow(-1, 0, inter)).mul_(gu.narrow(-1, inter, inter));
      xs.add_(RowParallel(act, l.down_w, l.down_b));
    }
  }
  for (int64_t b = 0; b < B; ++b) cache.lengths_[slots[b]] += counts[b];

  at::Tensor last;
  if (T == 1) {
    last = x.view({B, -1});
  } else {
    std::vector<int64_t> rows(B);
    for (int64_t b = 0; b < B; ++b) rows[b] = b * T + counts[b] - 1;
    last = x.view({B * T, -1}).index_select(0, LongTensor(rows, dev));
  }
  last = ops::RmsNorm(last, norm_, eps);
  if (fw.lm_head.scalar_type() != last.scalar_type()) last = last.to(fw.lm_head.scalar_type());
  return GatherVocab(at::linear(last, fw.lm_head));
}

}  // namespace roll
