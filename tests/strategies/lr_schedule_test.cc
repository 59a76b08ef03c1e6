#include "roll/strategies/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

#include "roll/common/config.h"
#include "roll/strategies/train_strategy.h"

namespace roll {
namespace {

LrSchedule Make(LrSchedulerType type, double lr, int64_t warmup, int64_t total) {
  auto s = LrSchedule::Create({type, lr, warmup, total});
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

TEST(LrScheduleTest, ConstantWithWarmup) {
  const LrSchedule s = Make(LrSchedulerType::kConstant, 0.4, 4, 0);
  EXPECT_DOUBLE_EQ(s.LrAt(0), 0.0);
  EXPECT_DOUBLE_EQ(s.LrAt(1), 0.1);
  EXPECT_DOUBLE_EQ(s.LrAt(3), 0.3);
  EXPECT_DOUBLE_EQ(s.LrAt(4), 0.4);
  EXPECT_DOUBLE_EQ(s.LrAt(1000), 0.4);
  const LrSchedule plain = Make(LrSchedulerType::kConstant, 0.4, 0, 0);
  EXPECT_DOUBLE_EQ(plain.LrAt(0), 0.4);
}

TEST(LrScheduleTest, CosineAfterWarmup) {
  // warmup 2, total 10: the cosine phase spans updates 2..10.
  const LrSchedule s = Make(LrSchedulerType::kCosine, 1.0, 2, 10);
  EXPECT_DOUBLE_EQ(s.LrAt(0), 0.0);
  EXPECT_DOUBLE_EQ(s.LrAt(1), 0.5);
  EXPECT_DOUBLE_EQ(s.LrAt(2), 1.0);
  EXPECT_NEAR(s.LrAt(4), 0.5 * (1 + std::cos(M_PI * 2 / 8)), 1e-15);  // 0.853553...
  EXPECT_NEAR(s.LrAt(4), 0.8535533905932737, 1e-15);
  EXPECT_NEAR(s.LrAt(6), 0.5, 1e-15);
  EXPECT_NEAR(s.LrAt(8), 0.14644660940672624, 1e-15);
  EXPECT_NEAR(s.LrAt(10), 0.0, 1e-15);
  EXPECT_NEAR(s.LrAt(15), 0.0, 1e-15);  // stays at the end value
}

TEST(LrScheduleTest, LinearDecayAfterWarmup) {
  const LrSchedule s = Make(LrSchedulerType::kLinear, 2.0, 1, 5);
  EXPECT_DOUBLE_EQ(s.LrAt(0), 0.0);
  EXPECT_DOUBLE_EQ(s.LrAt(1), 2.0);
  EXPECT_DOUBLE_EQ(s.LrAt(2), 1.5);
  EXPECT_DOUBLE_EQ(s.LrAt(3), 1.0);
  EXPECT_DOUBLE_EQ(s.LrAt(4), 0.5);
  EXPECT_DOUBLE_EQ(s.LrAt(5), 0.0);
  EXPECT_DOUBLE_EQ(s.LrAt(9), 0.0);
}

TEST(LrScheduleTest, RejectsBadOptions) {
  auto no_total = LrSchedule::Create({LrSchedulerType::kCosine, 1.0, 5, 5});
  ASSERT_FALSE(no_total.ok());
  EXPECT_NE(no_total.status().message().find("total_steps"), std::string::npos);
  EXPECT_FALSE(LrSchedule::Create({LrSchedulerType::kConstant, -1.0, 0, 0}).ok());
  EXPECT_FALSE(LrSchedule::Create({LrSchedulerType::kLinear, 1.0, -1, 10}).ok());
}

}  // namespace
}  // namespace roll

namespace roll {
namespace {

// The trainer's schedule from its training_args: a run with no more updates
// than warmup_steps stays in the warm-up (a short run of a config made for
// a long one), a longer one warms up and then decays to 0 at its end.
TEST(LrScheduleTest, ARunShorterThanItsWarmupStaysInTheWarmup) {
  TrainingArgs args;
  args.learning_rate = 1.0;
  args.warmup_steps = 80;
  args.lr_scheduler_type = LrSchedulerType::kCosine;
  auto short_run = LrSchedule::Create(TrainStrategyOptions::FromTrainingArgs(args, 8).lr);
  ASSERT_TRUE(short_run.ok()) << short_run.status();
  for (int64_t k : {0, 4, 7}) EXPECT_DOUBLE_EQ(short_run->LrAt(k), k / 80.0) << k;
  // max_steps 0 (validation only): no update at all, still a valid schedule.
  EXPECT_TRUE(LrSchedule::Create(TrainStrategyOptions::FromTrainingArgs(args, 0).lr).ok());
  auto long_run = LrSchedule::Create(TrainStrategyOptions::FromTrainingArgs(args, 800).lr);
  ASSERT_TRUE(long_run.ok()) << long_run.status();
  EXPECT_DOUBLE_EQ(long_run->LrAt(40), 0.5);
  EXPECT_DOUBLE_EQ(long_run->LrAt(80), 1.0);
  EXPECT_NEAR(long_run->LrAt(440), 0.5, 1e-12);
  EXPECT_NEAR(long_run->LrAt(800), 0.0, 1e-12);
}

}  // namespace
}  // namespace roll
