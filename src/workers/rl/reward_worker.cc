// The "reward" worker type: scores responses with the rule-based reward of
// its section's reward_type (math_rule, code_sandbox, format, countdown).

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"
#include "roll/rewards/reward_function.h"
#include "roll/worker/batch_keys.h"
#include "roll/worker/rl_workers.h"

namespace roll {
namespace {

class RewardWorker : public Worker {
 public:
  absl::Status Initialize(const WorkerContext& ctx) override {
    const auto* rc = static_cast<const RewardConfig*>(ctx.role);
    std::string type = "math_rule";
    // Reward sections are RewardConfigs; other roles never run this type.
    if (ctx.cluster.rfind("rewards.", 0) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker type 'reward' serves rewards.<domain> sections, not '", ctx.cluster, "'"));
    }
    if (!rc->reward_type.empty()) type = rc->reward_type;
    auto options = RewardOptionsJson(rc->reward_options);
    if (!options.ok()) return Annotate(options.status(), ctx.cluster);
    auto fn = MakeRewardFunction(type, *options);
    if (!fn.ok()) {
      return absl::Status(fn.status().code(),
                          absl::StrCat(ctx.cluster, rc->reward_options.empty() ? ".reward_type: " : ": ",
                                       fn.status().message()));
    }
    fn_ = std::move(*fn);
    return absl::OkStatus();
  }

  void RegisterMethods(MethodTable& t) override {
    t.Bind(reward::kComputeRewards, this, &RewardWorker::Compute);
  }

 private:
  absl::StatusOr<Batch> Compute(const Batch& in) {
    Batch out;
    if (in.empty()) {
      out.SetTensor(keys::kScores, at::zeros({0}, at::kFloat));
      out.SetColumn(keys::kRewardReason, {});
      out.SetColumn(keys::kExtractedAnswer, {});
      return out;
    }
    ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* text, in.Column(keys::kResponseText));
    ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* truth, in.Column(keys::kGroundTruth));
    const std::vector<std::string>* tags = nullptr;
    if (auto c = in.Column(keys::kTag); c.ok()) tags = *c;
    const int64_t n = static_cast<int64_t>(text->size());
    at::Tensor scores = at::zeros({n}, at::kFloat);
    std::vector<std::string> reasons, extracted(n);
    for (int64_t i = 0; i < n; ++i) {
      RewardInput ri;
      ri.response = (*text)[i];
      ri.ground_truth = (*truth)[i];
      if (tags) ri.tag = (*tags)[i];
      auto r = fn_->Score(ri);
      if (!r.ok()) {
        // A sample the reward cannot judge scores 0 with the reason; the
        // rest of the batch still counts.
        reasons.push_back(absl::StrCat("error: ", r.status().message()));
        continue;
      }
      scores[i] = static_cast<float>(r->score);
      reasons.push_back(r->reason);
      extracted[i] = r->extracted;
    }
    out.SetTensor(keys::kScores, scores);
    out.SetColumn(keys::kRewardReason, std::move(reasons));
    out.SetColumn(keys::kExtractedAnswer, std::move(extracted));
    return out;
  }

  std::unique_ptr<RewardFunction> fn_;
};

}  // namespace

void RegisterRewardWorker() { RegisterWorkerType<RewardApi, RewardWorker>(); }

}  // namespace roll
