#pragma once
// The choices a config names by word (adv_estimator: grpo, pg_variant:
// cispo, ...), as C++ enums: the config parses each word once (the schema's
// name tables below, aliases included), and the pipeline, the workers and
// the algorithms compare enums, so a misspelt choice does not compile.
// ToString gives the YAML spelling back (messages, docs).

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace roll {

// adv_estimator: gae, grpo, dr_grpo, rloo, reinforce_plus_plus (alias reinforce_pp).
enum class AdvEstimator { kGae, kGrpo, kDrGrpo, kRloo, kReinforcePlusPlus };
// norm_mean_type, norm_std_type: group, batch, none.
enum class NormType { kGroup, kBatch, kNone };
// pg_variant: ppo, gspo, cispo, up, up_seq.
enum class PgVariant { kPpo, kGspo, kCispo, kUp, kUpSeq };
// rollout_is: none, token, sequence.
enum class RolloutIs { kNone, kToken, kSequence };
// kl_penalty: k1 (alias kl), k2 (mse), k3 (low_var_kl), abs.
enum class KlPenalty { kK1, kK2, kK3, kAbs };
// loss_agg_mode: token-mean, seq-mean-token-mean, seq-mean-token-sum,
// seq-mean-token-sum-norm, prompt-mean.
enum class LossAggMode { kTokenMean, kSeqMeanTokenMean, kSeqMeanTokenSum, kSeqMeanTokenSumNorm, kPromptMean };
// reward_level: trajectory, step.
enum class RewardLevel { kTrajectory, kStep };
// intrinsic_reward: none, self_certainty, neg_entropy, log_likelihood, majority_vote.
enum class IntrinsicReward { kNone, kSelfCertainty, kNegEntropy, kLogLikelihood, kMajorityVote };
// offload_states: auto, always, never.
enum class OffloadStates { kAuto, kAlways, kNever };

std::string_view ToString(AdvEstimator v);
std::string_view ToString(NormType v);
std::string_view ToString(PgVariant v);
std::string_view ToString(RolloutIs v);
std::string_view ToString(KlPenalty v);
std::string_view ToString(LossAggMode v);
std::string_view ToString(RewardLevel v);
std::string_view ToString(IntrinsicReward v);
std::string_view ToString(OffloadStates v);

// The YAML words of each, the canonical spelling first, then aliases.
template <class E>
using EnumNames = std::vector<std::pair<std::string, E>>;
const EnumNames<AdvEstimator>& AdvEstimatorNames();
const EnumNames<NormType>& NormTypeNames();
const EnumNames<PgVariant>& PgVariantNames();
const EnumNames<RolloutIs>& RolloutIsNames();
const EnumNames<KlPenalty>& KlPenaltyNames();
const EnumNames<LossAggMode>& LossAggModeNames();
const EnumNames<RewardLevel>& RewardLevelNames();
const EnumNames<IntrinsicReward>& IntrinsicRewardNames();
const EnumNames<OffloadStates>& OffloadStatesNames();

}  // namespace roll
