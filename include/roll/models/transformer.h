#pragma once
// CausalLM: the decoder-only transformer of the Hugging Face Qwen2, LLaMA and
// Qwen3 architectures (RMSNorm, rotary embeddings with optional LLaMA-3.1
// scaling, grouped-query attention, SwiGLU MLP; Qwen2 q/k/v biases, Qwen3
// per-head q/k RMSNorm), with an optional value head for critics.
//
// Parameters carry exactly the names Hugging Face uses
// (`model.embed_tokens.weight`, `model.layers.{i}.self_attn.q_proj.weight`,
// ..., `model.norm.weight`, `lm_head.weight`), so HF checkpoints load here and
// checkpoints saved here load in HF. With tie_word_embeddings the LM head is
// `model.embed_tokens.weight` and `lm_head.weight` does not exist. The value
// head is `score.weight` [1, hidden] and `score.bias` [1], the layout of HF's
// *ForTokenClassification with num_labels = 1.
//
// Two compute paths:
//  - Forward / ForwardHidden / Values: full sequences with autograd, for
//    training and scoring. Padding (left or right) is expressed by an
//    attention mask; position ids default to the count of real tokens before
//    each position, as HF generation does.
//  - Prefill / DecodeStep: incremental decoding into a caller-owned KvCache,
//    batched over slots of different lengths. They run under
//    c10::InferenceMode and use fused q/k/v and gate/up weights built lazily
//    from the parameters. The fused copies are rebuilt whenever a parameter
//    was modified (in-place updates by an optimizer or a weight sync are
//    detected through the tensors' version counters), so decode always sees
//    the current weights. They cost extra memory (about the size of the
//    attention and MLP weights); ReleaseInferenceWeights() frees them.
//
// Devices: parameters live on options.device (CPU or CUDA); every tensor the
// model creates follows the parameters' device. Inputs may be on any device.
//
// Ownership: the model owns its parameters; Parameters()/NamedParameters()
// return handles aliasing them (an optimizer updating them in place updates
// the model). Thread-safety: none. Use a model from one thread at a time;
// even Forward touches lazily built state. The model never changes the
// number of intra-op threads.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "roll/common/status.h"
#include "roll/models/hf_config.h"
#include "roll/models/kv_cache.h"
#include "roll/models/tensor_parallel.h"

namespace roll {

struct ModelOptions {
  // Parameter dtype: Float (default), BFloat16 or Half.
  c10::ScalarType dtype = c10::ScalarType::Float;
  c10::Device device = c10::Device(c10::DeviceType::CPU);  // default: CPU
  // Compute the LM-head logits in float32 even when the weights are bf16
  // (default: false: logits come out in the parameter dtype).
  bool fp32_logits = false;
  // Whether the model has an LM head (default: true). Without it Forward and
  // the decode methods fail; a checkpoint's `lm_head.weight` is then ignored.
  bool lm_head = true;
  // Whether the model has the value head `score` (default: false). When a
  // checkpoint has no `score.*` tensors (a critic starting from a base LM)
  // the head is freshly initialized from `seed` (weight ~ N(0, 0.02), bias 0),
  // as HF does for newly added heads.
  bool value_head = false;
  // Whether parameters require grad (default: true).
  bool requires_grad = true;
  // Decode steps of up to 8 sequences on a float32 CPU model run
  // hand-written AVX2/FMA loops instead of LibTorch ops (default: true;
  // ignored where the CPU lacks AVX2/FMA). Same math to float32 rounding;
  // docs/generation.md says why it is faster.
  bool fast_decode = true;
  uint64_t seed = 0;  // default: 0; initializes freshly created parameters
  // Tensor parallelism (roll/models/tensor_parallel.h): this model holds
  // slice tp_rank of tp_size. Default 1: the whole model. With tp_size > 1
  // the heads, key-value heads, intermediate size and vocabulary must be
  // multiples of tp_size; every compute call needs set_tensor_parallel()
  // and runs together with the other ranks' calls (with or without
  // gradients: a slice trains too); the fast decode path is off;
  // SavePretrained refuses (a slice is not a checkpoint).
  int tp_rank = 0;
  int tp_size = 1;
};

struct SaveOptions {
  // Shards hold at most this many bytes of tensor data (HF's default 5 GB).
  uint64_t max_shard_bytes = 5'000'000'000ull;
  // Additional files written into the checkpoint directory, name -> content
  // (e.g. "tokenizer.json"). Names must be plain file names. Default: none.
  std::map<std::string, std::string> extra_files;
};

class CausalLM {
 public:
  // Reads `dir`/config.json and the single-file or sharded safetensors in
  // `dir`. Every expected tensor must be present with the expected shape and
  // no unexpected tensor may be present (rotary `inv_freq` buffers, a tied
  // model's `lm_head.weight`, and `lm_head.weight` when options.lm_head is
  // false are ignored). Errors name the file and the tensor. Weights are
  // converted to options.dtype and moved to options.device.
  static absl::StatusOr<std::unique_ptr<CausalLM>> FromPretrained(const std::string& dir,
                                                                  const ModelOptions& options = {});

  // A randomly initialized model like HF's _init_weights: linear and
  // embedding weights ~ N(0, initializer_range) (config extra
  // "initializer_range", default 0.02), biases 0, norm weights 1. The values
  // depend only on `seed` and the config, not on dtype or device.
  static absl::StatusOr<std::unique_ptr<CausalLM>> Random(const ModelConfig& config, uint64_t seed,
                                                          const ModelOptions& options = {});

  ~CausalLM();
  CausalLM(const CausalLM&) = delete;
  CausalLM& operator=(const CausalLM&) = delete;

  // Writes config.json (torch_dtype set to the parameter dtype) and
  // model.safetensors, or shards plus model.safetensors.index.json, into a
  // fresh temporary directory beside `dir` and then atomically puts it in
  // place of `dir` (an existing `dir` is replaced as a whole). A crash or an
  // error never leaves a partial checkpoint at `dir`.
  absl::Status SavePretrained(const std::string& dir, const SaveOptions& options = {}) const;

  // A tensor-parallel slice: from a checkpoint, FromPretrained reads each
  // full tensor and keeps options.tp_rank's part; Random draws the whole
  // model and keeps the part, so slices of one seed form that model.
  // TensorParallelSlice cuts `rank`'s slice of `size` out of this whole
  // model (a copy).
  absl::StatusOr<std::unique_ptr<CausalLM>> TensorParallelSlice(int rank, int size) const;
  // Overwrites this slice's parameters with its part of `whole` (a model of
  // the same config with tp_size 1), e.g. after a model update into it.
  absl::Status CopySliceFrom(const CausalLM& whole);
  // The group a slice computes with (not owned; must outlive the model's
  // use). Required before any compute call when tp_size > 1.
  void set_tensor_parallel(TensorParallelOps* ops) { tp_ops_ = ops; }

  // The config is the whole model's (vocab_size, heads, ... of the
  // unsplit model), also for a slice.
  const ModelConfig& config() const { return config_; }
  const ModelOptions& options() const { return options_; }
  c10::ScalarType dtype() const { return options_.dtype; }
  c10::Device device() const;
  void set_fp32_logits(bool on);
  void set_fast_decode(bool on) { options_.fast_decode = on; }

  // Every parameter in HF definition order (embeddings, layers in order,
  // final norm, lm_head, score): the same order on every rank, as
  // data-parallel gradient reduction needs. They lie back to back in that
  // order in one buffer (each its own leaf tensor sharing the storage), so
  // loading never holds a second copy and the model update sends one span.
  std::vector<at::Tensor> Parameters() const;
  std::vector<std::pair<std::string, at::Tensor>> NamedParametersOrdered() const;
  // Name -> parameter (the names a checkpoint holds).
  std::map<std::string, at::Tensor> NamedParameters() const;
  int64_t NumParameters() const;

  // Moves (or converts) every parameter; gradients are dropped.
  absl::Status To(c10::Device device, c10::ScalarType dtype);

  // --- Full-sequence path (autograd) ---
  // input_ids [B, T] integer. attention_mask [B, T] (1 = token, 0 = padding;
  // undefined = no padding). position_ids [B, T] (undefined = derived from the
  // mask). Tokens attend causally to real tokens only; padded positions
  // produce unspecified (finite) outputs.
  absl::StatusOr<at::Tensor> Forward(const at::Tensor& input_ids,
                                     const at::Tensor& attention_mask = {},
                                     const at::Tensor& position_ids = {}) const;
  // Final-norm hidden states [B, T, hidden] in the parameter dtype.
  absl::StatusOr<at::Tensor> ForwardHidden(const at::Tensor& input_ids,
                                           const at::Tensor& attention_mask = {},
                                           const at::Tensor& position_ids = {}) const;
  // LM-head logits of hidden states [..., hidden] -> [..., vocab].
  absl::StatusOr<at::Tensor> Logits(const at::Tensor& hidden) const;

  // The same forward in its parts, for strategies that hold a layer's
  // parameters only while it runs (sharded training binds them just before
  // each part):
  //   ctx = PrepareForward(ids, mask, pos)       (validated like ForwardHidden)
  //   x = Embed(ctx); x = RunLayer(i, ctx, x) for i = 0..L-1; h = FinalNorm(x)
  // gives ForwardHidden's result bit for bit. Each part reads the parameters
  // it uses when called; LibTorch errors throw c10::Error.
  struct ForwardContext {
    at::Tensor ids;       // [B, T] int64 on the model's device
    at::Tensor cos, sin;  // rotary tables for the positions
    at::Tensor blocked;   // [B, 1, 1, T, T] true where a query may not see a key
  };
  absl::StatusOr<ForwardContext> PrepareForward(const at::Tensor& input_ids,
                                                const at::Tensor& attention_mask = {},
                                                const at::Tensor& position_ids = {}) const;
  at::Tensor Embed(const ForwardContext& ctx) const;
  at::Tensor RunLayer(int64_t index, const ForwardContext& ctx, const at::Tensor& x) const;
  at::Tensor FinalNorm(const at::Tensor& x) const;
  // Value head: [..., hidden] -> [...] in float32.
  absl::StatusOr<at::Tensor> Values(const at::Tensor& hidden) const;

  // --- Incremental decoding (InferenceMode, fused weights) ---
  // A cache shaped for this model (its dtype and device).
  absl::StatusOr<std::unique_ptr<KvCache>> NewKvCache(int64_t num_slots, int64_t max_len) const;
  // Appends `tokens` to each slot (continuing after what the slot already
  // holds, so a multi-turn prompt can be extended) and returns the logits at
  // each slot's last new position, [B, vocab]. Slots must be distinct, each
  // gets at least one token, and must fit in max_len.
  absl::StatusOr<at::Tensor> Prefill(KvCache& cache, const std::vector<int64_t>& slots,
                                     const std::vector<std::vector<int64_t>>& tokens) const;
  absl::StatusOr<at::Tensor> Prefill(KvCache& cache, int64_t slot,
                                     const std::vector<int64_t>& tokens) const;
  // Appends one token per slot at that slot's own position and returns the
  // logits [B, vocab]. token_ids: [B] integer tensor on any device (e.g. the
  // sampler's output, so no host round trip is needed).
  absl::StatusOr<at::Tensor> DecodeStep(KvCache& cache, const std::vector<int64_t>& slots,
                                        const at::Tensor& token_ids) const;
  absl::StatusOr<at::Tensor> DecodeStep(KvCache& cache, const std::vector<int64_t>& slots,
                                        const std::vector<int64_t>& token_ids) const;
  // Frees the fused inference weights (rebuilt on the next decode call).
  void ReleaseInferenceWeights() const;

  struct Layer;         // private; public only so the .cc can name it
  struct FusedWeights;  // private
  struct ParamRef;      // private

 private:
  CausalLM(ModelConfig config, ModelOptions options);
  absl::Status Allocate();
  std::vector<ParamRef> Refs() const;
  void InitRandom(uint64_t seed);
  void InitValueHead(uint64_t seed);
  const at::Tensor& LmHeadWeight() const;
  ForwardContext ContextImpl(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                             const at::Tensor& position_ids) const;
  // This slice's part of the split dimensions (the whole for tp_size 1).
  int64_t LocalHeads() const { return config_.num_attention_heads / options_.tp_size; }
  int64_t LocalKvHeads() const { return config_.num_key_value_heads / options_.tp_size; }
  int64_t LocalIntermediate() const { return config_.intermediate_size / options_.tp_size; }
  int64_t LocalVocab() const { return config_.vocab_size / options_.tp_size; }
  // Tensor-parallel steps (plain ops for tp_size 1); throw c10::Error when
  // the group fails. Under autograd they are Megatron's conjugate pairs:
  // ToGroup (identity forward, gradients summed over the group backward)
  // feeds every column-parallel linear; the sums of EmbedIds and
  // RowParallel pass gradients through unchanged; GatherVocab hands each
  // rank its own columns' gradient back.
  at::Tensor ToGroup(const at::Tensor& input) const;
  at::Tensor GroupSum(at::Tensor partial, const char* what) const;
  at::Tensor EmbedIds(const at::Tensor& ids) const;
  at::Tensor RowParallel(const at::Tensor& input, const at::Tensor& weight,
                         const at::Tensor& bias) const;
  at::Tensor GatherVocab(const at::Tensor& local_logits) const;
  at::Tensor LogitsImpl(const at::Tensor& hidden) const;
  const FusedWeights& Fused() const;
  at::Tensor ExtendImpl(KvCache& cache, const std::vector<int64_t>& slots,
                        const at::Tensor& tokens, const std::vector<int64_t>& counts) const;
  absl::Status CheckCache(const KvCache& cache) const;

  ModelConfig config_;
  ModelOptions options_;
  at::Tensor inv_freq_;  // [head_dim / 2] float32 on the parameters' device
  at::Tensor embed_tokens_;
  std::vector<Layer> layers_;
  at::Tensor norm_;
  at::Tensor lm_head_;  // undefined when tied or without an LM head
  at::Tensor score_weight_, score_bias_;  // undefined without a value head
  mutable std::unique_ptr<FusedWeights> fused_;
  TensorParallelOps* tp_ops_ = nullptr;  // not owned
};

// HF's rotary inverse frequencies 1 / theta^(2i/d), i < d/2, as float32 on
// CPU, with the LLaMA-3.1 rescaling applied when the config asks for it.
at::Tensor RotaryInvFreq(const ModelConfig& config);

}  // namespace roll
