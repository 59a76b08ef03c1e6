#pragma once
// The RLVR pipeline (`pipeline: rlvr`, docs/rlvr.md) and its own pieces,
// for pipelines of prompts and verifiable rewards that reuse them: prompt
// sets and their resumable iterator, the training batch built from rollout
// groups (plain functions of their inputs), and the reward client that
// routes samples by domain tag to the rewards.<domain> clusters.

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "roll/common/batch.h"
#include "roll/common/config.h"
#include "roll/common/status.h"
#include "roll/controller/cluster.h"
#include "roll/pipeline/job_clusters.h"
#include "roll/pipeline/generation_client.h"
#include "roll/pipeline/train_phase.h"
#include "roll/scheduler/rollout_scheduler.h"
#include "roll/worker/rl_workers.h"

namespace roll {

struct PromptSets {
  std::vector<PromptItem> train, val;
};

// data.train_files / val_files, or the generated data.task; prompts go
// through data.prompt_template and data.chat_template.
absl::StatusOr<PromptSets> LoadPromptSets(const PipelineConfig& config);

// Endless seeded shuffled passes over the training prompts, resumable.
class PromptIterator {
 public:
  virtual ~PromptIterator() = default;
  virtual absl::StatusOr<PromptItem> Next() = 0;
  virtual std::string PositionJson() const = 0;
  virtual absl::Status RestorePositionJson(const std::string& json) = 0;
};
absl::StatusOr<std::unique_ptr<PromptIterator>> MakePromptIterator(std::vector<PromptItem> items,
                                                                   int64_t seed);

// Rollout groups -> the training batch (keys: include/roll/worker/batch_keys.h):
// input_ids = prompt + response, right-padded; attention_mask;
// response_mask (0 for overlong responses under overlong_mask); scores [B]
// (reward after the soft overlong penalty and reward_clip); group_index [B];
// sample_weight [B] for prompt-mean aggregation. Metrics: train/reward_mean,
// train/accuracy, train/response_length, train/response_tokens, ...
// Tokens a forced length interruption injected (SampleResult::forced) get
// response_mask 0; train/interrupted_fraction counts the samples it cut.
// With filter_zero_variance_groups, the groups whose final scores are all
// equal get response_mask 0 (and sample_weight 0): no loss, no share of any
// loss denominator; train/zero_variance_filtered is their fraction.
// With downsample_samples_per_group m > 0, each group keeps only the m rows
// of MaxVarianceSubset (by final score); the metrics above still cover every
// sample generated, train/trained_samples counts the rows kept.
absl::StatusOr<TrainingBatch> BuildTrainingBatch(const PipelineConfig& config,
                                                 const std::vector<RolloutGroup>& groups);

// The samples of each prompt that train: downsample_samples_per_group when
// set, else num_return_sequences_in_group.
int64_t TrainedSamplesPerGroup(const PipelineConfig& config);

// PODS's max-variance down-sampling (Xu et al., 2025): the indices of the m
// of `scores` whose variance is largest, ascending. Such a subset is always
// some number k of the highest scores with the m - k lowest; among equal
// scores the low end takes the earlier indices and the high end the later
// ones, and of subsets with equal variance the smaller k wins.
// m >= scores.size() keeps every index.
std::vector<size_t> MaxVarianceSubset(const std::vector<float>& scores, size_t m);

// ScaleRL's No-Positive-Resampling (positive_pass_rate): the pass rate of
// each training prompt over every sample of it generated in the steps
// trained so far (down-sampling's left-out samples count too); a prompt
// whose rate reaches the threshold is retired and skipped when the prompt
// iterator comes back to it in later epochs. Thread-safe (the asynchronous
// producer draws prompts while the trainer records outcomes).
class PositiveResampling {
 public:
  explicit PositiveResampling(double threshold) : threshold_(threshold) {}
  // A trained group: `correct` of `samples` samples of prompt `id` passed.
  void Observe(const std::string& id, int64_t correct, int64_t samples);
  bool Retired(const std::string& id) const;
  int64_t retired() const;
  // The next prompt of `it` that is not retired; an error when `limit`
  // prompts in a row were retired (every prompt is).
  absl::StatusOr<PromptItem> Next(PromptIterator* it, int64_t limit);
  // {"threshold": t, "history": {id: [correct, samples], ...}}; the
  // retired set follows from it.
  std::string StateJson() const;
  absl::Status RestoreJson(const std::string& json);

 private:
  double threshold_;
  mutable std::mutex mu_;
  std::map<std::string, std::pair<int64_t, int64_t>> history_;
  std::set<std::string> retired_;
};

// Rewards that need no ground truth (URLVR; docs/diagnostics.md), `kind` one of
// intrinsic_reward's values, from what the generator returned with each
// sample (no second forward pass):
//   self_certainty  mean over the response's tokens of KL(uniform || p)
//   neg_entropy     minus the mean token entropy of p
//   log_likelihood  the mean log-prob of the sampled tokens
//   majority_vote   1 when the sample's extracted answer is the most
//                   frequent non-empty one of its group (ties: the first
//                   seen), else 0 (TTRL)
// Each sample's score becomes the intrinsic reward; the verifier's score
// it had is compared with it. Metrics: reward/intrinsic_mean,
// reward/verifier_accuracy (share the verifier marks correct), and
// reward/accuracy: of the samples the intrinsic reward favours (reward 1
// for majority_vote; above the mean of their group otherwise) the share
// the verifier marks correct (0 when it favours none).
absl::Status ApplyIntrinsicReward(IntrinsicReward kind, std::vector<RolloutGroup>* groups,
                                  std::map<std::string, double>* metrics);

// The RolloutScheduler's reward client over the rewards.<domain> clusters:
// each sample goes to the domain whose tags hold its tag, and is scored
// asynchronously. Not thread-safe; the clusters must outlive it.
class ClusterRewardClient : public RewardClient {
 public:
  // `restart` replaces a domain's dead workers in place (none: a death
  // fails the step).
  explicit ClusterRewardClient(std::vector<RewardDomain> domains, WorkerRestarter restart = nullptr)
      : domains_(std::move(domains)), restart_(std::move(restart)) {}
  absl::Status Submit(std::vector<SampleResult> samples) override;
  absl::StatusOr<std::vector<SampleResult>> Poll(bool block) override;
  int64_t pending() const override { return static_cast<int64_t>(inflight_.size()); }

 private:
  absl::StatusOr<size_t> Route(const std::string& tag) const;
  struct InFlight {
    size_t domain = 0;
    Batch request;
    CallHandle handle;
    std::vector<SampleResult> samples;
  };
  // A failed call whose cluster lost a worker: restarts its dead workers and
  // sends every request in flight to that cluster again (scores are pure functions
  // of the sample, so a retry neither loses nor double-counts a sample).
  absl::Status Recover(InFlight failed, const absl::Status& why);
  std::vector<RewardDomain> domains_;
  WorkerRestarter restart_;
  std::vector<InFlight> inflight_;
};

}  // namespace roll
