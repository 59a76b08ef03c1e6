#include "roll/pipeline/train_phase.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "roll/algorithms/advantages.h"
#include "roll/algorithms/policy_loss.h"
#include "roll/common/logging.h"
#include "roll/common/stopwatch.h"
#include "roll/pipeline/pipeline.h"
#include "roll/worker/batch_keys.h"

namespace roll {
namespace {

// The numeric meta of a worker's reply (its metrics).
void MergeMeta(const Batch& reply, Metrics* m) {
  for (const auto& [k, v] : reply.meta()) {
    double d = 0;
    if (absl::SimpleAtod(v, &d)) (*m)[k] = d;
  }
}

}  // namespace

Batch PackTrainingRows(const std::vector<TrainingRow>& rows, int64_t num_groups) {
  const int64_t B = static_cast<int64_t>(rows.size());
  int64_t T = 2;
  for (const TrainingRow& r : rows) T = std::max<int64_t>(T, static_cast<int64_t>(r.ids.size()));
  at::Tensor ids = at::zeros({B, T}, at::kLong), attn = at::zeros({B, T}, at::kLong);
  at::Tensor resp = at::zeros({B, T}, at::kLong);
  at::Tensor scores = at::zeros({B}, at::kFloat), gidx = at::zeros({B}, at::kLong);
  at::Tensor weight = at::zeros({B}, at::kFloat);
  at::Tensor infer_lp = at::zeros({B, T - 1}, at::kFloat);
  int64_t* pi = ids.data_ptr<int64_t>();
  int64_t* pa = attn.data_ptr<int64_t>();
  int64_t* pr = resp.data_ptr<int64_t>();
  float* pl = infer_lp.data_ptr<float>();
  std::vector<double> group_tokens(std::max<int64_t>(num_groups, 0), 0.0);
  bool steps = false;
  for (const TrainingRow& r : rows) steps = steps || !r.turn.empty();
  at::Tensor token_turn, turn_scores;
  if (steps) {
    token_turn = at::full({B, T - 1}, -1, at::kLong);
    turn_scores = at::zeros({B, T - 1}, at::kFloat);
  }
  int64_t turn_offset = 0;  // turn ids of the rows before
  for (int64_t i = 0; i < B; ++i) {
    const TrainingRow& r = rows[i];
    int32_t row_turns = 0;
    for (size_t j = 0; j < r.ids.size(); ++j) {
      pi[i * T + j] = r.ids[j];
      pa[i * T + j] = 1;
      pr[i * T + j] = r.response_mask[j];
      if (j > 0) pl[i * (T - 1) + j - 1] = r.logprobs[j];
      group_tokens[r.group] += r.response_mask[j];
      if (steps && j > 0 && j < r.turn.size() && r.turn[j] >= 0) {
        token_turn.data_ptr<int64_t>()[i * (T - 1) + j - 1] = turn_offset + r.turn[j];
        turn_scores.data_ptr<float>()[i * (T - 1) + j - 1] = r.turn_score[j];
        row_turns = std::max(row_turns, r.turn[j] + 1);
      }
    }
    turn_offset += row_turns;
    scores[i] = r.score;
    gidx[i] = r.group;
  }
  // prompt-mean aggregation: every group weighs the same; within a group
  // every loss token does.
  const double G = static_cast<double>(num_groups);
  for (int64_t i = 0; i < B; ++i) {
    const double gt = group_tokens[rows[i].group];
    weight[i] = gt > 0 ? static_cast<float>(1.0 / (gt * G)) : 0.0f;
  }
  Batch b;
  b.SetTensor(keys::kInputIds, ids);
  b.SetTensor(keys::kAttentionMask, attn);
  b.SetTensor(keys::kResponseMask, resp);
  b.SetTensor(keys::kScores, scores);
  b.SetTensor(keys::kGroupIndex, gidx);
  b.SetTensor(keys::kSampleWeight, weight);
  b.SetTensor(keys::kInferLogProbs, infer_lp);
  if (steps) {
    b.SetTensor(keys::kTokenTurn, token_turn);
    b.SetTensor(keys::kTurnScores, turn_scores);
  }
  b.SetMeta(keys::kNumGroups, absl::StrCat(num_groups));
  return b;
}

absl::StatusOr<int64_t> MiniBatchSize(const PipelineConfig& cfg, int64_t samples, const std::string& samples_what) {
  const TrainingArgs& ta = cfg.actor_train.training_args;
  const int64_t dp = cfg.actor_train.world_size;
  const int64_t mini = static_cast<int64_t>(ta.per_device_train_batch_size) * ta.gradient_accumulation_steps * dp;
  if (mini <= 0 || samples % mini != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        samples_what, " samples per step must be a multiple of the mini-batch "
        "actor_train.training_args.per_device_train_batch_size x gradient_accumulation_steps x "
        "world_size = ", ta.per_device_train_batch_size, " x ", ta.gradient_accumulation_steps, " x ", dp, " = ",
        mini, ", so every data-parallel rank gets whole micro-batches"));
  }
  return mini;
}

std::vector<std::pair<int64_t, int64_t>> MiniBatchRanges(int64_t batch, int64_t mini, int epochs) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (mini <= 0) return out;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    for (int64_t b = 0; b < batch; b += mini) out.emplace_back(b, std::min(batch, b + mini));
  }
  return out;
}

absl::Status ComputeAdvantagesInto(const PipelineConfig& cfg, Batch* batch, Metrics* m) {
  AdvantageOptions o;
  o.estimator = cfg.adv_estimator;
  o.gamma = cfg.gamma;
  o.lambd = cfg.lambd;
  o.norm_mean_type = cfg.norm_mean_type;
  o.norm_std_type = cfg.norm_std_type;
  o.whiten_advantages = cfg.whiten_advantages;
  o.advantage_clip = cfg.advantage_clip;
  AdvantageInputs in;
  ROLL_ASSIGN_OR_RETURN(in.scores, batch->Tensor(keys::kScores));
  ROLL_ASSIGN_OR_RETURN(in.group_index, batch->Tensor(keys::kGroupIndex));
  ROLL_ASSIGN_OR_RETURN(at::Tensor ids, batch->Tensor(keys::kInputIds));
  ROLL_ASSIGN_OR_RETURN(at::Tensor resp, batch->Tensor(keys::kResponseMask));
  ROLL_ASSIGN_OR_RETURN(at::Tensor attn, batch->Tensor(keys::kAttentionMask));
  in.mask = (resp * attn).slice(1, 1).to(at::kFloat);
  if (batch->HasTensor(keys::kValues)) in.values = *batch->Tensor(keys::kValues);
  if (batch->HasTensor(keys::kTokenTurn)) {
    in.token_turn = *batch->Tensor(keys::kTokenTurn);
    ROLL_ASSIGN_OR_RETURN(in.turn_scores, batch->Tensor(keys::kTurnScores));
  }
  if (cfg.add_token_level_kl && batch->HasTensor(keys::kRefLogProbs)) {
    ROLL_ASSIGN_OR_RETURN(at::Tensor old, batch->Tensor(keys::kOldLogProbs));
    in.token_kl = KlEstimate(old, *batch->Tensor(keys::kRefLogProbs), cfg.kl_penalty);
    in.kl_coef = cfg.init_kl_coef;
    (*m)["actor/reward_kl"] = ((in.token_kl * in.mask).sum() / in.mask.sum().clamp_min(1)).item<double>();
  }
  ROLL_ASSIGN_OR_RETURN(AdvantageOutput out, ComputeAdvantages(o, in));
  batch->SetTensor(keys::kAdvantages, out.advantages);
  batch->SetTensor(keys::kReturns, out.returns);
  const double tokens = std::max(1.0, in.mask.sum().item<double>());
  (*m)["train/advantage_mean"] = (out.advantages * in.mask).sum().item<double>() / tokens;
  (*m)["train/advantage_abs_mean"] = (out.advantages.abs() * in.mask).sum().item<double>() / tokens;
  return absl::OkStatus();
}

absl::Status CheckTrainPhaseConfig(const PipelineConfig& cfg) {
  if (!cfg.actor_train.present || !cfg.actor_infer.present) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", cfg.pipeline, " pipeline needs actor_train and actor_infer sections"));
  }
  if (cfg.adv_estimator == AdvEstimator::kGae && !cfg.critic.present) {
    return absl::InvalidArgumentError("adv_estimator 'gae' needs a critic section");
  }
  if ((cfg.use_kl_loss || cfg.add_token_level_kl) && !cfg.reference.present) {
    return absl::InvalidArgumentError("use_kl_loss / add_token_level_kl need a reference section");
  }
  if (!cfg.use_decoupled_loss && cfg.rollout_is != RolloutIs::kNone) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rollout_is: ", Sv(ToString(cfg.rollout_is)), " corrects for the generator's log-probs differing from the trainer's, "
        "but use_decoupled_loss: false takes the generator's as the old policy; turn one of them off"));
  }
  return absl::OkStatus();
}

double ClipReward(const PipelineConfig& cfg, double reward) {
  return cfg.reward_clip > 0 ? std::clamp(reward, -cfg.reward_clip, cfg.reward_clip) : reward;
}

TrainPhase::TrainPhase(const PipelineConfig& config, JobClusters* clusters, int64_t mini_batch, Activate activate)
    : config_(config), clusters_(clusters), mini_batch_(mini_batch), activate_(std::move(activate)) {}

int64_t TrainPhase::UpdatesPerStep(int64_t samples) const { return samples / mini_batch_ * config_.ppo_epochs; }

absl::StatusOr<ComputeCounter> ComputeCounter::FromConfig(const PipelineConfig& cfg) {
  auto read = [](const WorkerConfig& role) {
    return ModelConfig::FromJsonFile(role.model_args.model_name_or_path + "/config.json");
  };
  ComputeCounter c;
  ROLL_ASSIGN_OR_RETURN(c.actor_, read(cfg.actor_train));
  if (cfg.critic.present) {
    ROLL_ASSIGN_OR_RETURN(c.critic_, read(cfg.critic));
  }
  if (cfg.reference.present) {
    ROLL_ASSIGN_OR_RETURN(c.reference_, read(cfg.reference));
  }
  c.recompute_old_ = cfg.use_decoupled_loss;
  c.epochs_ = static_cast<double>(cfg.ppo_epochs);
  return c;
}

double ComputeCounter::TrainFlops(const Batch& batch) const {
  auto attn = batch.Tensor(keys::kAttentionMask);
  if (!attn.ok()) return 0;
  const at::Tensor lengths = attn->sum(1).to(at::kLong).contiguous();
  const int64_t* len = lengths.data_ptr<int64_t>();
  double actor = 0, critic = 0, reference = 0;
  for (int64_t i = 0; i < lengths.numel(); ++i) {
    actor += ForwardFlops(actor_, len[i]);
    if (critic_) critic += ForwardFlops(*critic_, len[i]);
    if (reference_) reference += ForwardFlops(*reference_, len[i]);
  }
  // Forwards: old log-probs (recomputed), reference, critic values; then
  // ppo_epochs x (forward + backward = 3 forwards) of actor and critic.
  return (recompute_old_ ? actor : 0.0) + reference + critic + 3.0 * epochs_ * (actor + critic);
}

double ComputeCounter::GenerationFlops(const std::vector<std::pair<int64_t, int64_t>>& samples) const {
  double total = 0;
  for (const auto& [prompt, response] : samples) {
    if (response > 0) total += ForwardFlops(actor_, prompt + response - 1);
  }
  return total;
}

const ComputeCounter* TrainPhase::Compute() {
  if (!compute_.has_value()) {
    compute_ = ComputeCounter::FromConfig(config_);
    if (!compute_->ok()) {
      LogWarning(absl::StrCat("no compute/ metrics: ", compute_->status().message()));
    }
  }
  return compute_->ok() ? &**compute_ : nullptr;
}

absl::Status TrainPhase::Run(int64_t step, Batch* batch, Metrics* m) {
  if (const ComputeCounter* c = Compute()) (*m)["compute/train_flops"] = c->TrainFlops(*batch);
  ROLL_RETURN_IF_ERROR(ComputeLogProbs(step, batch, m));
  ROLL_RETURN_IF_ERROR(AtStage(ComputeAdvantagesInto(config_, batch, m), step, "advantages"));
  return Update(step, *batch, m);
}

absl::Status TrainPhase::ComputeLogProbs(int64_t step, Batch* batch, Metrics* m) {
  const Stopwatch t;
  const Batch lp_in = *batch;
  if (!config_.use_decoupled_loss) {
    // The generator's log-probs are the old policy (the coupled objective).
    ROLL_ASSIGN_OR_RETURN(at::Tensor infer, batch->Tensor(keys::kInferLogProbs));
    batch->SetTensor(keys::kOldLogProbs, infer);
  } else {
    ROLL_RETURN_IF_ERROR(AtStage(activate_({"actor_train"}, m), step, "offload"));
    ROLL_ASSIGN_OR_RETURN(Batch old, clusters_->actor_train().Call(actor::kComputeLogProbs, lp_in).Get());
    batch->SetTensor(keys::kOldLogProbs, *old.Tensor(keys::kLogProbs));
  }
  if (config_.use_decoupled_loss && batch->HasTensor(keys::kInferLogProbs)) {
    // How far the generator's log-probs are from the trainer's on the same
    // tokens (numerics, sampling settings, stale weights).
    at::Tensor mask = (*batch->Tensor(keys::kResponseMask) * *batch->Tensor(keys::kAttentionMask)).slice(1, 1).to(at::kFloat);
    at::Tensor diff = (*batch->Tensor(keys::kOldLogProbs) - *batch->Tensor(keys::kInferLogProbs)).abs() * mask;
    (*m)["actor/infer_logprob_abs_diff"] = diff.sum().item<double>() / std::max(1.0, mask.sum().item<double>());
  }
  if (Cluster<ActorApi>* reference = clusters_->reference()) {
    ROLL_RETURN_IF_ERROR(AtStage(activate_({"reference"}, m), step, "offload"));
    ROLL_ASSIGN_OR_RETURN(Batch ref, reference->Call(actor::kComputeLogProbs, lp_in).Get());
    batch->SetTensor(keys::kRefLogProbs, *ref.Tensor(keys::kLogProbs));
  }
  if (Cluster<CriticApi>* critic = clusters_->critic()) {
    ROLL_RETURN_IF_ERROR(AtStage(activate_({"critic"}, m), step, "offload"));
    ROLL_ASSIGN_OR_RETURN(Batch v, critic->Call(critic::kComputeValues, lp_in).Get());
    batch->SetTensor(keys::kValues, *v.Tensor(keys::kValues));
  }
  (*m)["time/logprobs_s"] = t.Seconds();
  return absl::OkStatus();
}

absl::Status TrainPhase::Update(int64_t step, const Batch& batch, Metrics* m) {
  ROLL_RETURN_IF_ERROR(AtStage(activate_({"actor_train", "critic"}, m), step, "offload"));
  const Stopwatch t;
  const int64_t B = batch.size();
  Cluster<CriticApi>* critic = clusters_->critic();
  Metrics actor_sum, critic_sum;
  int64_t updates = 0;
  for (const auto& [begin, end] : MiniBatchRanges(B, mini_batch_, config_.ppo_epochs)) {
    ROLL_ASSIGN_OR_RETURN(Batch mb, batch.Slice(begin, end));
    // prompt-mean weights are 1 / (group tokens x groups in the step); one
    // update covers mb.size() / B of the step, so scale them up to make each
    // update a mean over its own prompts.
    if (mb.HasTensor(keys::kSampleWeight)) {
      mb.SetTensor(keys::kSampleWeight,
                   *mb.Tensor(keys::kSampleWeight) * (static_cast<double>(B) / static_cast<double>(mb.size())));
    }
    if (critic != nullptr) {
      auto cr = critic->Call(critic::kTrainStep, mb).Get();
      ROLL_RETURN_IF_ERROR(AtStage(cr.status(), step, "critic training"));
      Metrics one;
      MergeMeta(*cr, &one);
      for (const auto& [k, v] : one) critic_sum[k] += v;
    }
    auto r = clusters_->actor_train().Call(actor::kTrainStep, mb).Get();
    ROLL_RETURN_IF_ERROR(AtStage(r.status(), step, "actor training"));
    Metrics one;
    MergeMeta(*r, &one);
    for (const auto& [k, v] : one) actor_sum[k] += v;
    ++updates;
  }
  for (const auto& [k, v] : actor_sum) (*m)[k] = v / std::max<int64_t>(1, updates);
  for (const auto& [k, v] : critic_sum) (*m)[k] = v / std::max<int64_t>(1, updates);
  (*m)["time/train_s"] = t.Seconds();
  return absl::OkStatus();
}

}  // namespace roll
