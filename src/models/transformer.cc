// CausalLM: parameters, loading and saving, and the full-sequence forward
// pass. The three supported architectures differ only in flags the config
// derives (q/k/v and o_proj biases, MLP biases, Qwen3's q/k norm), so one
// implementation serves them all. The incremental path is in
// transformer_decode.cc; the math both paths share is in transformer_ops.h.

#include "roll/models/transformer.h"

#include <torch/torch.h>

#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/atomic_file.h"
#include "models/transformer_internal.h"
#include "roll/models/safetensors.h"

namespace roll {

namespace fs = std::filesystem;
using models_internal::ShapeString;

at::Tensor RotaryInvFreq(const ModelConfig& config) {
  const int64_t half = config.head_dim / 2;
  at::NoGradGuard no_grad;
  // HF: 1 / base^(arange(0, d, 2) / d), computed in float32.
  at::Tensor exponent = at::arange(0, 2 * half, 2, at::kLong).to(at::kFloat) /
                        static_cast<float>(config.head_dim);
  at::Tensor inv_freq = 1.0 / at::pow(static_cast<float>(config.rope_theta), exponent);
  if (config.rope_scaling.has_value()) {
    // LLaMA-3.1: long wavelengths are slowed down by `factor`, short ones
    // kept, and the band between interpolates smoothly.
    const RopeScaling& s = *config.rope_scaling;
    const double old_len = static_cast<double>(s.original_max_position_embeddings);
    const double low_freq_wavelen = old_len / s.low_freq_factor;
    const double high_freq_wavelen = old_len / s.high_freq_factor;
    at::Tensor wavelen = 2 * M_PI / inv_freq;
    at::Tensor scaled =
        at::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
    at::Tensor smooth = (old_len / wavelen - s.low_freq_factor) /
                        (s.high_freq_factor - s.low_freq_factor);
    at::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
    at::Tensor medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen);
    inv_freq = at::where(medium, smoothed, scaled);
  }
  return inv_freq.contiguous();
}

// ---------------------------------------------------------------------------
// Parameters

struct CausalLM::ParamRef {
  std::string name;
  at::Tensor* tensor;
  std::vector<int64_t> shape;
  models_internal::Init init;
};

CausalLM::CausalLM(ModelConfig config, ModelOptions options)
    : config_(std::move(config)), options_(options) {}

CausalLM::~CausalLM() = default;

c10::Device CausalLM::device() const { return options_.device; }

std::vector<CausalLM::ParamRef> CausalLM::Refs() const {
  using models_internal::Init;
  // The refs point into this model; const only so const methods can list
  // them without copying.
  auto* self = const_cast<CausalLM*>(this);
  const ModelConfig& c = config_;
  // A tensor-parallel slice holds its part of the split dimensions.
  const int64_t hidden = c.hidden_size, hd = c.head_dim, inter = LocalIntermediate();
  const int64_t q_out = LocalHeads() * hd, kv_out = LocalKvHeads() * hd;
  std::vector<ParamRef> refs;
  refs.push_back({"model.embed_tokens.weight", &self->embed_tokens_, {LocalVocab(), hidden},
                  Init::kNormal});
  for (size_t i = 0; i < self->layers_.size(); ++i) {
    Layer& l = self->layers_[i];
    const std::string p = absl::StrCat("model.layers.", i, ".");
    auto add = [&](const std::string& n, at::Tensor* t, std::vector<int64_t> shape, Init init) {
      refs.push_back({p + n, t, std::move(shape), init});
    };
    add("self_attn.q_proj.weight", &l.q_w, {q_out, hidden}, Init::kNormal);
    if (c.QkvBias()) add("self_attn.q_proj.bias", &l.q_b, {q_out}, Init::kZero);
    add("self_attn.k_proj.weight", &l.k_w, {kv_out, hidden}, Init::kNormal);
    if (c.QkvBias()) add("self_attn.k_proj.bias", &l.k_b, {kv_out}, Init::kZero);
    add("self_attn.v_proj.weight", &l.v_w, {kv_out, hidden}, Init::kNormal);
    if (c.QkvBias()) add("self_attn.v_proj.bias", &l.v_b, {kv_out}, Init::kZero);
    add("self_attn.o_proj.weight", &l.o_w, {hidden, q_out}, Init::kNormal);
    if (c.OProjBias()) add("self_attn.o_proj.bias", &l.o_b, {hidden}, Init::kZero);
    if (c.QkNorm()) {
      add("self_attn.q_norm.weight", &l.q_norm, {hd}, Init::kOne);
      add("self_attn.k_norm.weight", &l.k_norm, {hd}, Init::kOne);
    }
    add("mlp.gate_proj.weight", &l.gate_w, {inter, hidden}, Init::kNormal);
    if (c.mlp_bias) add("mlp.gate_proj.bias", &l.gate_b, {inter}, Init::kZero);
    add("mlp.up_proj.weight", &l.up_w, {inter, hidden}, Init::kNormal);
    if (c.mlp_bias) add("mlp.up_proj.bias", &l.up_b, {inter}, Init::kZero);
    add("mlp.down_proj.weight", &l.down_w, {hidden, inter}, Init::kNormal);
    if (c.mlp_bias) add("mlp.down_proj.bias", &l.down_b, {hidden}, Init::kZero);
    add("input_layernorm.weight", &l.input_norm, {hidden}, Init::kOne);
    add("post_attention_layernorm.weight", &l.post_norm, {hidden}, Init::kOne);
  }
  refs.push_back({"model.norm.weight", &self->norm_, {hidden}, Init::kOne});
  if (options_.lm_head && !c.tie_word_embeddings) {
    refs.push_back({"lm_head.weight", &self->lm_head_, {LocalVocab(), hidden}, Init::kNormal});
  }
  if (options_.value_head) {
    refs.push_back({"score.weight", &self->score_weight_, {1, hidden}, Init::kNormal});
    refs.push_back({"score.bias", &self->score_bias_, {1}, Init::kZero});
  }
  return refs;
}

int TensorParallelDim(std::string_view name) {
  auto ends_with = [name](std::string_view suffix) {
    return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
  };
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") return 0;
  for (std::string_view column : {"self_attn.q_proj.weight", "self_attn.q_proj.bias",
                                  "self_attn.k_proj.weight", "self_attn.k_proj.bias",
                                  "self_attn.v_proj.weight", "self_attn.v_proj.bias",
                                  "mlp.gate_proj.weight", "mlp.gate_proj.bias",
                                  "mlp.up_proj.weight", "mlp.up_proj.bias"}) {
    if (ends_with(column)) return 0;
  }
  if (ends_with("self_attn.o_proj.weight") || ends_with("mlp.down_proj.weight")) {
    return 1;
  }
  return -1;
}

absl::Status CausalLM::Allocate() {
  ROLL_RETURN_IF_ERROR(config_.Validate());
  const int tp = options_.tp_size;
  if (tp < 1 || options_.tp_rank < 0 || options_.tp_rank >= tp) {
    return absl::InvalidArgumentError(absl::StrCat("ModelOptions: tp_rank ", options_.tp_rank,
                                                   " of tp_size ", tp, " (want 0 <= tp_rank < tp_size)"));
  }
  if (tp > 1) {
    for (const auto& [key, value] :
         std::vector<std::pair<const char*, int64_t>>{{"num_attention_heads", config_.num_attention_heads},
                                                      {"num_key_value_heads", config_.num_key_value_heads},
                                                      {"intermediate_size", config_.intermediate_size},
                                                      {"vocab_size", config_.vocab_size}}) {
      if (value % tp != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor parallelism over ", tp, " ranks: the config's ", key, " (", value,
            ") is not a multiple of ", tp));
      }
    }
  }
  if (config_.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelConfig: key 'head_dim': rotary embeddings need an even head_dim, got ",
                     config_.head_dim));
  }
  const c10::ScalarType dt = options_.dtype;
  if (dt != at::kFloat && dt != at::kBFloat16 && dt != at::kHalf && dt != at::kDouble) {
    return absl::InvalidArgumentError(
        absl::StrCat("ModelOptions: unsupported parameter dtype ", c10::toString(dt),
                     " (float32, bfloat16, float16 or float64)"));
  }
  try {
    at::NoGradGuard no_grad;
    layers_.assign(config_.num_hidden_layers, Layer{});
    const auto opts = at::TensorOptions().dtype(dt).device(options_.device);
    // Every parameter lives in one buffer, back to back in Refs() order (the
    // layout the model update sends in one transfer), so loading never holds
    // a second copy of the model. Each parameter is a tensor of its own that
    // shares the buffer's storage, not a view (autograd sees plain leaves).
    std::vector<ParamRef> refs = Refs();
    int64_t total = 0;
    for (const ParamRef& r : refs) total += c10::multiply_integers(r.shape);
    at::Tensor flat = at::empty({total}, opts);
    int64_t offset = 0;
    for (ParamRef& r : refs) {
      const int64_t n = c10::multiply_integers(r.shape);
      at::Tensor param = at::empty({0}, opts);
      param.set_data(flat.narrow(0, offset, n).view(r.shape));
      *r.tensor = std::move(param);
      offset += n;
    }
    inv_freq_ = RotaryInvFreq(config_).to(options_.device);
  } catch (const c10::Error& e) {
    return absl::ResourceExhaustedError(
        absl::StrCat("CausalLM: allocating parameters on ", options_.device.str(), " failed: ",
                     e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

namespace {

double InitializerRange(const ModelConfig& config) {
  auto it = config.extra.find("initializer_range");
  if (it != config.extra.end()) {
    char* end = nullptr;
    double v = std::strtod(it->second.c_str(), &end);
    if (end != it->second.c_str() && std::isfinite(v) && v > 0) return v;
  }
  return 0.02;
}

// Fills `t` from `gen` on CPU in float32, so values do not depend on the
// target dtype or device.
void InitTensor(at::Tensor& t, models_internal::Init init, double std, at::Generator& gen) {
  using models_internal::Init;
  at::NoGradGuard no_grad;
  switch (init) {
    case Init::kNormal: {
      at::Tensor v = at::empty(t.sizes(), at::kFloat);
      v.normal_(0.0, std, gen);
      t.copy_(v);
      break;
    }
    case Init::kZero:
      t.zero_();
      break;
    case Init::kOne:
      t.fill_(1.0);
      break;
  }
}

void SetRequiresGrad(const std::vector<at::Tensor>& params, bool on) {
  for (const at::Tensor& p : params) {
    at::Tensor t = p;
    t.set_requires_grad(on);
  }
}

}  // namespace

void CausalLM::InitRandom(uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const double std = InitializerRange(config_);
  for (ParamRef& r : Refs()) {
    if (r.name.rfind("score.", 0) == 0) continue;
    InitTensor(*r.tensor, r.init, std, gen);
  }
  if (options_.value_head) InitValueHead(seed);
}

void CausalLM::InitValueHead(uint64_t seed) {
  // A stream of its own, so a critic's head does not depend on how many
  // numbers the trunk consumed.
  at::Generator gen = at::detail::createCPUGenerator(seed ^ 0x5c0e5c0e5c0e5c0eull);
  const double std = InitializerRange(config_);
  InitTensor(score_weight_, models_internal::Init::kNormal, std, gen);
  InitTensor(score_bias_, models_internal::Init::kZero, std, gen);
}

std::vector<std::pair<std::string, at::Tensor>> CausalLM::NamedParametersOrdered() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const ParamRef& r : Refs()) out.emplace_back(r.name, *r.tensor);
  return out;
}

std::vector<at::Tensor> CausalLM::Parameters() const {
  std::vector<at::Tensor> out;
  for (const ParamRef& r : Refs()) out.push_back(*r.tensor);
  return out;
}

std::map<std::string, at::Tensor> CausalLM::NamedParameters() const {
  std::map<std::string, at::Tensor> out;
  for (const ParamRef& r : Refs()) out.emplace(r.name, *r.tensor);
  return out;
}

int64_t CausalLM::NumParameters() const {
  int64_t n = 0;
  for (const ParamRef& r : Refs()) n += r.tensor->numel();
  return n;
}

absl::Status CausalLM::To(c10::Device device, c10::ScalarType dtype) {
  try {
    at::NoGradGuard no_grad;
    for (ParamRef& r : Refs()) {
      at::Tensor moved = r.tensor->detach().to(device, dtype);
      if (moved.is_same(*r.tensor) || moved.data_ptr() == r.tensor->data_ptr()) {
        moved = moved.clone();
      }
      *r.tensor = moved;
    }
    inv_freq_ = inv_freq_.to(device);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("CausalLM::To(", device.str(), "): ", e.what_without_backtrace()));
  }
  options_.device = device;
  options_.dtype = dtype;
  SetRequiresGrad(Parameters(), options_.requires_grad);
  fused_.reset();
  return absl::OkStatus();
}

const at::Tensor& CausalLM::LmHeadWeight() const {
  return config_.tie_word_embeddings ? embed_tokens_ : lm_head_;
}

// ---------------------------------------------------------------------------
// Construction

absl::StatusOr<std::unique_ptr<CausalLM>> CausalLM::Random(const ModelConfig& config,
                                                           uint64_t seed,
                                                           const ModelOptions& options) {
  if (options.tp_size > 1) {
    // The whole model from the seed, then this rank's part: slices of one
    // seed form that model.
    ModelOptions whole = options;
    whole.tp_rank = 0;
    whole.tp_size = 1;
    ROLL_ASSIGN_OR_RETURN(auto full, Random(config, seed, whole));
    return full->TensorParallelSlice(options.tp_rank, options.tp_size);
  }
  std::unique_ptr<CausalLM> model(new CausalLM(config, options));
  ROLL_RETURN_IF_ERROR(model->Allocate());
  try {
    model->InitRandom(seed);
  } catch (const c10::Error& e) {
    return absl::InternalError(
        absl::StrCat("CausalLM::Random: ", e.what_without_backtrace()));
  }
  SetRequiresGrad(model->Parameters(), options.requires_grad);
  return model;
}

namespace {

bool IgnorableExtra(const std::string& name, const ModelConfig& config,
                    const ModelOptions& options) {
  // Rotary tables are derived from the config; older HF versions saved them.
  if (absl::EndsWith(name, ".rotary_emb.inv_freq")) return true;
  if (name == "lm_head.weight" && (config.tie_word_embeddings || !options.lm_head)) return true;
  return false;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CausalLM>> CausalLM::FromPretrained(const std::string& dir,
                                                                   const ModelOptions& options) {
  const std::string config_path = (fs::path(dir) / "config.json").string();
  ROLL_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::FromJsonFile(config_path));
  ROLL_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
  std::unique_ptr<CausalLM> model(new CausalLM(config, options));
  ROLL_RETURN_IF_ERROR(model->Allocate());

  bool has_score = ckpt->Contains("score.weight") || ckpt->Contains("score.bias");
  std::set<std::string> expected;
  bool init_value_head = false;
  for (ParamRef& r : model->Refs()) {
    expected.insert(r.name);
    if (!ckpt->Contains(r.name)) {
      if (!has_score && r.name.rfind("score.", 0) == 0) {
        init_value_head = true;
        continue;
      }
      return absl::NotFoundError(absl::StrCat(ckpt->path(), ": missing tensor '", r.name,
                                              "' (expected shape ", ShapeString(r.shape),
                                              " for ", config.model_type, " config in ",
                                              config_path, ")"));
    }
    ROLL_ASSIGN_OR_RETURN(const SafetensorsFile* file, ckpt->FileFor(r.name));
    ROLL_ASSIGN_OR_RETURN(SafetensorsTensorInfo info, file->Info(r.name));
    // A tensor-parallel slice reads the whole tensor and keeps its part.
    const int dim = options.tp_size > 1 ? TensorParallelDim(r.name) : -1;
    std::vector<int64_t> whole = r.shape;
    if (dim >= 0) whole[dim] *= options.tp_size;
    if (info.shape != whole) {
      return absl::InvalidArgumentError(absl::StrCat(
          file->path(), ": tensor '", r.name, "' has shape ", ShapeString(info.shape),
          ", but ", config_path, " implies ", ShapeString(whole)));
    }
    if (dim < 0) {
      ROLL_RETURN_IF_ERROR(file->LoadInto(r.name, *r.tensor));
    } else {
      ROLL_ASSIGN_OR_RETURN(at::Tensor t, file->Load(r.name));
      at::NoGradGuard no_grad;
      r.tensor->copy_(t.narrow(dim, options.tp_rank * r.shape[dim], r.shape[dim]));
    }
  }
  std::vector<std::string> extra;
  for (const std::string& name : ckpt->names()) {
    if (expected.count(name) == 0 && !IgnorableExtra(name, config, options)) {
      auto file = ckpt->FileFor(name);
      extra.push_back(absl::StrCat("'", name, "' (in ", file.ok() ? (*file)->path() : ckpt->path(),
                                   ")"));
    }
  }
  if (!extra.empty()) {
    const size_t shown = std::min<size_t>(extra.size(), 5);
    return absl::InvalidArgumentError(absl::StrCat(
        ckpt->path(), ": ", extra.size(), " unexpected tensor(s) for a ", config.model_type,
        " model with ", config.num_hidden_layers, " layers",
        options.value_head ? " and a value head" : "", ": ",
        absl::StrJoin(extra.begin(), extra.begin() + shown, ", "),
        extra.size() > shown ? ", ..." : ""));
  }
  try {
    if (init_value_head) model->InitValueHead(options.seed);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("CausalLM: ", e.what_without_backtrace()));
  }
  SetRequiresGrad(model->Parameters(), options.requires_grad);
  return model;
}

// ---------------------------------------------------------------------------
// Saving

namespace {

std::string ArchitecturePrefix(const std::string& model_type) {
  if (model_type == "qwen2") return "Qwen2";
  if (model_type == "qwen3") return "Qwen3";
  return "Llama";
}

std::string DtypeName(c10::ScalarType dt) {
  switch (dt) {
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    case at::kDouble:
      return "float64";
    default:
      return "float32";
  }
}

absl::Status FsyncDir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return absl::InternalError(absl::StrCat(dir, ": open for fsync failed"));
  int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return absl::InternalError(absl::StrCat(dir, ": fsync failed"));
  return absl::OkStatus();
}

}  // namespace

absl::Status CausalLM::SavePretrained(const std::string& dir, const SaveOptions& options) const {
  if (options_.tp_size > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CausalLM::SavePretrained: this model is tensor-parallel slice ", options_.tp_rank, " of ",
        options_.tp_size, ", not a whole checkpoint"));
  }
  if (dir.empty()) return absl::InvalidArgumentError("SavePretrained: empty directory name");
  for (const auto& [name, content] : options.extra_files) {
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == ".." ||
        name == "config.json" || absl::StartsWith(name, "model")) {
      return absl::InvalidArgumentError(
          absl::StrCat("SavePretrained: extra file name '", name,
                       "' must be a plain file name other than config.json and model*"));
    }
  }
  fs::path target = fs::path(dir);
  if (target.filename().empty()) target = target.parent_path();  // trailing '/'
  fs::path parent = target.parent_path();
  if (parent.empty()) parent = ".";
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat(parent.string(), ": cannot create directory: ", ec.message()));
  }
  if (fs::exists(target, ec) && !fs::is_directory(target, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat(target.string(), ": exists and is not a directory"));
  }
  std::string tmpl = (parent / ("." + target.filename().string() + ".tmp-XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(absl::StrCat(tmpl, ": cannot create temporary directory"));
  }
  const std::string tmp = tmpl;
  auto fail = [&](absl::Status s) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    return s;
  };

  ModelConfig out = config_;
  out.torch_dtype = DtypeName(options_.dtype);
  const std::string prefix = ArchitecturePrefix(out.model_type);
  if (options_.lm_head) {
    out.architectures = {prefix + "ForCausalLM"};
  } else if (options_.value_head) {
    // HF's token-classification head with one label is exactly `score`.
    out.architectures = {prefix + "ForTokenClassification"};
    if (!out.extra.count("id2label")) out.extra["id2label"] = R"({"0": "LABEL_0"})";
    if (!out.extra.count("label2id")) out.extra["label2id"] = R"({"LABEL_0": 0})";
  }
  absl::Status s = out.WriteJsonFile((fs::path(tmp) / "config.json").string());
  if (!s.ok()) return fail(s);
  try {
    s = SaveSharded(tmp, NamedParameters(), options.max_shard_bytes, {{"format", "pt"}});
  } catch (const c10::Error& e) {
    s = absl::InternalError(absl::StrCat("SavePretrained: ", e.what_without_backtrace()));
  }
  if (!s.ok()) return fail(s);
  for (const auto& [name, content] : options.extra_files) {
    s = common_internal::WriteFileAtomically((fs::path(tmp) / name).string(), content);
    if (!s.ok()) return fail(s);
  }
  s = FsyncDir(tmp);
  if (!s.ok()) return fail(s);

  if (!fs::exists(target, ec)) {
    if (::rename(tmp.c_str(), target.c_str()) != 0) {
      return fail(absl::InternalError(absl::StrCat("rename ", tmp, " -> ", target.string(),
                                                   " failed: ", strerror(errno))));
    }
  } else {
    // Swap the complete new directory with the old one in one step, so
    // `dir` always names a whole checkpoint; the old one is deleted after.
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0) {
      // Filesystems without RENAME_EXCHANGE: move the old directory aside
      // first (a crash in between leaves both complete copies on disk).
      std::string old_tmpl =
          (parent / ("." + target.filename().string() + ".old-XXXXXX")).string();
      if (::mkdtemp(old_tmpl.data()) == nullptr || ::rmdir(old_tmpl.c_str()) != 0 ||
          ::rename(target.c_str(), old_tmpl.c_str()) != 0) {
        return fail(absl::InternalError(
            absl::StrCat("cannot move ", target.string(), " aside: ", strerror(errno))));
      }
      if (::rename(tmp.c_str(), target.c_str()) != 0) {
        const std::string err = strerror(errno);
        ::rename(old_tmpl.c_str(), target.c_str());
        return fail(absl::InternalError(
            absl::StrCat("rename ", tmp, " -> ", target.string(), " failed: ", err)));
      }
      fs::remove_all(old_tmpl, ec);
    } else {
      fs::remove_all(tmp, ec);  // now holds the previous checkpoint
    }
  }
  return FsyncDir(parent.string());
}

// ---------------------------------------------------------------------------
// Full-sequence forward

absl::StatusOr<CausalLM::ForwardContext> CausalLM::PrepareForward(
    const at::Tensor& input_ids, const at::Tensor& attention_mask,
    const at::Tensor& position_ids) const {
  auto check = [&](const at::Tensor& t, const char* what) -> absl::Status {
    if (!t.defined()) return absl::OkStatus();
    if (t.dim() != 2 || (input_ids.defined() && t.sizes() != input_ids.sizes())) {
      return absl::InvalidArgumentError(
          absl::StrCat("CausalLM::Forward: ", what, " has shape ", ShapeString(t.sizes().vec()),
                       "; expected [batch, seq] like input_ids ",
                       ShapeString(input_ids.sizes().vec())));
    }
    return absl::OkStatus();
  };
  if (!input_ids.defined() || input_ids.dim() != 2 || input_ids.size(1) == 0 ||
      c10::isFloatingType(input_ids.scalar_type())) {
    return absl::InvalidArgumentError(
        "CausalLM::Forward: input_ids must be a non-empty [batch, seq] integer tensor");
  }
  ROLL_RETURN_IF_ERROR(check(attention_mask, "attention_mask"));
  ROLL_RETURN_IF_ERROR(check(position_ids, "position_ids"));
  try {
    if (input_ids.numel() > 0) {
      const int64_t lo = input_ids.min().item<int64_t>();
      const int64_t hi = input_ids.max().item<int64_t>();
      if (lo < 0 || hi >= config_.vocab_size) {
        return absl::OutOfRangeError(absl::StrCat("CausalLM::Forward: token id ",
                                                  lo < 0 ? lo : hi, " outside vocabulary [0, ",
                                                  config_.vocab_size, ")"));
      }
    }
    return ContextImpl(input_ids, attention_mask, position_ids);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("CausalLM::Forward: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<at::Tensor> CausalLM::ForwardHidden(const at::Tensor& input_ids,
                                                   const at::Tensor& attention_mask,
                                                   const at::Tensor& position_ids) const {
  ROLL_ASSIGN_OR_RETURN(ForwardContext ctx, PrepareForward(input_ids, attention_mask, position_ids));
  try {
    at::Tensor x = Embed(ctx);
    for (int64_t i = 0; i < static_cast<int64_t>(layers_.size()); ++i) x = RunLayer(i, ctx, x);
    return FinalNorm(x);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("CausalLM::Forward: ", e.what_without_backtrace()));
  }
}

CausalLM::ForwardContext CausalLM::ContextImpl(const at::Tensor& input_ids,
                                               const at::Tensor& attention_mask,
                                               const at::Tensor& position_ids) const {
  namespace ops = models_internal;
  const at::Device dev = options_.device;
  const int64_t B = input_ids.size(0), T = input_ids.size(1);

  ForwardContext ctx;
  ctx.ids = input_ids.to(dev, at::kLong);
  at::Tensor mask = attention_mask.defined() ? attention_mask.to(dev).to(at::kBool) : at::Tensor();
  at::Tensor pos;
  if (position_ids.defined()) {
    pos = position_ids.to(dev, at::kLong);
  } else if (mask.defined()) {
    pos = (mask.to(at::kLong).cumsum(1) - 1).clamp_min(0);
  } else {
    pos = at::arange(T, at::TensorOptions().dtype(at::kLong).device(dev)).expand({B, T});
  }
  // Query i sees key j when j <= i and j is a real token; every query also
  // sees itself, so padded rows stay finite and real rows are unaffected.
  const auto bool_opts = at::TensorOptions().dtype(at::kBool).device(dev);
  at::Tensor allowed = at::ones({T, T}, bool_opts).tril().view({1, T, T});
  if (mask.defined()) {
    allowed = (allowed & mask.view({B, 1, T})) | at::eye(T, bool_opts).view({1, T, T});
  }
  ctx.blocked = allowed.logical_not().view({-1, 1, 1, T, T});
  std::tie(ctx.cos, ctx.sin) = ops::RopeCosSin(pos, inv_freq_, options_.dtype);
  return ctx;
}

at::Tensor CausalLM::Embed(const ForwardContext& ctx) const { return EmbedIds(ctx.ids); }

namespace {

void CheckTensorParallel(const TensorParallelOps* ops) {
  TORCH_CHECK(ops != nullptr,
              "CausalLM: a tensor-parallel slice computes only with its group (set_tensor_parallel)");
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

TensorParallelOps* OpsOf(AutogradContext* ctx) {
  return reinterpret_cast<TensorParallelOps*>(static_cast<intptr_t>(ctx->saved_data["ops"].toInt()));
}

void Check(const absl::Status& s, const char* what) { TORCH_CHECK(s.ok(), what, ": ", s.ToString()); }

// Identity forward; backward sums the gradient over the group (each rank's
// column-parallel slice contributed only its part of it).
struct ToGroupFn : torch::autograd::Function<ToGroupFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, TensorParallelOps* ops) {
    ctx->saved_data["ops"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(ops));
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    at::Tensor g = grad[0].contiguous().clone();
    Check(OpsOf(ctx)->AllReduceSum(g), "tensor-parallel backward (input of a column-parallel linear)");
    return {g, at::Tensor()};
  }
};

// The group's sum forward; the gradient of a sum reaches every addend as is.
struct GroupSumFn : torch::autograd::Function<GroupSumFn> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x, TensorParallelOps* ops) {
    at::Tensor out = x.contiguous().clone();
    Check(ops->AllReduceSum(out), "tensor-parallel sum");
    return out;
  }
  static variable_list backward(AutogradContext*, variable_list grad) { return {grad[0], at::Tensor()}; }
};

// Every rank's columns side by side forward; each rank's own columns of the
// gradient backward (every rank computes the same loss from the same
// gathered values, so that gradient is whole on each).
struct GatherLastDimFn : torch::autograd::Function<GatherLastDimFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, TensorParallelOps* ops) {
    ctx->saved_data["width"] = x.size(-1);
    ctx->saved_data["rank"] = static_cast<int64_t>(ops->rank());
    auto full = ops->AllGatherLastDim(x.contiguous());
    Check(full.status(), "tensor-parallel LM head");
    return *full;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const int64_t w = ctx->saved_data["width"].toInt(), r = ctx->saved_data["rank"].toInt();
    return {grad[0].narrow(-1, r * w, w).contiguous(), at::Tensor()};
  }
};

}  // namespace

at::Tensor CausalLM::ToGroup(const at::Tensor& input) const {
  if (options_.tp_size == 1 || !at::GradMode::is_enabled() || !input.requires_grad()) return input;
  CheckTensorParallel(tp_ops_);
  return ToGroupFn::apply(input, tp_ops_);
}

at::Tensor CausalLM::GroupSum(at::Tensor partial, const char* what) const {
  CheckTensorParallel(tp_ops_);
  if (at::GradMode::is_enabled() && partial.requires_grad()) return GroupSumFn::apply(partial, tp_ops_);
  partial = partial.contiguous();
  Check(tp_ops_->AllReduceSum(partial), what);
  return partial;
}

at::Tensor CausalLM::EmbedIds(const at::Tensor& ids) const {
  if (options_.tp_size == 1) return at::embedding(embed_tokens_, ids);
  // This rank's vocabulary range looks its ids up; the others give zeros.
  const int64_t local = LocalVocab(), lo = options_.tp_rank * local;
  const at::Tensor shifted = ids - lo;
  const at::Tensor inside = shifted.ge(0).logical_and(shifted.lt(local));
  at::Tensor e = at::embedding(embed_tokens_, shifted.clamp(0, local - 1));
  return GroupSum(e * inside.unsqueeze(-1).to(e.scalar_type()), "tensor-parallel embedding");
}

at::Tensor CausalLM::RowParallel(const at::Tensor& input, const at::Tensor& weight,
                                 const at::Tensor& bias) const {
  if (options_.tp_size == 1) return at::linear(input, weight, bias);
  // This rank's partial sum; a bias is added once, after the sum.
  at::Tensor out = GroupSum(at::linear(input, weight), "tensor-parallel row-parallel linear");
  if (!bias.defined()) return out;
  return out.requires_grad() ? out + bias : out.add_(bias);
}

at::Tensor CausalLM::GatherVocab(const at::Tensor& local_logits) const {
  if (options_.tp_size == 1) return local_logits;
  CheckTensorParallel(tp_ops_);
  if (at::GradMode::is_enabled() && local_logits.requires_grad()) {
    return GatherLastDimFn::apply(local_logits, tp_ops_);
  }
  auto full = tp_ops_->AllGatherLastDim(local_logits.contiguous());
  Check(full.status(), "tensor-parallel LM head");
  return *full;
}

at::Tensor CausalLM::RunLayer(int64_t index, const ForwardContext& ctx, const at::Tensor& input) const {
  namespace ops = models_internal;
  const ModelConfig& c = config_;
  const Layer& l = layers_.at(index);
  const int64_t B = ctx.ids.size(0), T = ctx.ids.size(1);
  const int64_t H = LocalHeads(), KV = LocalKvHeads(), hd = c.head_dim;
  const float eps = static_cast<float>(c.rms_norm_eps);
  at::Tensor x = input;
  at::Tensor h = ToGroup(ops::RmsNorm(x, l.input_norm, eps));
  at::Tensor q = at::linear(h, l.q_w, l.q_b).view({B, T, H, hd});
  at::Tensor k = at::linear(h, l.k_w, l.k_b).view({B, T, KV, hd});
  at::Tensor v = at::linear(h, l.v_w, l.v_b).view({B, T, KV, hd});
  if (c.QkNorm()) {
    q = ops::RmsNorm(q, l.q_norm, eps);
    k = ops::RmsNorm(k, l.k_norm, eps);
  }
  q = ops::ApplyRope(q, ctx.cos, ctx.sin);
  k = ops::ApplyRope(k, ctx.cos, ctx.sin);
  // In place is safe under autograd: the score product's backward reads
  // q and k, not the scores, and the result is the same bits; it spares a
  // [B, H, T, T] buffer per op, which long (multi-turn) sequences feel.
  at::Tensor attn = ops::Attend(q, k.permute({0, 2, 1, 3}), v.permute({0, 2, 1, 3}), ctx.blocked,
                                /*inplace=*/true);
  x = x + RowParallel(attn, l.o_w, l.o_b);
  h = ToGroup(ops::RmsNorm(x, l.post_norm, eps));
  at::Tensor act = at::silu(at::linear(h, l.gate_w, l.gate_b)) * at::linear(h, l.up_w, l.up_b);
  return x + RowParallel(act, l.down_w, l.down_b);
}

at::Tensor CausalLM::FinalNorm(const at::Tensor& x) const {
  return models_internal::RmsNorm(x, norm_, static_cast<float>(config_.rms_norm_eps));
}

at::Tensor CausalLM::LogitsImpl(const at::Tensor& input) const {
  const at::Tensor hidden = ToGroup(input);
  const at::Tensor& w = LmHeadWeight();
  if (options_.fp32_logits && w.scalar_type() != at::kFloat) {
    return GatherVocab(at::linear(hidden.to(at::kFloat), w.to(at::kFloat)));
  }
  return GatherVocab(at::linear(hidden, w));
}

absl::StatusOr<std::unique_ptr<CausalLM>> CausalLM::TensorParallelSlice(int rank, int size) const {
  if (options_.tp_size != 1) {
    return absl::FailedPreconditionError("CausalLM::TensorParallelSlice: this model is a slice itself");
  }
  ModelOptions o = options_;
  o.tp_rank = rank;
  o.tp_size = size;
  std::unique_ptr<CausalLM> slice(new CausalLM(config_, o));
  ROLL_RETURN_IF_ERROR(slice->Allocate());
  ROLL_RETURN_IF_ERROR(slice->CopySliceFrom(*this));
  SetRequiresGrad(slice->Parameters(), o.requires_grad);
  return slice;
}

absl::Status CausalLM::CopySliceFrom(const CausalLM& whole) {
  if (whole.options_.tp_size != 1 || whole.config_.hidden_size != config_.hidden_size ||
      whole.config_.num_hidden_layers != config_.num_hidden_layers ||
      whole.config_.vocab_size != config_.vocab_size) {
    return absl::InvalidArgumentError("CausalLM::CopySliceFrom: not the whole model of this slice's config");
  }
  const std::map<std::string, at::Tensor> src = whole.NamedParameters();
  try {
    at::NoGradGuard no_grad;
    for (ParamRef& r : Refs()) {
      auto it = src.find(r.name);
      if (it == src.end()) {
        return absl::InvalidArgumentError(absl::StrCat("CausalLM::CopySliceFrom: the whole model has no '", r.name, "'"));
      }
      const int dim = TensorParallelDim(r.name);
      const int64_t part = dim < 0 ? 0 : r.shape[dim];
      r.tensor->copy_(dim < 0 ? it->second : it->second.narrow(dim, options_.tp_rank * part, part));
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("CausalLM::CopySliceFrom: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> CausalLM::Logits(const at::Tensor& hidden) const {
  if (!options_.lm_head) {
    return absl::FailedPreconditionError("CausalLM: this model was built without an LM head");
  }
  if (!hidden.defined() || hidden.dim() < 1 || hidden.size(-1) != config_.hidden_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("CausalLM::Logits: hidden states must be [..., ", config_.hidden_size, "]"));
  }
  try {
    return LogitsImpl(hidden.to(embed_tokens_.device()));
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("CausalLM::Logits: ", e.what_without_backtrace()));
  }
}

absl::StatusOr<at::Tensor> CausalLM::Forward(const at::Tensor& input_ids,
                                             const at::Tensor& attention_mask,
                                             const at::Tensor& position_ids) const {
  if (!options_.lm_head) {
    return absl::FailedPreconditionError("CausalLM: this model was built without an LM head");
  }
  ROLL_ASSIGN_OR_RETURN(at::Tensor hidden, ForwardHidden(input_ids, attention_mask, position_ids));
  return Logits(hidden);
}

absl::StatusOr<at::Tensor> CausalLM::Values(const at::Tensor& hidden) const {
  if (!options_.value_head) {
    return absl::FailedPreconditionError("CausalLM: this model was built without a value head");
  }
  if (!hidden.defined() || hidden.dim() < 1 || hidden.size(-1) != config_.hidden_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("CausalLM::Values: hidden states must be [..., ", config_.hidden_size, "]"));
  }
  try {
    // In float32: values feed regression targets and advantages.
    return at::linear(hidden.to(score_weight_.device(), at::kFloat), score_weight_.to(at::kFloat),
                      score_bias_.to(at::kFloat))
        .squeeze(-1);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("CausalLM::Values: ", e.what_without_backtrace()));
  }
}

}  // namespace roll
