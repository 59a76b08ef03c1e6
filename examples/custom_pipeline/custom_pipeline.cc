// A minimal user-written pipeline: a worker type of its own ("keyword_scorer")
// and a controller that fans a batch of texts out to a cluster of them.
//
//   build/bin/custom_pipeline examples/custom_pipeline/config.yaml [key=value ...]
//
// The same executable serves as its workers: the controller starts it again
// as `custom_pipeline worker ...`, so main() hands such invocations to the
// worker runtime before anything else.

#include <ATen/ATen.h>

#include <iostream>

#include "roll/common/logging.h"
#include "roll/controller/controller.h"
#include "roll/worker/worker.h"

// --- the worker API, shared by both sides --------------------------------

struct ScorerApi {
  static constexpr std::string_view kType = "keyword_scorer";
};
// Scores column "text"; the batch is split across ranks and the replies concatenated.
inline constexpr roll::Method<ScorerApi> kScore{"score", roll::Dispatch::kDataParallel};
// Returns how many samples this rank has scored so far (column "scored").
inline constexpr roll::Method<ScorerApi> kStats{"stats", roll::Dispatch::kOneToAll};

// --- the worker ------------------------------------------------------------

class KeywordScorer : public roll::Worker {
 public:
  absl::Status Initialize(const roll::WorkerContext& ctx) override {
    rank_ = ctx.rank;
    return absl::OkStatus();
  }
  void RegisterMethods(roll::MethodTable& table) override {
    table.Bind(kScore, this, &KeywordScorer::Score);
    table.Bind(kStats, this, &KeywordScorer::Stats);
  }

 private:
  // Reward 1 for texts that mention "reward", else 0; scored by rank.
  absl::StatusOr<roll::Batch> Score(const roll::Batch& in) {
    ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* texts, in.Column("text"));
    at::Tensor scores = at::zeros({static_cast<int64_t>(texts->size())}, at::kFloat);
    for (size_t i = 0; i < texts->size(); ++i) {
      if ((*texts)[i].find("reward") != std::string::npos) scores[i] = 1.0f;
    }
    scored_ += static_cast<int64_t>(texts->size());
    roll::Batch out = in;
    out.SetTensor("score", scores);
    out.SetColumn("scored_by", std::vector<std::string>(texts->size(), std::to_string(rank_)));
    return out;
  }

  absl::StatusOr<roll::Batch> Stats(const roll::Batch&) {
    roll::Batch out;
    out.SetColumn("scored", {std::to_string(scored_)});
    return out;
  }

  int rank_ = 0;
  int64_t scored_ = 0;
};
ROLL_REGISTER_WORKER(ScorerApi, KeywordScorer);

// --- the pipeline ----------------------------------------------------------

absl::Status RunPipeline(const std::string& config_path, const std::vector<std::string>& overrides) {
  roll::LoadOptions load;
  load.extra_roles = {"scorer"};
  ROLL_ASSIGN_OR_RETURN(roll::PipelineConfig config, roll::LoadPipelineConfig(config_path, overrides, load));
  roll::ControllerOptions options;
  options.load = load;
  ROLL_ASSIGN_OR_RETURN(auto controller, roll::Controller::Create(config, options));
  ROLL_ASSIGN_OR_RETURN(auto scorers, controller->StartCluster<ScorerApi>("scorer"));

  roll::Batch batch;
  std::vector<std::string> texts;
  for (int i = 0; i < config.rollout_batch_size; ++i) {
    texts.push_back(i % 3 == 0 ? "a reward for sample " + std::to_string(i) : "sample " + std::to_string(i));
  }
  batch.SetColumn("text", texts);
  ROLL_ASSIGN_OR_RETURN(roll::Batch scored, scorers->Call(kScore, batch).Get());
  ROLL_ASSIGN_OR_RETURN(at::Tensor score, scored.Tensor("score"));
  ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* by, scored.Column("scored_by"));
  for (int64_t i = 0; i < scored.size(); ++i) {
    std::cout << "sample " << i << " score " << score[i].item<float>() << " (rank " << (*by)[i] << ")\n";
  }
  ROLL_ASSIGN_OR_RETURN(std::vector<roll::Batch> stats, scorers->Call(kStats, roll::Batch()).Replies());
  for (size_t r = 0; r < stats.size(); ++r) {
    std::cout << "rank " << r << " scored " << stats[r].columns().at("scored")[0] << " samples\n";
  }
  std::cout << "mean score " << score.mean().item<float>() << "\n";
  return scorers->Shutdown();
}

int main(int argc, char** argv) {
  if (roll::IsWorkerInvocation(argc, argv)) return roll::RunWorkerMain(argc, argv);
  if (argc < 2) {
    std::cerr << "usage: custom_pipeline CONFIG [key.path=value ...]\n";
    return 2;
  }
  roll::InitLogging("controller", "info").IgnoreError();
  absl::Status s = RunPipeline(argv[1], std::vector<std::string>(argv + 2, argv + argc));
  if (!s.ok()) {
    std::cerr << "custom_pipeline: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
