#include "roll/common/algorithm_options.h"

#include "common/config_schemas.h"

namespace roll {

using config_internal::NameOf;  // the config schema's own


const EnumNames<AdvEstimator>& AdvEstimatorNames() {
  static const auto* n = new EnumNames<AdvEstimator>{{"gae", AdvEstimator::kGae},
                                                     {"grpo", AdvEstimator::kGrpo},
                                                     {"dr_grpo", AdvEstimator::kDrGrpo},
                                                     {"rloo", AdvEstimator::kRloo},
                                                     {"reinforce_plus_plus", AdvEstimator::kReinforcePlusPlus},
                                                     {"reinforce_pp", AdvEstimator::kReinforcePlusPlus}};
  return *n;
}
const EnumNames<NormType>& NormTypeNames() {
  static const auto* n =
      new EnumNames<NormType>{{"group", NormType::kGroup}, {"batch", NormType::kBatch}, {"none", NormType::kNone}};
  return *n;
}
const EnumNames<PgVariant>& PgVariantNames() {
  static const auto* n = new EnumNames<PgVariant>{{"ppo", PgVariant::kPpo},
                                                  {"gspo", PgVariant::kGspo},
                                                  {"cispo", PgVariant::kCispo},
                                                  {"up", PgVariant::kUp},
                                                  {"up_seq", PgVariant::kUpSeq}};
  return *n;
}
const EnumNames<RolloutIs>& RolloutIsNames() {
  static const auto* n = new EnumNames<RolloutIs>{
      {"none", RolloutIs::kNone}, {"token", RolloutIs::kToken}, {"sequence", RolloutIs::kSequence}};
  return *n;
}
const EnumNames<KlPenalty>& KlPenaltyNames() {
  static const auto* n = new EnumNames<KlPenalty>{{"k1", KlPenalty::kK1}, {"kl", KlPenalty::kK1},
                                                  {"k2", KlPenalty::kK2}, {"mse", KlPenalty::kK2},
                                                  {"k3", KlPenalty::kK3}, {"low_var_kl", KlPenalty::kK3},
                                                  {"abs", KlPenalty::kAbs}};
  return *n;
}
const EnumNames<LossAggMode>& LossAggModeNames() {
  static const auto* n = new EnumNames<LossAggMode>{{"token-mean", LossAggMode::kTokenMean},
                                                    {"seq-mean-token-mean", LossAggMode::kSeqMeanTokenMean},
                                                    {"seq-mean-token-sum", LossAggMode::kSeqMeanTokenSum},
                                                    {"seq-mean-token-sum-norm", LossAggMode::kSeqMeanTokenSumNorm},
                                                    {"prompt-mean", LossAggMode::kPromptMean}};
  return *n;
}
const EnumNames<RewardLevel>& RewardLevelNames() {
  static const auto* n =
      new EnumNames<RewardLevel>{{"trajectory", RewardLevel::kTrajectory}, {"step", RewardLevel::kStep}};
  return *n;
}
const EnumNames<IntrinsicReward>& IntrinsicRewardNames() {
  static const auto* n = new EnumNames<IntrinsicReward>{{"none", IntrinsicReward::kNone},
                                                        {"self_certainty", IntrinsicReward::kSelfCertainty},
                                                        {"neg_entropy", IntrinsicReward::kNegEntropy},
                                                        {"log_likelihood", IntrinsicReward::kLogLikelihood},
                                                        {"majority_vote", IntrinsicReward::kMajorityVote}};
  return *n;
}
const EnumNames<OffloadStates>& OffloadStatesNames() {
  static const auto* n = new EnumNames<OffloadStates>{
      {"auto", OffloadStates::kAuto}, {"always", OffloadStates::kAlways}, {"never", OffloadStates::kNever}};
  return *n;
}

std::string_view ToString(AdvEstimator v) { return NameOf(AdvEstimatorNames(), v); }
std::string_view ToString(NormType v) { return NameOf(NormTypeNames(), v); }
std::string_view ToString(PgVariant v) { return NameOf(PgVariantNames(), v); }
std::string_view ToString(RolloutIs v) { return NameOf(RolloutIsNames(), v); }
std::string_view ToString(KlPenalty v) { return NameOf(KlPenaltyNames(), v); }
std::string_view ToString(LossAggMode v) { return NameOf(LossAggModeNames(), v); }
std::string_view ToString(RewardLevel v) { return NameOf(RewardLevelNames(), v); }
std::string_view ToString(IntrinsicReward v) { return NameOf(IntrinsicRewardNames(), v); }
std::string_view ToString(OffloadStates v) { return NameOf(OffloadStatesNames(), v); }

}  // namespace roll
