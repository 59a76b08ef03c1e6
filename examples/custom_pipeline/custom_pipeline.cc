// A user-written pipeline on the pipeline pieces: RL on prompts with a
// reward of the user's own, computed by a worker type of the user's own.
//
//   build/bin/custom_pipeline examples/custom_pipeline/config.yaml model=DIR [key=value ...]
//
// What it brings:      the `keyword_scorer` worker type (its method
//                      constants, the worker, the registration), a reward
//                      client over its cluster, and the step.
// What it reuses:      BasePipeline (the loop, the step skeleton, restarts,
//                      offload, tracking, checkpoints and resume), the
//                      generation client, the sampling parameters, the train
//                      phase, the model update, and the RLVR pipeline's prompt
//                      sets and training batch.
//
// The same executable serves as its workers: the controller starts it again
// as `custom_pipeline worker ...`, so main() hands such invocations to the
// worker runtime before anything else.

#include <ATen/ATen.h>

#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "roll/common/logging.h"
#include "roll/pipeline/generation_client.h"
#include "roll/pipeline/pipeline.h"
#include "roll/pipeline/rlvr.h"
#include "roll/pipeline/validation.h"
#include "roll/worker/rl_workers.h"
#include "roll/worker/worker.h"

// --- the worker API, shared by both sides --------------------------------

struct ScorerApi {
  static constexpr std::string_view kType = "keyword_scorer";
};
// Scores columns "response" and "ground_truth" into tensor "scores"; the
// batch is split across ranks and the replies concatenated.
inline constexpr roll::Method<ScorerApi> kScore{"score", roll::Dispatch::kDataParallel};
// How many samples this rank has scored so far (meta "scored").
inline constexpr roll::Method<ScorerApi> kStats{"stats", roll::Dispatch::kOneToAll};

// --- the worker ------------------------------------------------------------

// Reward 1 for a response that holds the answer in few words: the ground
// truth appears and the response is at most `max_chars` characters long
// (the scorer section's `max_chars` option... here a constant, to keep the
// example short).
class KeywordScorer : public roll::Worker {
 public:
  absl::Status Initialize(const roll::WorkerContext& ctx) override { return absl::OkStatus(); }
  void RegisterMethods(roll::MethodTable& table) override {
    table.Bind(kScore, this, &KeywordScorer::Score);
    table.Bind(kStats, this, &KeywordScorer::Stats);
  }

 private:
  static constexpr size_t kMaxChars = 16;

  absl::StatusOr<roll::Batch> Score(const roll::Batch& in) {
    ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* responses, in.Column("response"));
    ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* truths, in.Column("ground_truth"));
    at::Tensor scores = at::zeros({static_cast<int64_t>(responses->size())}, at::kFloat);
    for (size_t i = 0; i < responses->size(); ++i) {
      const std::string& r = (*responses)[i];
      if (absl::StrContains(r, (*truths)[i]) && r.size() <= kMaxChars) scores[i] = 1.0f;
    }
    scored_ += static_cast<int64_t>(responses->size());
    roll::Batch out;
    out.SetTensor("scores", scores);
    return out;
  }

  absl::StatusOr<roll::Batch> Stats(const roll::Batch&) {
    roll::Batch out;
    out.SetMeta("scored", std::to_string(scored_));
    return out;
  }

  int64_t scored_ = 0;
};
ROLL_REGISTER_WORKER(ScorerApi, KeywordScorer);

// --- the reward client: samples -> the scorer cluster ------------------------

// Scores each submitted set of samples with one call; Poll hands them back.
class ScorerRewardClient : public roll::RewardClient {
 public:
  explicit ScorerRewardClient(roll::Cluster<ScorerApi>* scorers) : scorers_(scorers) {}

  absl::Status Submit(std::vector<roll::SampleResult> samples) override {
    std::vector<std::string> responses, truths;
    for (const roll::SampleResult& s : samples) {
      responses.push_back(s.response_text);
      truths.push_back(s.ground_truth);
    }
    roll::Batch b;
    b.SetColumn("response", responses);
    b.SetColumn("ground_truth", truths);
    ROLL_ASSIGN_OR_RETURN(roll::Batch reply, scorers_->Call(kScore, b).Get());
    ROLL_ASSIGN_OR_RETURN(at::Tensor scores, reply.Tensor("scores"));
    for (size_t i = 0; i < samples.size(); ++i) samples[i].score = scores[i].item<double>();
    for (auto& s : samples) done_.push_back(std::move(s));
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<roll::SampleResult>> Poll(bool) override { return std::move(done_); }
  int64_t pending() const override { return static_cast<int64_t>(done_.size()); }

 private:
  roll::Cluster<ScorerApi>* scorers_;  // not owned
  std::vector<roll::SampleResult> done_;
};

// --- the pipeline ------------------------------------------------------------

class KeywordPipeline : public roll::BasePipeline {
 public:
  using BasePipeline::BasePipeline;

 protected:
  absl::Status CheckConfig() override {
    if (!config().extra_roles.count("scorer")) {
      return absl::InvalidArgumentError("the keyword pipeline needs a `scorer` section");
    }
    return absl::OkStatus();
  }
  // No rule-reward clusters: the scorer is this pipeline's reward.
  roll::JobRoles Roles() const override { return {}; }
  int64_t SamplesPerStep() const override {
    return int64_t{config().rollout_batch_size} * config().num_return_sequences_in_group;
  }
  std::string SamplesPerStepWhat() const override {
    return absl::StrCat("rollout_batch_size x num_return_sequences_in_group = ", SamplesPerStep());
  }

  absl::Status Prepare() override {
    ROLL_ASSIGN_OR_RETURN(prompts_, roll::LoadPromptSets(config()));
    ROLL_ASSIGN_OR_RETURN(train_iter_, roll::MakePromptIterator(prompts_.train, config().seed));
    return absl::OkStatus();
  }

  absl::Status OnClustersStarted() override {
    ROLL_ASSIGN_OR_RETURN(scorers_, clusters().controller().StartCluster<ScorerApi>("scorer"));
    gen_ = std::make_unique<roll::ClusterGenerationClient>(&clusters().actor_infer(), Restarter());
    rewards_ = std::make_unique<ScorerRewardClient>(scorers_.get());
    return absl::OkStatus();
  }
  void OnClustersStopping() override {
    gen_.reset();
    rewards_.reset();
    scorers_.reset();
  }

  // The step's prompts, generated and scored, as the training batch; the
  // base runs the train phase and the model update on it.
  absl::StatusOr<roll::TrainingBatch> Rollout(int64_t step, roll::Metrics* m) override {
    roll::RolloutOptions ro;
    ro.groups = config().rollout_batch_size;
    ro.params = roll::RolloutGenParams(config());
    ro.seed = static_cast<uint64_t>(config().seed);
    roll::RolloutScheduler sched(gen_.get(), rewards_.get());
    ROLL_ASSIGN_OR_RETURN(roll::RolloutBatch rollout, sched.Collect(ro, [this] { return train_iter_->Next(); }, step));
    return roll::BuildTrainingBatch(config(), rollout.groups);
  }

  // Greedy answers to the first val_batch_size held-out prompts.
  absl::Status Validate(int64_t step, roll::Metrics* m) override {
    roll::RolloutOptions ro;
    ro.groups = std::min<int64_t>(config().val_batch_size, static_cast<int64_t>(prompts_.val.size()));
    ro.params = roll::RolloutGenParams(config());
    ro.params.n = 1;
    ro.params.temperature = 0;
    roll::RolloutScheduler sched(gen_.get(), rewards_.get());
    size_t next = 0;
    auto batch = sched.Collect(ro, [&]() -> absl::StatusOr<roll::PromptItem> { return prompts_.val[next++]; }, -1);
    ROLL_RETURN_IF_ERROR(batch.status());
    roll::ValidationStats stats;
    for (const roll::RolloutGroup& g : batch->groups) {
      stats.AddGroup({g.samples[0].score}, {static_cast<int64_t>(g.samples[0].response_ids.size())});
    }
    stats.WriteTo({}, m);
    ROLL_ASSIGN_OR_RETURN(std::vector<roll::Batch> per_rank, scorers_->Call(kStats, roll::Batch()).Replies());
    for (size_t r = 0; r < per_rank.size(); ++r) {
      (*m)[absl::StrCat("scorer/rank", r, "_scored")] = std::stod(per_rank[r].MetaOr("scored", "0"));
    }
    return absl::OkStatus();
  }

  // The training prompts' position, so that a resumed run goes on with the
  // prompts an uninterrupted one would have trained.
  std::string SaveState() override {
    nlohmann::json state;
    state["data_position"] = nlohmann::json::parse(train_iter_->PositionJson());
    return state.dump();
  }
  absl::Status RestoreState(const std::string& state_json) override {
    const nlohmann::json state = nlohmann::json::parse(state_json);  // what SaveState wrote
    if (!state.contains("data_position")) {
      return absl::InvalidArgumentError("pipeline_state.json: missing 'data_position'");
    }
    return train_iter_->RestorePositionJson(state["data_position"].dump());
  }

 private:

  roll::PromptSets prompts_;
  std::unique_ptr<roll::PromptIterator> train_iter_;
  std::unique_ptr<roll::Cluster<ScorerApi>> scorers_;
  std::unique_ptr<roll::ClusterGenerationClient> gen_;
  std::unique_ptr<ScorerRewardClient> rewards_;
};
ROLL_REGISTER_PIPELINE("keyword", KeywordPipeline);

int main(int argc, char** argv) {
  if (roll::IsWorkerInvocation(argc, argv)) {
    roll::RegisterRlWorkers();  // actor_train and actor_infer run here too
    return roll::RunWorkerMain(argc, argv);
  }
  if (argc < 2) {
    std::cerr << "usage: custom_pipeline CONFIG [key.path=value ...]\n";
    return 2;
  }
  roll::InitLogging("controller", "info").IgnoreError();
  roll::RunOptions options;
  options.controller.load.extra_roles = {"scorer"};
  auto config = roll::LoadPipelineConfig(argv[1], std::vector<std::string>(argv + 2, argv + argc),
                                         options.controller.load);
  absl::Status s = config.ok() ? roll::RunPipeline(*config, options) : config.status();
  if (!s.ok()) {
    std::cerr << "custom_pipeline: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
