#include "roll/strategies/optimizer.h"

#include <torch/torch.h>

#include <cmath>
#include <set>

#include "absl/strings/str_join.h"
#include "strategies/train_internal.h"

namespace roll {

using strategies_internal::ShapeString;
namespace {

bool IsLowPrecision(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
}

}  // namespace

absl::StatusOr<std::unique_ptr<AdamW>> AdamW::Create(
    std::vector<std::pair<std::string, at::Tensor>> params, const AdamWOptions& o) {
  std::vector<Param> ranged;
  for (auto& [name, p] : params) {
    Param r{name, p, {}};
    if (p.defined() && p.dim() >= 2) r.decay_ranges.emplace_back(0, p.numel());
    ranged.push_back(std::move(r));
  }
  return CreateWithDecayRanges(std::move(ranged), o);
}

absl::StatusOr<std::unique_ptr<AdamW>> AdamW::CreateWithDecayRanges(std::vector<Param> params,
                                                                    const AdamWOptions& o) {
  auto in_unit = [](double b) { return b >= 0.0 && b < 1.0; };
  if (!in_unit(o.beta1) || !in_unit(o.beta2)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW: betas must be in [0, 1), got (", o.beta1, ", ", o.beta2, ")"));
  }
  if (!(o.eps > 0)) return absl::InvalidArgumentError(absl::StrCat("AdamW: eps must be > 0, got ", o.eps));
  if (!(o.weight_decay >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AdamW: weight_decay must be >= 0, got ", o.weight_decay));
  }
  std::vector<Slot> slots;
  std::set<std::string> seen;
  try {
    torch::NoGradGuard no_grad;
    for (Param& param : params) {
      const std::string& name = param.name;
      const at::Tensor& p = param.tensor;
      if (!seen.insert(name).second) {
        return absl::InvalidArgumentError(absl::StrCat("AdamW: parameter '", name, "' given twice"));
      }
      if (!p.defined() || !p.is_floating_point()) {
        return absl::InvalidArgumentError(
            absl::StrCat("AdamW: parameter '", name, "' is not a defined floating-point tensor"));
      }
      for (const auto& [begin, end] : param.decay_ranges) {
        if (begin < 0 || begin > end || end > p.numel() || !p.is_contiguous()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "AdamW: parameter '", name, "': decay range [", begin, ", ", end,
              ") is not inside its ", p.numel(), " elements (or the tensor is not contiguous)"));
        }
      }
      Slot s;
      s.name = name;
      s.param = p;
      auto opts = p.options().dtype(at::kFloat);
      s.exp_avg = at::zeros(p.sizes(), opts);
      s.exp_avg_sq = at::zeros(p.sizes(), opts);
      if (IsLowPrecision(p)) s.master = p.detach().to(at::kFloat).clone();
      s.decay_ranges = std::move(param.decay_ranges);
      slots.push_back(std::move(s));
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("AdamW: ", e.what_without_backtrace()));
  }
  return std::unique_ptr<AdamW>(new AdamW(std::move(slots), o));
}

absl::Status AdamW::Step(double lr) {
  if (!std::isfinite(lr) || lr < 0) {
    return absl::InvalidArgumentError(absl::StrCat("AdamW: learning rate must be finite and >= 0, got ", lr));
  }
  try {
    torch::NoGradGuard no_grad;
    const int64_t t = step_ + 1;
    const AdamWOptions& o = options_;
    const double bias_correction1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
    const double bias_correction2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
    const double step_size = lr / bias_correction1;
    const double bias_correction2_sqrt = std::sqrt(bias_correction2);
    for (Slot& s : slots_) {
      const at::Tensor& g_raw = s.param.grad();
      if (!g_raw.defined()) continue;
      at::Tensor p = s.master.defined() ? s.master : s.param;
      at::Tensor g = g_raw.scalar_type() == at::kFloat ? g_raw : g_raw.to(at::kFloat);
      if (o.weight_decay != 0) {
        for (const auto& [begin, end] : s.decay_ranges) {
          if (begin == 0 && end == p.numel()) {
            p.mul_(1.0 - lr * o.weight_decay);
          } else {
            p.view({-1}).narrow(0, begin, end - begin).mul_(1.0 - lr * o.weight_decay);
          }
        }
      }
      s.exp_avg.lerp_(g, 1.0 - o.beta1);
      s.exp_avg_sq.mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
      at::Tensor denom = (s.exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(o.eps);
      p.addcdiv_(s.exp_avg, denom, -step_size);
      if (s.master.defined()) s.param.copy_(s.master);
    }
    step_ = t;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("AdamW step: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

std::map<std::string, at::Tensor> AdamW::StateDict() const {
  std::map<std::string, at::Tensor> out;
  for (const Slot& s : slots_) {
    out["exp_avg/" + s.name] = s.exp_avg;
    out["exp_avg_sq/" + s.name] = s.exp_avg_sq;
    if (s.master.defined()) out["master/" + s.name] = s.master;
  }
  return out;
}

absl::Status AdamW::LoadStateDict(const std::map<std::string, at::Tensor>& state, int64_t step,
                                  const std::string& source) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat(source, ": negative optimizer step ", step));
  const std::map<std::string, at::Tensor> live = StateDict();
  for (const auto& [name, t] : state) {
    if (!live.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": unexpected tensor '", name, "' (no such optimizer state for this model)"));
    }
  }
  for (const auto& [name, target] : live) {
    auto it = state.find(name);
    if (it == state.end()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": missing tensor '", name, "'"));
    }
    if (!it->second.defined() || it->second.sizes() != target.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": tensor '", name, "' has shape ",
          it->second.defined() ? ShapeString(it->second.sizes()) : std::string("<undefined>"),
          ", expected ", ShapeString(target.sizes())));
    }
    if (!it->second.is_floating_point()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": tensor '", name, "' is not floating point"));
    }
  }
  try {
    torch::NoGradGuard no_grad;
    for (auto& [name, target] : live) {
      at::Tensor dst = target;
      dst.copy_(state.at(name));
    }
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(source, ": ", e.what_without_backtrace()));
  }
  step_ = step;
  return absl::OkStatus();
}

double ClipGradNorm(const std::vector<at::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> norms;
  for (const at::Tensor& p : params) {
    const at::Tensor& g = p.grad();
    if (g.defined()) norms.push_back(at::linalg_vector_norm(g, 2, {}, false, at::kFloat));
  }
  if (norms.empty()) return 0.0;
  const double total = at::linalg_vector_norm(at::stack(norms), 2).item<double>();
  const double coef = max_norm / (total + 1e-6);
  if (max_norm > 0 && std::isfinite(total) && coef < 1.0) {
    for (const at::Tensor& p : params) {
      at::Tensor g = p.grad();
      if (g.defined()) g.mul_(coef);
    }
  }
  return total;
}

}  // namespace roll
