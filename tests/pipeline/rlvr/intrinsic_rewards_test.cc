// ApplyIntrinsicReward against hand-computed values.

#include <gtest/gtest.h>

#include "roll/pipeline/rlvr.h"

namespace roll {
namespace {

SampleResult S(double verifier, std::vector<float> logprobs, std::vector<float> entropies,
               std::vector<float> certainties, std::string answer) {
  SampleResult s;
  s.score = verifier;
  s.response_ids.assign(logprobs.size(), 1);
  s.logprobs = std::move(logprobs);
  s.entropies = std::move(entropies);
  s.self_certainties = std::move(certainties);
  s.extracted_answer = std::move(answer);
  return s;
}

std::vector<RolloutGroup> Groups() {
  RolloutGroup a, b;
  a.samples = {S(1, {-0.5f, -1.5f}, {0.2f, 0.4f}, {2.0f, 1.0f}, "4"),
               S(0, {-2.0f}, {1.0f}, {0.5f}, "5"),
               S(1, {-0.25f, -0.25f}, {0.1f, 0.1f}, {3.0f, 3.0f}, "4"),
               S(0, {-3.0f}, {2.0f}, {0.1f}, "")};
  b.samples = {S(0, {-1.0f}, {0.5f}, {1.0f}, "7"), S(0, {-1.0f}, {0.5f}, {1.0f}, "8")};
  return {a, b};
}

// The generator's values are floats: compare to 1e-6.
void ExpectScores(const std::vector<RolloutGroup>& gs, const std::vector<double>& want) {
  std::vector<double> got;
  for (const RolloutGroup& g : gs)
    for (const SampleResult& s : g.samples) got.push_back(s.score);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << "sample " << i;
}

std::vector<double> Scores(const std::vector<RolloutGroup>& gs) {
  std::vector<double> out;
  for (const RolloutGroup& g : gs)
    for (const SampleResult& s : g.samples) out.push_back(s.score);
  return out;
}

TEST(IntrinsicRewardTest, PerTokenMeansOfWhatTheGeneratorReturned) {
  auto gs = Groups();
  std::map<std::string, double> m;
  ASSERT_TRUE(ApplyIntrinsicReward(IntrinsicReward::kSelfCertainty, &gs, &m).ok());
  ExpectScores(gs, {1.5, 0.5, 3.0, 0.1, 1.0, 1.0});
  EXPECT_DOUBLE_EQ(m["reward/verifier_accuracy"], 2.0 / 6);
  // Group a's mean is 1.275: it favours samples 0 and 2, the correct ones;
  // group b's are equal, it favours none and none is correct: all 6 agree.
  EXPECT_DOUBLE_EQ(m["reward/accuracy"], 1.0);
  EXPECT_NEAR(m["reward/intrinsic_mean"], 7.1 / 6, 1e-6);

  gs = Groups();
  ASSERT_TRUE(ApplyIntrinsicReward(IntrinsicReward::kNegEntropy, &gs, &m).ok());
  auto s = Scores(gs);
  EXPECT_NEAR(s[0], -0.3, 1e-7);
  EXPECT_NEAR(s[3], -2.0, 1e-7);

  gs = Groups();
  ASSERT_TRUE(ApplyIntrinsicReward(IntrinsicReward::kLogLikelihood, &gs, &m).ok());
  ExpectScores(gs, {-1.0, -2.0, -0.25, -3.0, -1.0, -1.0});
}

TEST(IntrinsicRewardTest, MajorityVoteRewardsTheMostFrequentAnswer) {
  auto gs = Groups();
  std::map<std::string, double> m;
  ASSERT_TRUE(ApplyIntrinsicReward(IntrinsicReward::kMajorityVote, &gs, &m).ok());
  // Group a votes 4 (twice); group b ties 7 and 8: the first seen wins.
  EXPECT_EQ(Scores(gs), (std::vector<double>{1, 0, 1, 0, 1, 0}));
  // Favoured: a0 (correct), a2 (correct), b0 (wrong): all but b0 agree.
  EXPECT_DOUBLE_EQ(m["reward/accuracy"], 5.0 / 6);
  EXPECT_FALSE(ApplyIntrinsicReward(IntrinsicReward::kNone, &gs, &m).ok());
}

}  // namespace
}  // namespace roll
