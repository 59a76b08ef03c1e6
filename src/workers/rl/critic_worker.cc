// The "critic" worker type: a value model (the policy's architecture with
// the value head `score`, no LM head) for PPO with GAE.

#include <torch/torch.h>

#include "absl/strings/str_cat.h"
#include "roll/models/transformer.h"
#include "roll/strategies/communicator.h"
#include "roll/strategies/offload.h"
#include "roll/strategies/train_strategy.h"
#include "roll/worker/batch_keys.h"
#include "roll/worker/rl_workers.h"
#include "workers/rl/rl_loss.h"
#include "workers/rl/worker_setup.h"

namespace roll {
namespace {

class CriticWorker : public Worker {
 public:
  absl::Status Initialize(const WorkerContext& ctx) override {
    ctx_ = ctx;
    ROLL_ASSIGN_OR_RETURN(model_, LoadRoleModel(*ctx.role, ctx.config->device_type, /*trainable=*/true,
                                                             /*value_head=*/true, ctx.config->seed));
    ROLL_ASSIGN_OR_RETURN(loss_, MakeCriticLoss(*ctx.config));
    offload_ = std::make_unique<StateOffload>(absl::StrCat(ctx.cluster, " rank ", ctx.rank),
                                                           ctx.config->offload_dir);
    return absl::OkStatus();
  }

  void RegisterMethods(MethodTable& t) override {
    t.Bind(critic::kSetupCollectives, this, &CriticWorker::SetupCollectives);
    t.Bind(critic::kComputeValues, this, &CriticWorker::ComputeValues);
    t.Bind(critic::kTrainStep, this, &CriticWorker::TrainStepMethod);
    t.Bind(critic::kSaveCheckpoint, this, &CriticWorker::Save);
    t.Bind(critic::kLoadCheckpoint, this, &CriticWorker::Load);
    t.Bind(critic::kOffloadStates, this, &CriticWorker::OffloadStates);
    t.Bind(critic::kLoadStates, this, &CriticWorker::LoadStates);
  }

 private:
  absl::StatusOr<Batch> SetupCollectives(const Batch& in) {
    ROLL_RETURN_IF_ERROR(JoinCollectives(in, ctx_, &coll_));
    if (!strategy_) {
      ROLL_ASSIGN_OR_RETURN(int64_t total, MetaInt(in, keys::kTotalUpdates, 1));
      ROLL_ASSIGN_OR_RETURN(strategy_, CreateTrainStrategy(ctx_, std::move(model_), total, coll_.dp.get()));
    }
    return Batch();
  }

  absl::Status Ready(std::string_view method) const {
    if (!strategy_) return absl::FailedPreconditionError("critic used before setup_collectives");
    return offload_->Check(method);
  }

  absl::StatusOr<Batch> OffloadStates(const Batch&) {
    if (!strategy_) return absl::FailedPreconditionError("critic used before setup_collectives");
    return offload_->Offload(offload_->offloaded() ? std::vector<at::Tensor>{} : strategy_->StateTensors());
  }

  absl::StatusOr<Batch> LoadStates(const Batch&) { return offload_->Onload(); }

  absl::StatusOr<Batch> ComputeValues(const Batch& in) {
    ROLL_RETURN_IF_ERROR(Ready("compute_values"));
    ForwardSpec spec;
    spec.log_probs = false;
    spec.values = true;
    ROLL_ASSIGN_OR_RETURN(ModelOutputs o, strategy_->Forward(in, spec));
    Batch out;
    out.SetTensor(keys::kValues, o.values);
    return out;
  }

  absl::StatusOr<Batch> TrainStepMethod(const Batch& in) {
    ROLL_RETURN_IF_ERROR(Ready("train_step"));
    ForwardSpec spec;
    spec.log_probs = false;
    spec.values = true;
    ROLL_ASSIGN_OR_RETURN(TrainStepResult r, strategy_->TrainStep(in, loss_, spec));
    Batch out;
    for (const auto& [k, v] : r.metrics) {
      out.SetMeta(k.find('/') == std::string::npos ? absl::StrCat("critic/", k) : k, absl::StrCat(v));
    }
    return out;
  }

  absl::StatusOr<Batch> Save(const Batch& in) {
    ROLL_RETURN_IF_ERROR(Ready("save_checkpoint"));
    const std::string dir = in.MetaOr(keys::kDir, "");
    if (dir.empty()) return absl::InvalidArgumentError("save_checkpoint: meta 'dir' is required");
    ROLL_RETURN_IF_ERROR(strategy_->Save(dir));
    return Batch();
  }

  absl::StatusOr<Batch> Load(const Batch& in) {
    ROLL_RETURN_IF_ERROR(Ready("load_checkpoint"));
    const std::string dir = in.MetaOr(keys::kDir, "");
    if (dir.empty()) return absl::InvalidArgumentError("load_checkpoint: meta 'dir' is required");
    ROLL_RETURN_IF_ERROR(strategy_->Load(dir));
    return Batch();
  }

  WorkerContext ctx_;
  std::unique_ptr<CausalLM> model_;
  std::unique_ptr<TrainStrategy> strategy_;
  LossFn loss_;
  Collectives coll_;
  std::unique_ptr<StateOffload> offload_;
};

}  // namespace

void RegisterCriticWorker() { RegisterWorkerType<CriticApi, CriticWorker>(); }

}  // namespace roll
