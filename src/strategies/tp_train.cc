#include "strategies/tp_train.h"

#include <torch/torch.h>

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "roll/models/transformer.h"

namespace roll::strategies_internal {
namespace {

std::string SliceName(int rank, const std::string& name) { return absl::StrCat("tp", rank, "/", name); }

// "exp_avg/tp1/model.norm.weight" -> kind "exp_avg/", rank 1, name.
bool ParseSliceKey(const std::string& key, std::string* kind, int* rank, std::string* name) {
  const size_t a = key.find('/');
  if (a == std::string::npos) return false;
  const size_t b = key.find('/', a + 1);
  if (b == std::string::npos || key.compare(a + 1, 2, "tp") != 0) return false;
  if (!absl::SimpleAtoi(key.substr(a + 3, b - a - 3), rank)) return false;
  *kind = key.substr(0, a + 1);
  *name = key.substr(b + 1);
  return true;
}

}  // namespace

TensorParallelTrainer::~TensorParallelTrainer() {
  threads_.reset();  // before the slices they run
  group_.reset();
}

absl::StatusOr<std::unique_ptr<TensorParallelTrainer>> TensorParallelTrainer::Create(
    CausalLM& whole, std::unique_ptr<TensorParallelGroup> group) {
  if (group == nullptr || group->slices().size() < 2) {
    return absl::InvalidArgumentError("tensor-parallel training: needs a group of at least 2 slices");
  }
  std::unique_ptr<TensorParallelTrainer> t(new TensorParallelTrainer());
  t->slices_ = group->slices();
  t->group_ = std::move(group);
  const int n = t->size();
  t->threads_ = std::make_unique<SliceThreads>(n - 1, std::max(1, at::get_num_threads() / n));
  t->Release(whole);
  return t;
}

absl::Status TensorParallelTrainer::RunOnSlices(const std::function<absl::Status(int rank)>& fn) {
  const bool grad = at::GradMode::is_enabled();
  auto guarded = [&](int rank) -> absl::Status {
    try {
      return fn(rank);
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("tensor-parallel slice ", rank, ": ", e.what_without_backtrace()));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("tensor-parallel slice ", rank, ": ", e.what()));
    }
  };
  std::vector<absl::Status> status(slices_.size());
  threads_->Start([&](size_t i) {
    at::AutoGradMode mode(grad);
    status[i + 1] = guarded(static_cast<int>(i + 1));
  });
  status[0] = guarded(0);
  threads_->Wait();
  for (const absl::Status& s : status) ROLL_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

std::vector<std::pair<std::string, at::Tensor>> TensorParallelTrainer::OptimizerParams() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (int r = 0; r < size(); ++r) {
    for (auto& [name, p] : slices_[r]->NamedParametersOrdered()) {
      if (p.requires_grad()) out.emplace_back(SliceName(r, name), p);
    }
  }
  return out;
}

std::vector<at::Tensor> TensorParallelTrainer::DistinctParams() const {
  std::vector<at::Tensor> out;
  for (int r = 0; r < size(); ++r) {
    for (auto& [name, p] : slices_[r]->NamedParametersOrdered()) {
      if (p.requires_grad() && (r == 0 || TensorParallelDim(name) >= 0)) out.push_back(p);
    }
  }
  return out;
}

void TensorParallelTrainer::ShareReplicatedGradients() const {
  at::NoGradGuard no_grad;
  const std::map<std::string, at::Tensor> first = slices_[0]->NamedParameters();
  for (size_t r = 1; r < slices_.size(); ++r) {
    for (auto& [name, p] : slices_[r]->NamedParametersOrdered()) {
      if (!p.requires_grad() || TensorParallelDim(name) >= 0) continue;
      const at::Tensor& g0 = first.at(name).grad();
      if (!g0.defined() || !p.grad().defined()) continue;
      p.grad().copy_(g0);
    }
  }
}

absl::Status TensorParallelTrainer::Materialize(CausalLM& whole) const {
  std::vector<std::map<std::string, at::Tensor>> parts;
  for (CausalLM* s : slices_) parts.push_back(s->NamedParameters());
  try {
    at::NoGradGuard no_grad;
    for (auto& [name, p] : whole.NamedParametersOrdered()) {
      const int dim = TensorParallelDim(name);
      std::vector<at::Tensor> pieces;
      for (const auto& m : parts) {
        auto it = m.find(name);
        if (it == m.end()) {
          Release(whole);
          return absl::InternalError(absl::StrCat("tensor-parallel training: a slice has no '", name, "'"));
        }
        pieces.push_back(it->second);
        if (dim < 0) break;
      }
      at::Tensor target = p;
      target.set_data(dim < 0 ? pieces[0].clone() : at::cat(pieces, dim));
    }
  } catch (const c10::Error& e) {
    Release(whole);
    return absl::InternalError(
        absl::StrCat("tensor-parallel training: gathering the model: ", e.what_without_backtrace()));
  }
  return absl::OkStatus();
}

void TensorParallelTrainer::Release(CausalLM& whole) const {
  for (auto& [name, p] : whole.NamedParametersOrdered()) {
    at::Tensor target = p;
    target.set_data(at::empty({0}, p.options().requires_grad(false)));
  }
}

absl::Status TensorParallelTrainer::CopyFrom(const CausalLM& whole) { return group_->CopyFrom(whole); }

std::map<std::string, at::Tensor> TensorParallelTrainer::WholeState(
    const std::map<std::string, at::Tensor>& by_slice) const {
  // kind + name -> the slices' tensors in rank order.
  std::map<std::string, std::vector<at::Tensor>> grouped;
  std::map<std::string, std::string> param_of;
  for (const auto& [key, t] : by_slice) {
    std::string kind, name;
    int rank = 0;
    if (!ParseSliceKey(key, &kind, &rank, &name)) continue;
    auto& v = grouped[kind + name];
    if (static_cast<int>(v.size()) <= rank) v.resize(rank + 1);
    v[rank] = t;
    param_of[kind + name] = name;
  }
  std::map<std::string, at::Tensor> out;
  for (auto& [key, pieces] : grouped) {
    const int dim = TensorParallelDim(param_of[key]);
    out[key] = dim < 0 ? pieces[0] : at::cat(pieces, dim);
  }
  return out;
}

absl::StatusOr<std::map<std::string, at::Tensor>> TensorParallelTrainer::SliceState(
    const std::map<std::string, at::Tensor>& whole, const std::string& source) const {
  std::map<std::string, at::Tensor> out;
  const int n = size();
  for (const auto& [key, t] : whole) {
    const size_t a = key.find('/');
    if (a == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": unexpected tensor '", key, "'"));
    }
    const std::string kind = key.substr(0, a + 1), name = key.substr(a + 1);
    const int dim = TensorParallelDim(name);
    if (dim >= 0 && (t.dim() <= dim || t.size(dim) % n != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": tensor '", key, "' cannot be split ", n,
                                                     " ways along dimension ", dim));
    }
    const int64_t part = dim < 0 ? 0 : t.size(dim) / n;
    for (int r = 0; r < n; ++r) {
      out[kind + SliceName(r, name)] = dim < 0 ? t : t.narrow(dim, r * part, part);
    }
  }
  return out;
}

}  // namespace roll::strategies_internal
