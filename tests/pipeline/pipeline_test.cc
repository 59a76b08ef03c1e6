// The pipeline registry and the small rules of the job: restart budget,
// roles, offload plans, stage errors.

#include "roll/pipeline/pipeline.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "roll/pipeline/stage_offloader.h"

namespace roll {
namespace {

using ::testing::HasSubstr;

class CountingPipeline : public Pipeline {
 public:
  CountingPipeline(const PipelineConfig& c, const RunOptions&) : steps_(c.max_steps) {}
  absl::Status Run() override {
    return steps_ == 3 ? absl::OkStatus() : absl::InvalidArgumentError("wrong config");
  }

 private:
  int steps_;
};
ROLL_REGISTER_PIPELINE("counting_test", CountingPipeline);

TEST(PipelineRegistryTest, ConfigNamesItsPipeline) {
  PipelineConfig c;
  c.pipeline = "counting_test";
  c.max_steps = 3;
  EXPECT_TRUE(RunPipeline(c).ok());
  c.max_steps = 4;
  EXPECT_THAT(std::string(RunPipeline(c).message()), HasSubstr("wrong config"));
}

TEST(PipelineRegistryTest, UnknownNameIsRefusedWithTheKnownOnes) {
  RegisterBuiltinPipelines();
  RegisterBuiltinPipelines();  // idempotent
  PipelineConfig c;
  c.pipeline = "rlvrr";
  auto p = CreatePipeline(c);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("unknown pipeline 'rlvrr'"));
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("counting_test, rlvr"));
}

TEST(PipelineRegistryTest, NameIsRegisteredOnce) {
  auto factory = [](const PipelineConfig& c, const RunOptions& o) -> absl::StatusOr<std::unique_ptr<Pipeline>> {
    return std::unique_ptr<Pipeline>(new CountingPipeline(c, o));
  };
  EXPECT_EQ(RegisterPipeline("counting_test", factory).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_FALSE(RegisterPipeline("", factory).ok());
}

TEST(PipelineStateTest, StateAPipelineDoesNotRestoreIsRefusedByName) {
  EXPECT_TRUE(RefuseUnreadState("{}", "keyword").ok());
  absl::Status s = RefuseUnreadState(R"({"data_position": {"epoch": 1}, "seen": 3})", "keyword");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("data_position, seen"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("'keyword' pipeline saved but does not restore"));
  EXPECT_THAT(std::string(RefuseUnreadState("{oops", "keyword").message()), HasSubstr("pipeline_state.json"));
}

TEST(PipelineTest, DefaultPipelineIsRlvr) {
  EXPECT_EQ(PipelineConfig().pipeline, "rlvr");
}

TEST(RestartBudgetTest, ExhaustedBudgetKeepsTheCauseAndSaysSo) {
  RestartBudget budget(2);
  const absl::Status why = absl::UnavailableError("actor_infer rank 1 (pid 42) died");
  EXPECT_TRUE(budget.Take(why).ok());
  EXPECT_TRUE(budget.Take(why).ok());
  absl::Status s = budget.Take(why);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("actor_infer rank 1 (pid 42) died"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("fault_tolerance.max_restarts=2 restarts used"));
  EXPECT_EQ(budget.used(), 2);
}

TEST(JobRolesTest, RolesFollowTheAlgorithm) {
  PipelineConfig c;
  c.adv_estimator = AdvEstimator::kGrpo;
  JobRoles r = RolesFor(c);
  EXPECT_FALSE(r.critic);
  EXPECT_FALSE(r.reference);
  EXPECT_FALSE(r.rewards);
  c.adv_estimator = AdvEstimator::kGae;
  c.reference.present = true;
  c.rewards["math"] = RewardConfig();
  r = RolesFor(c);
  EXPECT_TRUE(r.critic);
  EXPECT_TRUE(r.reference);
  EXPECT_TRUE(r.rewards);
}

TEST(StageOffloaderTest, PlanOffloadsTheOthersAndLoadsTheActiveOnes) {
  const std::vector<std::string> all = {"actor_train", "actor_infer", "reference"};
  // Everything resident: generation offloads the trainer and the reference.
  ActivationPlan p = PlanActivation(all, {}, {"actor_infer"});
  EXPECT_EQ(p.offload, (std::vector<std::string>{"actor_train", "reference"}));
  EXPECT_TRUE(p.load.empty());
  // Then training: the generator goes, the trainer comes back; the
  // reference stays offloaded; absent roles are ignored.
  p = PlanActivation(all, {"actor_train", "reference"}, {"actor_train", "critic"});
  EXPECT_EQ(p.offload, (std::vector<std::string>{"actor_infer"}));
  EXPECT_EQ(p.load, (std::vector<std::string>{"actor_train"}));
}

TEST(AtStageTest, ErrorsNameStepAndStage) {
  EXPECT_TRUE(AtStage(absl::OkStatus(), 3, "rollout").ok());
  absl::Status s = AtStage(absl::DeadlineExceededError("no reply"), 3, "rollout");
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "step 3, rollout: no reply");
}

}  // namespace
}  // namespace roll
