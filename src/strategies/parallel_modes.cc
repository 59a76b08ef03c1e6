// TrainStrategy's three parallel layouts (strategies/parallel_mode.h):
// replicated, fully sharded and tensor parallel.

#include "strategies/parallel_mode.h"

#include <torch/torch.h>

#include <filesystem>

#include "roll/models/safetensors.h"
#include "roll/models/transformer.h"
#include "roll/strategies/communicator.h"
#include "roll/strategies/tensor_parallel.h"
#include "strategies/sharded.h"
#include "strategies/tp_train.h"
#include "strategies/train_internal.h"

namespace roll::strategies_internal {

std::string ShardFileName(int rank, int world) {
  return absl::StrCat("optimizer-rank", rank, "-of-", world, ".safetensors");
}

bool ParallelMode::distributed() const { return communicator_ != nullptr && communicator_->world_size() > 1; }

std::vector<std::pair<std::string, std::vector<int64_t>>> ParallelMode::ParameterShapes() const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto& [name, p] : model_.NamedParametersOrdered()) shapes.emplace_back(name, p.sizes().vec());
  return shapes;
}

absl::StatusOr<OptimizerFileState> ParallelMode::ReadOptimizerState(const std::string& root,
                                                                    const nlohmann::json& state,
                                                                    const std::string& state_path) const {
  if (state.contains("sharding")) {
    return absl::FailedPreconditionError(absl::StrCat(
        state_path, ": the optimizer state is sharded over ", state["sharding"].value("world_size", 0),
        " ranks (saved by fully sharded training); resume it with strategy fsdp2_train"));
  }
  OptimizerFileState out;
  out.path = (std::filesystem::path(root) / kOptimizerFile).string();
  ROLL_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(out.path));
  for (const std::string& name : file->names()) {
    ROLL_ASSIGN_OR_RETURN(out.tensors[name], file->Load(name));
  }
  return out;
}

absl::Status ParallelMode::LoadParameters(Checkpoint& checkpoint) {
  for (const auto& [name, p] : model_.NamedParametersOrdered()) {
    at::Tensor target = p;
    ROLL_RETURN_IF_ERROR(checkpoint.LoadInto(name, target));
  }
  return absl::OkStatus();
}

namespace {

namespace fs = std::filesystem;

// Every rank starts from rank 0's weights, whatever it loaded.
absl::Status BroadcastFromRankZero(Communicator* comm,
                                   const std::vector<std::pair<std::string, at::Tensor>>& params) {
  if (comm == nullptr || comm->world_size() == 1) return absl::OkStatus();
  torch::NoGradGuard no_grad;
  for (const auto& [name, p] : params) {
    if (!p.is_contiguous()) {
      return absl::InternalError(absl::StrCat("TrainStrategy: parameter '", name, "' is not contiguous"));
    }
    // Gloo has no bfloat16; a broadcast only copies bytes, so send the bits
    // as float16.
    at::Tensor t = p.scalar_type() == at::kBFloat16 && comm->backend() == "gloo" ? p.view(at::kHalf) : p;
    ROLL_RETURN_IF_ERROR(Annotate(comm->Broadcast(t, 0), absl::StrCat("broadcasting parameter '", name, "'")));
  }
  return absl::OkStatus();
}

// Sums the gradients of `params` over the ranks: consecutive gradients of
// one dtype share a flat bucket of up to `bucket_bytes`, all issued before
// any is waited on. Returns the bytes handed to the all-reduces.
absl::StatusOr<int64_t> AllReduceGradients(Communicator& comm, const std::vector<at::Tensor>& params,
                                           int64_t bucket_bytes) {
  torch::NoGradGuard no_grad;
  std::vector<std::vector<at::Tensor>> buckets;
  int64_t bytes = 0, total = 0;
  for (const at::Tensor& p : params) {
    const at::Tensor& g = p.grad();
    const int64_t n = g.numel() * static_cast<int64_t>(g.element_size());
    if (buckets.empty() || bytes + n > bucket_bytes || buckets.back().front().scalar_type() != g.scalar_type()) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(g);
    bytes += n;
    total += static_cast<int64_t>(g.nbytes());
  }
  std::vector<at::Tensor> flats;
  std::vector<std::unique_ptr<CollectiveWork>> works;
  for (const auto& bucket : buckets) {
    std::vector<at::Tensor> pieces;
    for (const at::Tensor& g : bucket) pieces.push_back(g.reshape({-1}));
    at::Tensor flat = at::cat(pieces);
    // Gloo cannot sum bfloat16; sum in float32 (copy_ below rounds back).
    if (flat.scalar_type() == at::kBFloat16 && comm.backend() == "gloo") flat = flat.to(at::kFloat);
    flats.push_back(flat);
    ROLL_ASSIGN_OR_RETURN(auto work, comm.AllReduceAsync(flats.back(), ReduceOp::kSum));
    works.push_back(std::move(work));
  }
  for (size_t b = 0; b < buckets.size(); ++b) {
    ROLL_RETURN_IF_ERROR(Annotate(works[b]->Wait(), absl::StrCat("all-reducing gradient bucket ", b)));
    int64_t offset = 0;
    for (const at::Tensor& g : buckets[b]) {
      at::Tensor dst = g;
      dst.copy_(flats[b].slice(0, offset, offset + g.numel()).view_as(g));
      offset += g.numel();
    }
  }
  return total;
}

// The logits and/or values of `model`.
absl::StatusOr<RawOutputs> RunCausalLM(CausalLM& model, const at::Tensor& ids, const at::Tensor& mask,
                                       const at::Tensor& pos, bool logits, bool values) {
  RawOutputs out;
  if (!values) {
    ROLL_ASSIGN_OR_RETURN(out.logits, model.Forward(ids, mask, pos));
    return out;
  }
  ROLL_ASSIGN_OR_RETURN(at::Tensor hidden, model.ForwardHidden(ids, mask, pos));
  ROLL_ASSIGN_OR_RETURN(out.values, model.Values(hidden.slice(1, 0, ids.size(1) - 1)));
  if (logits) {
    ROLL_ASSIGN_OR_RETURN(out.logits, model.Logits(hidden));
  }
  return out;
}

std::vector<at::Tensor> Tensors(const std::vector<std::pair<std::string, at::Tensor>>& named) {
  std::vector<at::Tensor> out;
  for (const auto& [name, t] : named) out.push_back(t);
  return out;
}

// Replicated data parallelism: every rank holds the whole model and its
// optimizer state; gradients are all-reduced in buckets.
class ReplicatedMode final : public ParallelMode {
 public:
  ReplicatedMode(CausalLM& model, Communicator* communicator, int64_t bucket_bytes,
                 std::vector<std::pair<std::string, at::Tensor>> trainable)
      : ParallelMode(model, communicator),
        bucket_bytes_(bucket_bytes),
        named_(std::move(trainable)),
        trained_(Tensors(named_)) {}

  absl::StatusOr<std::unique_ptr<AdamW>> CreateOptimizer(const AdamWOptions& options) const override {
    return AdamW::Create(named_, options);
  }
  const std::vector<at::Tensor>& trained() const override { return trained_; }
  std::vector<at::Tensor> ParameterTensors() const override { return model_.Parameters(); }

  absl::StatusOr<RawOutputs> Run(int, const at::Tensor& ids, const at::Tensor& mask, const at::Tensor& pos,
                                 bool logits, bool values) override {
    return RunCausalLM(model_, ids, mask, pos, logits, values);
  }

  absl::StatusOr<GradientReduction> ReduceGradients(double max_norm) override {
    GradientReduction r;
    if (distributed()) {
      ROLL_ASSIGN_OR_RETURN(r.comm_bytes, AllReduceGradients(*communicator_, trained_, bucket_bytes_));
    }
    r.grad_norm = ClipGradNorm(trained_, max_norm);
    return r;
  }

  absl::Status WithFullModel(const std::function<absl::Status(CausalLM&)>& fn) override { return fn(model_); }

 private:
  const int64_t bucket_bytes_;
  const std::vector<std::pair<std::string, at::Tensor>> named_;
  const std::vector<at::Tensor> trained_;
};

// The AdamW state kinds a slot has: moments always, master for 16-bit.
std::vector<std::string> StateKinds(const at::Tensor& param) {
  std::vector<std::string> kinds = {"exp_avg/", "exp_avg_sq/"};
  if (param.scalar_type() == at::kBFloat16 || param.scalar_type() == at::kHalf) {
    kinds.push_back("master/");
  }
  return kinds;
}

// Fully sharded data parallelism: each rank holds 1/world of every unit's
// parameters, gradients and optimizer state; a unit is gathered while it
// runs and its gradient reduce-scattered in backward.
class FullyShardedMode final : public ParallelMode {
 public:
  FullyShardedMode(CausalLM& model, Communicator* communicator, std::unique_ptr<ShardedModel> sharded)
      : ParallelMode(model, communicator), sharded_(std::move(sharded)), shards_(sharded_->Shards()) {}

  absl::StatusOr<std::unique_ptr<AdamW>> CreateOptimizer(const AdamWOptions& options) const override {
    return AdamW::CreateWithDecayRanges(sharded_->OptimizerParams(), options);
  }
  const std::vector<at::Tensor>& trained() const override { return shards_; }
  std::vector<at::Tensor> ParameterTensors() const override { return sharded_->Shards(); }

  void BeginPass() override { sharded_->BeginStep(); }
  bool collective_micro_batches() const override { return true; }
  absl::StatusOr<RawOutputs> Run(int, const at::Tensor& ids, const at::Tensor& mask, const at::Tensor& pos,
                                 bool logits, bool values) override {
    ROLL_ASSIGN_OR_RETURN(auto o, sharded_->Forward(ids, mask, pos, logits, values));
    return RawOutputs{o.logits, o.values};
  }
  absl::Status TakeBackwardError() override { return sharded_->TakeError(); }
  absl::StatusOr<GradientReduction> ReduceGradients(double max_norm) override {
    // The gradients were reduce-scattered unit by unit in backward.
    GradientReduction r;
    ROLL_ASSIGN_OR_RETURN(r.grad_norm, sharded_->ClipGradNorm(max_norm));
    r.comm_bytes = sharded_->TakeCommBytes();
    return r;
  }

  absl::Status WithFullModel(const std::function<absl::Status(CausalLM&)>& fn) override {
    ROLL_RETURN_IF_ERROR(sharded_->Materialize());
    absl::Status s;
    try {
      s = fn(model_);
    } catch (...) {
      sharded_->Release();
      throw;
    }
    sharded_->Release();
    return s;
  }
  const ShardLayout* shard_layout() const override { return &sharded_->layout(); }
  std::vector<at::Tensor> ShardPieces() const override { return sharded_->Pieces(); }

  bool sharded_optimizer() const override { return true; }
  nlohmann::json ShardingRecord() const override {
    const int world = sharded_->world_size();
    nlohmann::json sharding = {{"world_size", world}};
    for (int r = 0; r < world; ++r) sharding["files"].push_back(ShardFileName(r, world));
    for (const auto& u : sharded_->units()) {
      sharding["units"].push_back({{"name", u->name}, {"numel", u->numel}, {"shard_numel", u->shard_numel}});
    }
    return sharding;
  }
  std::vector<std::pair<std::string, std::vector<int64_t>>> ParameterShapes() const override {
    std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
    for (const auto& u : sharded_->units()) {
      for (size_t j = 0; j < u->params.size(); ++j) shapes.emplace_back(u->param_names[j], u->shapes[j]);
    }
    return shapes;
  }
  absl::StatusOr<OptimizerFileState> ReadOptimizerState(const std::string& root, const nlohmann::json& state,
                                                        const std::string& state_path) const override;
  absl::Status LoadParameters(Checkpoint& checkpoint) override {
    return Annotate(sharded_->LoadFull([&](const std::string& name) { return checkpoint.Load(name); }),
                    checkpoint.path());
  }

 private:
  const std::unique_ptr<ShardedModel> sharded_;
  const std::vector<at::Tensor> shards_;
};

// This rank's AdamW state ("exp_avg/<unit>", ...) from a checkpoint's
// optimizer files: the per-rank files of a sharded trainer state (written
// over any number of ranks) or the per-parameter optimizer.safetensors of a
// replicated one. Each unit's full flat state is assembled and this rank's
// shard cut from it.
absl::StatusOr<OptimizerFileState> FullyShardedMode::ReadOptimizerState(const std::string& root_dir,
                                                                        const nlohmann::json& state,
                                                                        const std::string& state_path) const {
  const fs::path root(root_dir);
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  const bool from_shards = state.contains("sharding");
  OptimizerFileState result;
  if (from_shards) {
    result.path = absl::StrCat(root_dir, " (optimizer shards)");
    const nlohmann::json& sh = state["sharding"];
    if (!sh.is_object() || !sh.contains("files") || !sh["files"].is_array() || sh["files"].empty()) {
      return absl::InvalidArgumentError(absl::StrCat(state_path, ": 'sharding.files' must list the optimizer files"));
    }
    for (const auto& f : sh["files"]) {
      if (!f.is_string() || f.get<std::string>().find('/') != std::string::npos) {
        return absl::InvalidArgumentError(absl::StrCat(state_path, ": 'sharding.files' must hold plain file names"));
      }
      ROLL_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open((root / f.get<std::string>()).string()));
      files.push_back(std::move(file));
    }
  } else {
    result.path = (root / kOptimizerFile).string();
    ROLL_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(result.path));
    files.push_back(std::move(file));
  }
  std::map<std::string, at::Tensor>& out = result.tensors;
  const int rank = sharded_->rank(), world = sharded_->world_size();
  for (const auto& u : sharded_->units()) {
    for (const std::string& kind : StateKinds(u->local)) {
      at::Tensor full;
      if (from_shards) {
        std::vector<at::Tensor> parts;
        for (const auto& f : files) {
          auto t = f->Load(kind + u->name);
          if (!t.ok()) return Annotate(t.status(), f->path());
          parts.push_back(t->reshape({-1}).to(at::kFloat));
        }
        full = at::cat(parts);
        if (full.numel() < u->numel) {
          return absl::InvalidArgumentError(absl::StrCat(
              files[0]->path(), ": the shards of '", kind, u->name, "' hold ", full.numel(),
              " elements; this model's unit has ", u->numel));
        }
      } else {
        full = at::zeros({u->numel}, at::kFloat);
        for (size_t j = 0; j < u->params.size(); ++j) {
          auto t = files[0]->Load(kind + u->param_names[j]);
          if (!t.ok()) return Annotate(t.status(), files[0]->path());
          const int64_t n = c10::multiply_integers(u->shapes[j]);
          if (t->numel() != n) {
            return absl::InvalidArgumentError(absl::StrCat(files[0]->path(), ": tensor '", kind,
                                                           u->param_names[j], "' has ", t->numel(),
                                                           " elements, expected ", n));
          }
          full.narrow(0, u->offsets[j], n).copy_(t->reshape({-1}));
        }
      }
      at::Tensor padded = at::zeros({u->shard_numel * world}, at::kFloat);
      padded.narrow(0, 0, u->numel).copy_(full.narrow(0, 0, u->numel));
      out[kind + u->name] = padded.narrow(0, u->begin(rank), u->shard_numel).clone();
    }
  }
  return result;
}

// Tensor parallelism: the model split Megatron-style into a group's slices
// that run every micro-batch together, one thread each; the data-parallel
// communicator (if any) all-reduces every slice's gradients with the other
// workers'. The checkpoint holds whole tensors, so it resumes with any
// split.
class TensorParallelMode final : public ParallelMode {
 public:
  TensorParallelMode(CausalLM& model, Communicator* communicator, int64_t bucket_bytes,
                     std::unique_ptr<TensorParallelTrainer> tp)
      : ParallelMode(model, communicator),
        bucket_bytes_(bucket_bytes),
        tp_(std::move(tp)),
        named_(tp_->OptimizerParams()),
        trained_(Tensors(named_)),
        distinct_(tp_->DistinctParams()) {}

  absl::StatusOr<std::unique_ptr<AdamW>> CreateOptimizer(const AdamWOptions& options) const override {
    return AdamW::Create(named_, options);
  }
  const std::vector<at::Tensor>& trained() const override { return trained_; }
  std::vector<at::Tensor> ParameterTensors() const override { return trained_; }

  void BeginPass() override { comm_bytes_before_ = tp_->comm_bytes(); }
  int copies() const override { return tp_->size(); }
  absl::Status RunOnCopies(const std::function<absl::Status(int)>& fn) override { return tp_->RunOnSlices(fn); }
  absl::StatusOr<RawOutputs> Run(int copy, const at::Tensor& ids, const at::Tensor& mask, const at::Tensor& pos,
                                 bool logits, bool values) override {
    return RunCausalLM(tp_->slice(copy), ids, mask, pos, logits, values);
  }
  absl::StatusOr<GradientReduction> ReduceGradients(double max_norm) override {
    GradientReduction r;
    if (distributed()) {
      ROLL_ASSIGN_OR_RETURN(r.comm_bytes, AllReduceGradients(*communicator_, trained_, bucket_bytes_));
    }
    // The norm covers each element once (a replicated parameter through
    // slice 0's copy), whose clipped gradient the other copies then take.
    r.grad_norm = ClipGradNorm(distinct_, max_norm);
    tp_->ShareReplicatedGradients();
    return r;
  }
  void AddStepMetrics(std::map<std::string, double>* metrics) const override {
    (*metrics)["tp_comm_bytes"] = static_cast<double>(tp_->comm_bytes() - comm_bytes_before_);
  }

  absl::Status WithFullModel(const std::function<absl::Status(CausalLM&)>& fn) override {
    ROLL_RETURN_IF_ERROR(tp_->Materialize(model_));
    absl::Status s;
    try {
      s = fn(model_);
    } catch (...) {
      tp_->Release(model_);
      throw;
    }
    tp_->Release(model_);
    return s;
  }
  int tensor_parallel_size() const override { return tp_->size(); }
  std::vector<CausalLM*> slices() const override {
    std::vector<CausalLM*> out;
    for (int r = 0; r < tp_->size(); ++r) out.push_back(&tp_->slice(r));
    return out;
  }

  // Whole tensors in the checkpoint: the model is joined for the load and
  // cut into the slices after it; the optimizer state is joined and cut
  // the same way.
  std::map<std::string, at::Tensor> OptimizerStateToSave(
      const std::map<std::string, at::Tensor>& state) const override {
    return tp_->WholeState(state);
  }
  absl::Status AroundLoad(const std::function<absl::Status()>& load) override {
    return WithFullModel([&](CausalLM& whole) {
      ROLL_RETURN_IF_ERROR(load());
      return tp_->CopyFrom(whole);
    });
  }
  absl::StatusOr<OptimizerFileState> ReadOptimizerState(const std::string& root, const nlohmann::json& state,
                                                        const std::string& state_path) const override {
    ROLL_ASSIGN_OR_RETURN(OptimizerFileState whole, ParallelMode::ReadOptimizerState(root, state, state_path));
    ROLL_ASSIGN_OR_RETURN(whole.tensors, tp_->SliceState(whole.tensors, whole.path));
    return whole;
  }

 private:
  const int64_t bucket_bytes_;
  const std::unique_ptr<TensorParallelTrainer> tp_;
  const std::vector<std::pair<std::string, at::Tensor>> named_;
  const std::vector<at::Tensor> trained_;
  const std::vector<at::Tensor> distinct_;
  int64_t comm_bytes_before_ = 0;
};

absl::Status RequireTrainable(const std::vector<std::pair<std::string, at::Tensor>>& trainable) {
  if (trainable.empty()) {
    return absl::InvalidArgumentError("TrainStrategy: the model has no parameter that requires grad");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ParallelMode>> CreateReplicatedMode(CausalLM& model, Communicator* communicator,
                                                                   int64_t bucket_bytes) {
  std::vector<std::pair<std::string, at::Tensor>> trainable;
  for (auto& [name, p] : model.NamedParametersOrdered()) {
    if (p.requires_grad()) trainable.emplace_back(name, p);
  }
  ROLL_RETURN_IF_ERROR(RequireTrainable(trainable));
  ROLL_RETURN_IF_ERROR(BroadcastFromRankZero(communicator, trainable));
  return std::make_unique<ReplicatedMode>(model, communicator, bucket_bytes, std::move(trainable));
}

absl::StatusOr<std::unique_ptr<ParallelMode>> CreateFullyShardedMode(CausalLM& model,
                                                                     Communicator* communicator) {
  ROLL_ASSIGN_OR_RETURN(auto sharded, ShardedModel::Create(model, communicator));
  return std::make_unique<FullyShardedMode>(model, communicator, std::move(sharded));
}

absl::StatusOr<std::unique_ptr<ParallelMode>> CreateTensorParallelMode(
    CausalLM& model, std::unique_ptr<TensorParallelGroup> group, Communicator* communicator,
    int64_t bucket_bytes) {
  ROLL_ASSIGN_OR_RETURN(auto tp, TensorParallelTrainer::Create(model, std::move(group)));
  const auto trainable = tp->OptimizerParams();
  ROLL_RETURN_IF_ERROR(RequireTrainable(trainable));
  ROLL_RETURN_IF_ERROR(BroadcastFromRankZero(communicator, trainable));
  return std::make_unique<TensorParallelMode>(model, communicator, bucket_bytes, std::move(tp));
}

}  // namespace roll::strategies_internal
