#include "strategies/sharded.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include <cmath>
#include <stdexcept>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "roll/strategies/communicator.h"
#include "strategies/train_internal.h"

namespace roll::strategies_internal {
namespace {

// Gloo moves no bfloat16; gathers only copy bits, so bfloat16 travels as
// float16 of the same width.
bool NeedsHalfView(const at::Tensor& t, const Communicator* c) {
  return c != nullptr && t.scalar_type() == at::kBFloat16 && c->backend() == "gloo";
}

}  // namespace

struct ShardedModel::Call {
  ShardedModel* owner = nullptr;
  std::vector<ShardUnit*> units;
  std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> fn;
  std::vector<bool> input_requires_grad;
};

// A failure inside a unit call leaves its status in the owner's error_ (so
// TrainStep reports it with its code: a peer's timeout stays
// DeadlineExceeded) and throws, the only way out of autograd.
//
// inputs = [unit shards..., differentiable inputs...]. The unit runs without
// history in forward and is recomputed with history in backward.
struct UnitFunction : public torch::autograd::Function<UnitFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                ShardedModel::Call* call, at::TensorList inputs) {
    ShardedModel& owner = *call->owner;
    const size_t k = call->units.size();
    std::vector<at::Tensor> xs(inputs.begin() + k, inputs.end());
    for (ShardUnit* u : call->units) {
      if (absl::Status s = owner.Bind(*u); !s.ok()) {
        owner.error_ = s;
        for (ShardUnit* v : call->units) owner.Unbind(*v);
        throw std::runtime_error(s.ToString());
      }
    }
    std::vector<at::Tensor> outs;
    try {
      outs = call->fn(xs);
    } catch (...) {
      for (ShardUnit* u : call->units) owner.Unbind(*u);
      throw;
    }
    for (ShardUnit* u : call->units) owner.Unbind(*u);
    ctx->saved_data["call"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(call));
    ctx->save_for_backward(xs);
    return outs;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto* call = reinterpret_cast<ShardedModel::Call*>(
        static_cast<intptr_t>(ctx->saved_data["call"].toInt()));
    ShardedModel& owner = *call->owner;
    const std::vector<at::Tensor> saved = ctx->get_saved_variables();
    auto fail = [&](const absl::Status& s) {
      owner.error_ = s;
      for (ShardUnit* u : call->units) owner.Unbind(*u);
      throw std::runtime_error(s.ToString());
    };
    for (ShardUnit* u : call->units) {
      if (absl::Status s = owner.Bind(*u); !s.ok()) fail(s);
    }
    std::vector<at::Tensor> xs;
    std::vector<at::Tensor> wrt;
    for (size_t i = 0; i < saved.size(); ++i) {
      xs.push_back(saved[i].detach().requires_grad_(call->input_requires_grad[i]));
      if (call->input_requires_grad[i]) wrt.push_back(xs.back());
    }
    const size_t num_input_grads = wrt.size();
    for (ShardUnit* u : call->units) {
      for (const at::Tensor& p : u->params) wrt.push_back(p);
    }
    std::vector<at::Tensor> grads;
    try {
      std::vector<at::Tensor> outs, grads_out;
      {
        at::AutoGradMode grad_on(true);
        std::vector<at::Tensor> recomputed = call->fn(xs);
        for (size_t i = 0; i < recomputed.size(); ++i) {
          if (recomputed[i].defined() && recomputed[i].requires_grad() && grad_outputs[i].defined()) {
            outs.push_back(recomputed[i]);
            grads_out.push_back(grad_outputs[i]);
          }
        }
      }
      if (!outs.empty()) {
        grads = torch::autograd::grad(outs, wrt, grads_out, /*retain_graph=*/false,
                                      /*create_graph=*/false, /*allow_unused=*/true);
      } else {
        grads.assign(wrt.size(), at::Tensor());
      }
    } catch (...) {
      // A unit left bound would serve this gathered copy from now on.
      for (ShardUnit* u : call->units) owner.Unbind(*u);
      throw;
    }
    // The unit's flat gradient, in float32 (bfloat16 gradients are summed
    // across ranks in float32), then each rank's summed shard.
    std::vector<at::Tensor> shard_grads;
    size_t g = num_input_grads;
    for (ShardUnit* u : call->units) {
      at::Tensor flat;
      {
        at::NoGradGuard no_grad;
        flat = at::zeros({u->shard_numel * owner.world_size()},
                         u->local.options().dtype(at::kFloat).requires_grad(false));
        for (size_t j = 0; j < u->params.size(); ++j, ++g) {
          if (!grads[g].defined()) continue;
          flat.narrow(0, u->offsets[j], grads[g].numel()).copy_(grads[g].reshape({-1}));
        }
      }
      owner.Unbind(*u);
      auto reduced = owner.ReduceScatter(*u, flat);
      if (!reduced.ok()) fail(reduced.status());
      shard_grads.push_back(reduced->to(u->local.scalar_type()));
    }
    torch::autograd::variable_list result;
    result.push_back(at::Tensor());  // the Call pointer
    for (at::Tensor& sg : shard_grads) result.push_back(sg);
    size_t next = 0;
    for (size_t i = 0; i < saved.size(); ++i) {
      result.push_back(call->input_requires_grad[i] ? grads[next++] : at::Tensor());
    }
    return result;
  }
};

ShardedModel::ShardedModel(CausalLM& model, Communicator* communicator)
    : model_(model), communicator_(communicator) {}

ShardedModel::~ShardedModel() = default;

int ShardedModel::rank() const { return communicator_ == nullptr ? 0 : communicator_->rank(); }
int ShardedModel::world_size() const {
  return communicator_ == nullptr ? 1 : communicator_->world_size();
}

absl::StatusOr<std::unique_ptr<ShardedModel>> ShardedModel::Create(CausalLM& model,
                                                                   Communicator* communicator) {
  std::unique_ptr<ShardedModel> sm(new ShardedModel(model, communicator));
  const int world = sm->world_size(), rank = sm->rank();
  const auto named = model.NamedParametersOrdered();
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto& [name, p] : named) {
    if (!p.requires_grad()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sharded training: parameter '", name, "' does not require grad (every parameter is trained)"));
    }
    shapes.emplace_back(name, p.sizes().vec());
  }
  ROLL_ASSIGN_OR_RETURN(sm->layout_, ShardLayout::Create(shapes, world));
  for (const ShardUnitLayout& l : sm->layout_.units()) {
    auto u = std::make_unique<ShardUnit>();
    u->name = l.name;
    for (size_t j = 0; j < l.params.size(); ++j) {
      u->param_names.push_back(named[l.params[j]].first);
      u->params.push_back(named[l.params[j]].second);
      u->shapes.push_back(shapes[l.params[j]].second);
    }
    u->offsets = l.offsets;
    u->numel = l.numel;
    u->shard_numel = l.shard_numel;
    sm->units_.push_back(std::move(u));
  }
  for (auto& u : sm->units_) {
    if (u->name == "embed") sm->embed_ = u.get();
    if (u->name == "head") sm->head_ = u.get();
    if (absl::StartsWith(u->name, "layers.")) sm->layers_.push_back(u.get());
  }
  if (sm->embed_ == nullptr || sm->head_ == nullptr ||
      static_cast<int64_t>(sm->layers_.size()) != model.config().num_hidden_layers) {
    return absl::InternalError("sharded training: the model's parameters do not form embeddings, layers and a head");
  }
  try {
    at::NoGradGuard no_grad;
    for (auto& u : sm->units_) {
      at::Tensor flat = at::zeros({u->shard_numel * world}, u->params[0].options().requires_grad(false));
      for (size_t j = 0; j < u->params.size(); ++j) {
        flat.narrow(0, u->offsets[j], u->params[j].numel()).copy_(u->params[j].detach().reshape({-1}));
      }
      if (world > 1) {
        // Every rank starts from rank 0's weights, whatever it loaded.
        at::Tensor wire = NeedsHalfView(flat, communicator) ? flat.view(at::kHalf) : flat;
        ROLL_RETURN_IF_ERROR(Annotate(communicator->Broadcast(wire, 0),
                                      absl::StrCat("sharded training: broadcasting unit '", u->name, "'")));
      }
      u->local = flat.narrow(0, u->begin(rank), u->shard_numel).clone().requires_grad_(true);
    }
    // The model keeps empty tensors; unit calls bind them.
    for (auto& u : sm->units_) sm->Unbind(*u);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("sharded training: ", e.what_without_backtrace()));
  }
  return sm;
}

std::vector<AdamW::Param> ShardedModel::OptimizerParams() const {
  std::vector<AdamW::Param> out;
  const int r = rank();
  for (const auto& u : units_) {
    AdamW::Param p{u->name, u->local, {}};
    const int64_t lo = u->begin(r), hi = lo + u->shard_numel;
    for (size_t j = 0; j < u->params.size(); ++j) {
      if (u->shapes[j].size() < 2) continue;
      const int64_t a = std::max(lo, u->offsets[j]);
      const int64_t b = std::min(hi, u->offsets[j] + c10::multiply_integers(u->shapes[j]));
      if (a < b) p.decay_ranges.emplace_back(a - lo, b - lo);
    }
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<at::Tensor> ShardedModel::Pieces() const {
  std::vector<at::Tensor> out;
  for (size_t u = 0; u < units_.size(); ++u) {
    const int64_t n = layout_.RealElements(u, rank());
    if (n > 0) out.push_back(units_[u]->local.detach().narrow(0, 0, n));
  }
  return out;
}

std::vector<at::Tensor> ShardedModel::Shards() const {
  std::vector<at::Tensor> out;
  for (const auto& u : units_) out.push_back(u->local);
  return out;
}

absl::StatusOr<at::Tensor> ShardedModel::Gather(const ShardUnit& unit) {
  at::NoGradGuard no_grad;
  at::Tensor local = unit.local.detach();
  if (world_size() == 1) return local;
  const bool half = NeedsHalfView(local, communicator_);
  comm_bytes_ += static_cast<int64_t>(local.nbytes()) * world_size();
  auto parts = communicator_->AllGather(half ? local.view(at::kHalf) : local);
  if (!parts.ok()) {
    return Annotate(parts.status(), absl::StrCat("sharded training: gathering unit '", unit.name, "'"));
  }
  at::Tensor full = at::cat(*parts);
  return half ? full.view(at::kBFloat16) : full;
}

absl::Status ShardedModel::Bind(ShardUnit& unit) {
  if (unit.bound++ > 0) return absl::OkStatus();
  auto full = Gather(unit);
  if (!full.ok()) {
    unit.bound = 0;
    return full.status();
  }
  for (size_t j = 0; j < unit.params.size(); ++j) {
    unit.params[j].set_data(
        full->narrow(0, unit.offsets[j], c10::multiply_integers(unit.shapes[j])).view(unit.shapes[j]));
  }
  return absl::OkStatus();
}

void ShardedModel::Unbind(ShardUnit& unit) {
  if (unit.bound > 1) {
    --unit.bound;
    return;
  }
  unit.bound = 0;
  for (at::Tensor& p : unit.params) {
    p.set_data(at::empty({0}, p.options().requires_grad(false)));
  }
}

absl::StatusOr<at::Tensor> ShardedModel::ReduceScatter(const ShardUnit& unit,
                                                       const at::Tensor& full_grad) {
  if (world_size() == 1) return full_grad;
  comm_bytes_ += static_cast<int64_t>(full_grad.nbytes());
  at::Tensor out = at::empty({unit.shard_numel}, full_grad.options());
  ROLL_RETURN_IF_ERROR(Annotate(communicator_->ReduceScatter(full_grad, &out, ReduceOp::kSum),
                                absl::StrCat("sharded training: reducing the gradient of unit '",
                                             unit.name, "'")));
  return out;
}

std::vector<at::Tensor> ShardedModel::Apply(
    std::vector<ShardUnit*> units,
    std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> fn,
    std::vector<at::Tensor> inputs) {
  auto call = std::make_unique<Call>();
  call->owner = this;
  call->units = std::move(units);
  call->fn = std::move(fn);
  std::vector<at::Tensor> all;
  for (ShardUnit* u : call->units) all.push_back(u->local);
  for (const at::Tensor& x : inputs) {
    call->input_requires_grad.push_back(x.requires_grad());
    all.push_back(x);
  }
  Call* raw = call.get();
  calls_.push_back(std::move(call));
  return UnitFunction::apply(raw, at::TensorList(all));
}

absl::StatusOr<ShardedModel::Outputs> ShardedModel::Forward(const at::Tensor& ids,
                                                            const at::Tensor& mask,
                                                            const at::Tensor& pos, bool logits,
                                                            bool values) {
  ROLL_ASSIGN_OR_RETURN(CausalLM::ForwardContext ctx, model_.PrepareForward(ids, mask, pos));
  error_ = absl::OkStatus();
  const CausalLM& model = model_;
  const int64_t cols = ids.size(1);
  try {
    at::Tensor x = Apply({embed_}, [&model, ctx](const std::vector<at::Tensor>&) {
      return std::vector<at::Tensor>{model.Embed(ctx)};
    }, {})[0];
    for (size_t i = 0; i < layers_.size(); ++i) {
      x = Apply({layers_[i]}, [&model, ctx, i](const std::vector<at::Tensor>& in) {
        return std::vector<at::Tensor>{model.RunLayer(static_cast<int64_t>(i), ctx, in[0])};
      }, {x})[0];
    }
    std::vector<ShardUnit*> head_units = {head_};
    if (logits && model.config().tie_word_embeddings) head_units.push_back(embed_);
    std::vector<at::Tensor> outs =
        Apply(head_units, [this, &model, logits, values, cols](const std::vector<at::Tensor>& in) {
          at::Tensor h = model.FinalNorm(in[0]);
          auto take = [this](absl::StatusOr<at::Tensor> t) {
            if (!t.ok()) {
              error_ = t.status();
              throw std::runtime_error(error_.ToString());
            }
            return *std::move(t);
          };
          // Unrequested outputs are empty placeholders without history.
          const at::Tensor none = at::zeros({0}, h.options());
          return std::vector<at::Tensor>{
              logits ? take(model.Logits(h)) : none,
              values ? take(model.Values(h.slice(1, 0, cols - 1))) : none};
        }, {x});
    Outputs result;
    if (logits) result.logits = outs[0];
    if (values) result.values = outs[1];
    return result;
  } catch (const c10::Error& e) {
    if (!error_.ok()) return TakeError();
    return absl::InternalError(absl::StrCat("sharded forward: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    if (!error_.ok()) return TakeError();
    return absl::InternalError(absl::StrCat("sharded forward: ", e.what()));
  }
}

absl::StatusOr<double> ShardedModel::ClipGradNorm(double max_norm) {
  at::NoGradGuard no_grad;
  double local = 0;
  for (const auto& u : units_) {
    const at::Tensor& g = u->local.grad();
    if (g.defined()) local += g.to(at::kFloat).pow(2).sum().item<double>();
  }
  at::Tensor total = torch::tensor({local}, at::kDouble);
  if (world_size() > 1) {
    ROLL_RETURN_IF_ERROR(Annotate(communicator_->AllReduce(total, ReduceOp::kSum),
                                  "sharded training: reducing the gradient norm"));
  }
  const double norm = std::sqrt(total.item<double>());
  const double coef = max_norm / (norm + 1e-6);
  if (max_norm > 0 && std::isfinite(norm) && coef < 1.0) {
    for (const auto& u : units_) {
      at::Tensor g = u->local.grad();
      if (g.defined()) g.mul_(coef);
    }
  }
  return norm;
}

absl::Status ShardedModel::Materialize() {
  if (materialized_.defined()) return absl::OkStatus();
  try {
    at::NoGradGuard no_grad;
    int64_t total = 0;
    for (const auto& u : units_) total += u->numel;
    at::Tensor buffer = at::empty({total}, units_[0]->local.options().requires_grad(false));
    int64_t offset = 0;
    for (auto& u : units_) {
      auto full = Gather(*u);
      if (!full.ok()) {
        Release();
        return full.status();
      }
      buffer.narrow(0, offset, u->numel).copy_(full->narrow(0, 0, u->numel));
      for (size_t j = 0; j < u->params.size(); ++j) {
        u->params[j].set_data(buffer.narrow(0, offset + u->offsets[j], c10::multiply_integers(u->shapes[j]))
                                  .view(u->shapes[j]));
      }
      u->bound = 1;
      offset += u->numel;
    }
    materialized_ = buffer;
  } catch (const std::exception& e) {
    Release();
    return absl::InternalError(absl::StrCat("sharded training: gathering the model: ", e.what()));
  }
  return absl::OkStatus();
}

void ShardedModel::Release() {
  for (auto& u : units_) {
    u->bound = 1;
    Unbind(*u);
  }
  materialized_ = at::Tensor();
}

absl::Status ShardedModel::LoadFull(
    const std::function<absl::StatusOr<at::Tensor>(const std::string&)>& read) {
  const int r = rank();
  std::vector<at::Tensor> shards;
  // Read and check everything before changing anything.
  for (const auto& u : units_) {
    at::NoGradGuard no_grad;
    at::Tensor flat = at::zeros({u->shard_numel * world_size()}, u->local.options().requires_grad(false));
    for (size_t j = 0; j < u->params.size(); ++j) {
      ROLL_ASSIGN_OR_RETURN(at::Tensor t, read(u->param_names[j]));
      if (t.sizes().vec() != u->shapes[j]) {
        return absl::InvalidArgumentError(absl::StrCat("tensor '", u->param_names[j], "' has shape ",
                                                       ShapeString(t.sizes()), ", the model's is ",
                                                       ShapeString(u->shapes[j])));
      }
      flat.narrow(0, u->offsets[j], t.numel()).copy_(t.reshape({-1}));
    }
    shards.push_back(flat.narrow(0, u->begin(r), u->shard_numel).clone());
  }
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < units_.size(); ++i) units_[i]->local.copy_(shards[i]);
  return absl::OkStatus();
}

void ShardedModel::BeginStep() {
  // The calls are kept for the whole step, so a graph built by one
  // micro-batch stays valid while later ones run.
  calls_.clear();
  comm_bytes_ = 0;
  error_ = absl::OkStatus();
}

int64_t ShardedModel::TakeCommBytes() {
  const int64_t n = comm_bytes_;
  comm_bytes_ = 0;
  return n;
}

absl::Status ShardedModel::TakeError() {
  absl::Status s = error_;
  error_ = absl::OkStatus();
  return s;
}

}  // namespace roll::strategies_internal
