// AsyncRollout (the asynchronous pipeline's producer, docs/async.md) with a
// fake batch source and a simulated trainer: the off-policy bound, the
// trainer waiting for its batch, the checkpoint position, pausing for
// validation, errors; and CheckVersionLag's metrics against hand counts.

#include "roll/pipeline/async_rollout.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

namespace roll {
namespace {

using std::chrono::milliseconds;

// A batch source that records, per step, the generators' version when the
// batch was admitted and how many batches had been taken by the trainer.
struct FakeSource {
  std::mutex mu;
  std::map<int64_t, int64_t> admitted_at_version;
  std::map<int64_t, int64_t> taken_when_started;
  std::atomic<int64_t> version{0};
  std::atomic<int64_t> taken{0};
  std::atomic<int64_t> consumed{0};  // "prompts" drawn
  milliseconds gen_time{5};
  int64_t fail_at = -1;

  AsyncRollout::Produce Produce() {
    return [this](int64_t step) -> absl::StatusOr<RolloutBatch> {
      {
        std::lock_guard<std::mutex> lock(mu);
        admitted_at_version[step] = version.load();
        taken_when_started[step] = taken.load();
      }
      if (step == fail_at) return absl::UnavailableError("generator died");
      consumed += 4;
      std::this_thread::sleep_for(gen_time);
      RolloutBatch b;
      b.metrics["rollout/step"] = static_cast<double>(step);
      return b;
    };
  }
  AsyncRollout::Snapshot Snapshot() {
    return [this] { return std::to_string(consumed.load()); };
  }
};

// The trainer: takes each batch, "trains" for train_time, then updates.
void Train(AsyncRollout* a, FakeSource* src, int64_t steps, milliseconds train_time) {
  for (int64_t s = 1; s <= steps; ++s) {
    auto b = a->Take(s);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(b->metrics["rollout/step"], static_cast<double>(s));
    EXPECT_TRUE(b->metrics.count("async/wait_s"));
    EXPECT_TRUE(b->metrics.count("time/generation_s"));
    ++src->taken;
    std::this_thread::sleep_for(train_time);
    src->version = s;
    a->SetVersion(s);
  }
}

TEST(AsyncRolloutTest, AdmissionRule) {
  // Step s trains from version s - 1; its batch may start at version s-1-k.
  EXPECT_TRUE(AsyncRollout::Admits(1, 0, 0));
  EXPECT_FALSE(AsyncRollout::Admits(2, 0, 0));
  EXPECT_TRUE(AsyncRollout::Admits(2, 0, 1));
  EXPECT_FALSE(AsyncRollout::Admits(3, 0, 1));
  EXPECT_TRUE(AsyncRollout::Admits(9, 0, 8));
  EXPECT_FALSE(AsyncRollout::Admits(10, 0, 8));
}

TEST(AsyncRolloutTest, NoBatchStartsMoreThanKVersionsBehindItsStep) {
  for (int64_t k : {1, 2, 3}) {
    FakeSource src;  // generation fast, training slow: the producer runs ahead
    AsyncRollout a(k, src.Produce(), src.Snapshot());
    a.Start(1, 8, 0);
    Train(&a, &src, 8, milliseconds(20));
    a.Stop();
    for (const auto& [step, v] : src.admitted_at_version) {
      EXPECT_GE(v, step - 1 - k) << "k=" << k << " step " << step;
    }
    // The producer ran ahead as far as the bound lets it, and no further:
    // batch k + 1 started before the trainer took batch 1, batch k + 2 only
    // after the first update.
    EXPECT_EQ(src.admitted_at_version[k + 1], 0) << "k=" << k;
    EXPECT_EQ(src.admitted_at_version[k + 2], 1) << "k=" << k;
    for (const auto& [step, taken] : src.taken_when_started) {
      EXPECT_GE(taken, step - 1 - k) << "k=" << k << " step " << step;
    }
  }
}

TEST(AsyncRolloutTest, TheTrainerWaitsForABatchStillBeingGenerated) {
  FakeSource src;
  src.gen_time = milliseconds(60);  // generation slow: the trainer waits
  AsyncRollout a(2, src.Produce(), src.Snapshot());
  a.Start(1, 2, 0);
  auto b = a.Take(1);
  ASSERT_TRUE(b.ok());
  EXPECT_GE(b->metrics["async/wait_s"], 0.04);
  EXPECT_GE(b->metrics["time/generation_s"], 0.05);
  a.SetVersion(1);
  ASSERT_TRUE(a.Take(2).ok());
}

TEST(AsyncRolloutTest, CheckpointPositionCountsOnlyTrainedBatches) {
  FakeSource src;
  AsyncRollout a(3, src.Produce(), src.Snapshot());
  a.Start(1, 10, 0);
  ASSERT_TRUE(a.Take(1).ok());
  // Let the producer run ahead to the bound (batches 2 .. 4).
  for (int i = 0; i < 200 && src.consumed.load() < 16; ++i) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(src.consumed.load(), 16) << "batches 1..4 drawn";
  // A checkpoint after step 1 saves the position after batch 1 alone.
  EXPECT_EQ(a.StateAfter(1), "4");
  a.SetVersion(1);
  ASSERT_TRUE(a.Take(2).ok());
  EXPECT_EQ(a.StateAfter(2), "8");
  a.Stop();
}

TEST(AsyncRolloutTest, StateAfterABatchNotYetStartedIsTheCurrentPosition) {
  FakeSource src;
  AsyncRollout a(1, src.Produce(), src.Snapshot());
  a.Start(1, 3, 0);
  ASSERT_TRUE(a.Take(1).ok());
  ASSERT_TRUE(a.Take(2).ok());  // batch 2 was admitted at version 0 (k = 1)
  // Batch 3 needs version 1: not started, so the position is the current one.
  EXPECT_EQ(a.StateAfter(2), "8");
  a.Stop();
}

TEST(AsyncRolloutTest, PausedRunsBetweenBatches) {
  FakeSource src;
  src.gen_time = milliseconds(30);
  AsyncRollout a(4, src.Produce(), src.Snapshot());
  a.Start(1, 5, 0);
  std::this_thread::sleep_for(milliseconds(10));  // batch 1 in progress
  int64_t during = -1, after = -1;
  ASSERT_TRUE(a.Paused([&] {
                 during = src.consumed.load();
                 std::this_thread::sleep_for(milliseconds(80));  // no batch starts meanwhile
                 after = src.consumed.load();
                 return absl::OkStatus();
               }).ok());
  EXPECT_GE(during, 4) << "the batch in progress finished first";
  EXPECT_EQ(during, after);
  for (int64_t s = 1; s <= 5; ++s) {
    ASSERT_TRUE(a.Take(s).ok()) << s;
    a.SetVersion(s);
  }
}

TEST(AsyncRolloutTest, ProducerErrorReachesTheTrainer) {
  FakeSource src;
  src.fail_at = 2;
  AsyncRollout a(1, src.Produce(), src.Snapshot());
  a.Start(1, 4, 0);
  ASSERT_TRUE(a.Take(1).ok());
  auto b = a.Take(2);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(a.Take(3).status().code(), absl::StatusCode::kUnavailable) << "later batches fail with it";
}

TEST(AsyncRolloutTest, StopEndsAProducerWaitingForAdmission) {
  FakeSource src;
  AsyncRollout a(1, src.Produce(), src.Snapshot());
  a.Start(1, 100, 0);
  std::this_thread::sleep_for(milliseconds(30));  // batches 1, 2 done; 3 waits for version 1
  a.Stop();
  EXPECT_EQ(src.admitted_at_version.size(), 2u);
  EXPECT_FALSE(a.Take(3).ok());
}

SampleResult Sample(std::vector<int64_t> versions) {
  SampleResult s;
  s.request_key = "r";
  s.token_versions = std::move(versions);
  s.response_ids.assign(s.token_versions.size(), 5);
  return s;
}

TEST(CheckVersionLagTest, MetricsAgainstHandCounts) {
  // Step 5 trains from version 4. Lags by first token: 0, 1, 2, 2.
  RolloutGroup g1, g2;
  g1.samples = {Sample({4, 4}), Sample({3, 4, 4})};
  g2.samples = {Sample({2, 2}), Sample({2, 3, 4, 4})};
  Metrics m;
  ASSERT_TRUE(CheckVersionLag({g1, g2}, 5, 2, &m).ok());
  EXPECT_DOUBLE_EQ(m["rollout/version_lag_mean"], (0 + 1 + 2 + 2) / 4.0);
  EXPECT_DOUBLE_EQ(m["rollout/version_lag_max"], 2);
  EXPECT_DOUBLE_EQ(m["rollout/version_lag_0_fraction"], 0.25);
  EXPECT_DOUBLE_EQ(m["rollout/version_lag_1_fraction"], 0.25);
  EXPECT_DOUBLE_EQ(m["rollout/version_lag_2_fraction"], 0.5);
  // Token lags: 0,0 | 1,0,0 | 2,2 | 2,1,0,0 -> 8 / 11.
  EXPECT_DOUBLE_EQ(m["rollout/token_version_lag_mean"], 8.0 / 11.0);
  EXPECT_DOUBLE_EQ(m["rollout/mixed_version_fraction"], 0.5);
}

TEST(CheckVersionLagTest, ASampleOlderThanKIsRefusedByName) {
  RolloutGroup g;
  g.samples = {Sample({4}), Sample({1, 2})};
  g.samples[1].request_key = "s7-p3";
  Metrics m;
  absl::Status s = CheckVersionLag({g}, 5, 2, &m);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("s7-p3"), std::string::npos) << s;
  EXPECT_NE(s.message().find("3 versions behind"), std::string::npos) << s;
  EXPECT_NE(s.message().find("async_generation_ratio=2"), std::string::npos) << s;
}

TEST(CheckAsyncPlacementTest, GeneratorsNeedDevicesOfTheirOwn) {
  PipelineConfig cfg;
  cfg.async_generation_ratio = 1;
  cfg.actor_train.present = cfg.actor_infer.present = true;
  cfg.actor_train.name = "actor_train";
  cfg.actor_train.device_mapping = {0, 1};
  cfg.actor_infer.device_mapping = {1};
  absl::Status s = CheckAsyncPlacement(cfg);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("device 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("actor_train.device_mapping"), std::string::npos) << s;
  cfg.actor_train.device_mapping = {0};
  EXPECT_TRUE(CheckAsyncPlacement(cfg).ok());
  cfg.actor_train.device_mapping = {0, 1};
  cfg.async_generation_ratio = 0;
  EXPECT_TRUE(CheckAsyncPlacement(cfg).ok()) << "synchronous: colocated is fine";
}

}  // namespace
}  // namespace roll
