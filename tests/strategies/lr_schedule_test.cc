#include "roll/strategies/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

#include "roll/common/config.h"

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
