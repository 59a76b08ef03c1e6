// The RLVR pipeline (reinforcement learning with verifiable rewards), ROLL's
// step on the pieces of src/pipeline:
//
//   rollout      RolloutScheduler over actor_infer (per-sample requests) and
//                the rewards.<domain> clusters (scores as samples finish)
//   train phase  log-probs, advantages, critic and actor updates (TrainPhase)
//   model update actor_train rank 0 to actor_infer (ModelUpdate)
//
// Validation (step 0, then every eval_steps; pass@k) generates greedy or
// sampled answers to the held-out prompts. The checkpoint state is the
// training prompts' position. BasePipeline runs the loop, the restarts,
// offload, tracking and checkpoints.

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "roll/algorithms/eval_metrics.h"
#include "roll/common/logging.h"
#include "roll/common/stopwatch.h"
#include "roll/pipeline/async_rollout.h"
#include "roll/pipeline/generation_client.h"
#include "roll/pipeline/pipeline.h"
#include "roll/pipeline/rlvr.h"
#include "roll/pipeline/validation.h"

namespace roll {
namespace {

class RlvrPipeline : public BasePipeline {
 public:
  RlvrPipeline(const PipelineConfig& config, const RunOptions& options) : BasePipeline(config, options) {}

 protected:
  absl::Status CheckConfig() override {
    const PipelineConfig& cfg = config();
    if (cfg.rewards.empty()) {
      return absl::InvalidArgumentError("the RLVR pipeline needs at least one rewards.<domain> section");
    }
    if (cfg.intrinsic_reward != IntrinsicReward::kNone && cfg.dynamic_sampling) {
      return absl::InvalidArgumentError(
          "dynamic_sampling filters groups by the verifier's rewards; it cannot be used with intrinsic_reward");
    }
    if (cfg.interrupt_min_tokens > 0 &&
        (cfg.interrupt_max_tokens < cfg.interrupt_min_tokens || cfg.interrupt_answer_tokens <= 0 ||
         cfg.interrupt_text.empty())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "forced length interruption needs interrupt_min_tokens (", cfg.interrupt_min_tokens,
          ") <= interrupt_max_tokens (", cfg.interrupt_max_tokens, "), interrupt_answer_tokens (",
          cfg.interrupt_answer_tokens, ") > 0 and a non-empty interrupt_text"));
    }
    if (cfg.downsample_samples_per_group > 0 &&
        (cfg.downsample_samples_per_group < 2 ||
         cfg.downsample_samples_per_group >= cfg.num_return_sequences_in_group)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "downsample_samples_per_group (", cfg.downsample_samples_per_group,
          ") must be at least 2 (a group's advantages need two samples) and below num_return_sequences_in_group (",
          cfg.num_return_sequences_in_group, "), or 0 to train every sample"));
    }
    ROLL_ASSIGN_OR_RETURN(pass_k_, ParsePassK(cfg));
    return CheckAsyncPlacement(cfg);
  }

  // The samples trained per step (down-sampling trains fewer than it generates).
  int64_t SamplesPerStep() const override {
    return static_cast<int64_t>(config().rollout_batch_size) * TrainedPerGroup();
  }
  std::string SamplesPerStepWhat() const override {
    return absl::StrCat("rollout_batch_size x ",
                        config().downsample_samples_per_group > 0 ? "downsample_samples_per_group"
                                                                  : "num_return_sequences_in_group",
                        " = ", config().rollout_batch_size, " x ", TrainedPerGroup(), " = ", SamplesPerStep());
  }
  int64_t TrainedPerGroup() const { return TrainedSamplesPerGroup(config()); }

  absl::Status Prepare() override {
    ROLL_ASSIGN_OR_RETURN(prompts_, LoadPromptSets(config()));
    ROLL_ASSIGN_OR_RETURN(train_iter_, MakePromptIterator(prompts_.train, config().seed));
    if (config().positive_pass_rate > 0) positive_ = std::make_unique<PositiveResampling>(config().positive_pass_rate);
    return absl::OkStatus();
  }

  absl::Status OnClustersStarted() override {
    // Asynchronous: a generator that dies fails the step (the job restarts
    // from its checkpoint under fault_tolerance); replacing it in place would
    // race the model updates the trainer sends meanwhile.
    gen_client_ = std::make_unique<ClusterGenerationClient>(
        &clusters().actor_infer(), config().async_generation_ratio == 0 ? Restarter() : nullptr);
    reward_client_ = std::make_unique<ClusterRewardClient>(clusters().reward_domains(), Restarter());
    return absl::OkStatus();
  }

  void OnClustersStopping() override {
    async_.reset();  // the producer uses both clients
    gen_client_.reset();
    reward_client_.reset();
  }

  // Synchronous: this step's prompts, generated and scored now.
  // Asynchronous (docs/async.md): the batch the producer generated (or is
  // generating) while earlier steps trained; the model update reaches the
  // generators in flight.
  absl::StatusOr<TrainingBatch> Rollout(int64_t step, Metrics* m) override {
    const PipelineConfig& cfg = config();
    absl::StatusOr<RolloutBatch> rollout;
    if (cfg.async_generation_ratio > 0) {
      if (!async_) {
        async_ = std::make_unique<AsyncRollout>(
            cfg.async_generation_ratio, [this](int64_t s) { return Collect(s); },
            [this]() { return train_iter_->PositionJson(); });
        async_->Start(step, cfg.max_steps, model_update().version());
      }
      rollout = async_->Take(step);
      ROLL_RETURN_IF_ERROR(rollout.status());
      (*m)["time/rollout_s"] = rollout->metrics["async/wait_s"];
      ROLL_RETURN_IF_ERROR(CheckVersionLag(rollout->groups, step, cfg.async_generation_ratio, m));
    } else {
      const Stopwatch t;
      rollout = Collect(step);
      ROLL_RETURN_IF_ERROR(rollout.status());
      (*m)["time/generation_s"] = t.Seconds();
    }
    return Score(step, &*rollout, m);
  }

  void OnStepTrained(int64_t step) override {
    if (async_) async_->SetVersion(step);
    trained_step_ = step;
  }

  // One rollout of rollout_batch_size prompts, generated and scored.
  absl::StatusOr<RolloutBatch> Collect(int64_t step) {
    RolloutScheduler sched(gen_client_.get(), reward_client_.get());
    return sched.Collect(RolloutFor(), [this]() { return NextPrompt(); }, step);
  }

  // The next training prompt; with No-Positive-Resampling, retired ones are
  // skipped.
  absl::StatusOr<PromptItem> NextPrompt() {
    if (!positive_) return train_iter_->Next();
    return positive_->Next(train_iter_.get(), static_cast<int64_t>(prompts_.train.size()) + 1);
  }

  RolloutOptions RolloutFor() const {
    const PipelineConfig& cfg = config();
    RolloutOptions ro;
    ro.groups = cfg.rollout_batch_size;
    ro.params = RolloutGenParams(cfg);
    if (cfg.interrupt_min_tokens > 0) {  // training rollouts only, not validation
      ro.params.interrupt_text = cfg.interrupt_text;
      ro.params.interrupt_min = cfg.interrupt_min_tokens;
      ro.params.interrupt_max = cfg.interrupt_max_tokens;
      ro.params.answer_budget = cfg.interrupt_answer_tokens;
    }
    ro.dynamic_sampling = cfg.dynamic_sampling;
    ro.max_additional_rounds = cfg.max_additional_rounds;
    ro.redundant_prompts = cfg.redundant_prompts;
    ro.seed = static_cast<uint64_t>(cfg.seed);
    return ro;
  }

  // A step's scored rollout as the training batch: the rollout's metrics,
  // No-Positive-Resampling's outcomes, an intrinsic reward in place of the
  // verifier's.
  absl::StatusOr<TrainingBatch> Score(int64_t step, RolloutBatch* rollout, Metrics* m) {
    const PipelineConfig& cfg = config();
    for (const auto& [k, v] : rollout->metrics) (*m)[k] = v;
    if (const ComputeCounter* c = train_phase().Compute()) {
      (*m)["compute/generation_flops"] = c->GenerationFlops(rollout->generated);
    }
    if (positive_) {
      // The verifier's outcomes (before any intrinsic reward replaces them).
      for (const RolloutGroup& g : rollout->groups) {
        int64_t correct = 0;
        for (const SampleResult& smp : g.samples) correct += smp.score >= 1.0 - 1e-9;
        positive_->Observe(g.prompt.id, correct, static_cast<int64_t>(g.samples.size()));
      }
      (*m)["rollout/retired_prompts"] = static_cast<double>(positive_->retired());
    }
    if (cfg.intrinsic_reward != IntrinsicReward::kNone) {
      ROLL_RETURN_IF_ERROR(ApplyIntrinsicReward(cfg.intrinsic_reward, &rollout->groups, m));
      collapse_.Observe(step, (*m)["reward/accuracy"]);
      (*m)["reward/collapse_step"] = static_cast<double>(collapse_.collapse_step());
      if (step == cfg.max_steps) {
        LogInfo(absl::StrCat("model collapse step (mean reward/accuracy over ", cfg.collapse_patience,
                             " steps below ", cfg.collapse_threshold, "): ",
                             collapse_.collapse_step() < 0 ? std::string("none")
                                                           : std::to_string(collapse_.collapse_step())));
      }
    }

    ROLL_ASSIGN_OR_RETURN(TrainingBatch tb, BuildTrainingBatch(cfg, rollout->groups));
    for (const auto& [k, v] : tb.metrics) (*m)[k] = v;
    // With an intrinsic reward, train/accuracy stays the verifier's.
    if (cfg.intrinsic_reward != IntrinsicReward::kNone) (*m)["train/accuracy"] = (*m)["reward/verifier_accuracy"];
    (*m)["throughput/gen_tokens_per_s"] =
        tb.metrics["train/response_tokens"] / std::max(1e-9, (*m)["time/generation_s"]);
    return tb;
  }

  absl::Status Validate(int64_t step, Metrics* m) override {
    // Asynchronous: between two of the producer's batches.
    if (async_) return async_->Paused([&] { return ValidateNow(m); });
    return ValidateNow(m);
  }

  absl::Status ValidateNow(Metrics* m) {
    const Stopwatch t;
    const PipelineConfig& cfg = config();
    GenParams p = RolloutGenParams(cfg);
    p.n = cfg.val_num_return_sequences;
    p.temperature = cfg.val_temperature;
    RolloutScheduler sched(gen_client_.get(), reward_client_.get());
    ValidationStats stats;
    ROLL_RETURN_IF_ERROR(
        SamplePrompts(&sched, prompts_.val, cfg.val_batch_size, p, static_cast<uint64_t>(cfg.seed), &stats));
    stats.WriteTo(pass_k_, m);
    (*m)["time/val_s"] = t.Seconds();
    return absl::OkStatus();
  }

  std::string SaveState() override {
    nlohmann::json state;
    // Asynchronous: the position after the last trained batch; batches
    // generated ahead are generated again after a resume.
    state["data_position"] =
        nlohmann::json::parse(async_ ? async_->StateAfter(trained_step_) : train_iter_->PositionJson());
    if (positive_) state["positive_resampling"] = nlohmann::json::parse(positive_->StateJson());
    state["collapse_step"] = collapse_.collapse_step();
    state["collapse_window"] = collapse_.window();
    return state.dump();
  }

  absl::Status RestoreState(const std::string& state_json) override {
    const nlohmann::json state = nlohmann::json::parse(state_json);
    if (!state.contains("data_position")) {
      return absl::InvalidArgumentError("pipeline_state.json: missing 'data_position'");
    }
    if (positive_ && state.contains("positive_resampling")) {
      absl::Status s = positive_->RestoreJson(state["positive_resampling"].dump());
      if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat("pipeline_state.json: positive_resampling: ", s.message()));
    }
    if (state.contains("collapse_step")) {
      try {
        collapse_.Restore(state["collapse_step"].get<int64_t>(),
                          state.value("collapse_window", std::vector<std::pair<int64_t, double>>{}));
      } catch (const nlohmann::json::exception& e) {
        return absl::InvalidArgumentError(absl::StrCat("pipeline_state.json: collapse_step/collapse_window: ", e.what()));
      }
    }
    return train_iter_->RestorePositionJson(state["data_position"].dump());
  }

 private:
  std::vector<int64_t> pass_k_;
  CollapseDetector collapse_{config().collapse_threshold, config().collapse_patience};
  PromptSets prompts_;
  std::unique_ptr<PromptIterator> train_iter_;
  std::unique_ptr<PositiveResampling> positive_;  // positive_pass_rate > 0
  std::unique_ptr<ClusterGenerationClient> gen_client_;
  std::unique_ptr<ClusterRewardClient> reward_client_;
  std::unique_ptr<AsyncRollout> async_;  // asynchronous training, from its first step
  int64_t trained_step_ = 0;             // the last step trained (checkpoints)
};

}  // namespace

ROLL_REGISTER_PIPELINE("rlvr", RlvrPipeline);

// RegisterBuiltinPipelines calls it, so that the linker keeps this file
// (and the registration above) in every program that runs pipelines.
void LinkRlvrPipeline() {}

}  // namespace roll
