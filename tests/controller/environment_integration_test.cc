// Environment workers end to end: episodes of FrozenLake hosted by real
// `roll worker` processes of a train_env_manager section, driven through
// the EnvironmentClient; workers are killed with SIGKILL between steps and
// while a failed call is recovered.

#include <signal.h>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "testing/processes.h"
#include "roll/controller/controller.h"
#include "roll/controller/environment_client.h"
#include "roll/envs/environment.h"

namespace roll {
namespace {

using ::testing::HasSubstr;

constexpr const char* kEnvOptions = "[size=5, is_slippery=true, max_steps=12]";

// One step of an episode as the agent saw it.
struct Seen {
  std::string observation;
  double reward = 0;
  bool done = false;
  int64_t step = 0;
  bool operator==(const Seen& o) const {
    return observation == o.observation && reward == o.reward && done == o.done && step == o.step;
  }
};
using Trajectories = std::map<std::string, std::vector<Seen>>;

// A fixed policy: the move (or an unreadable answer) follows from what the
// agent sees, so equal observations give equal actions.
std::string Policy(const std::string& key, const std::string& observation, size_t step) {
  static const char* kMoves[] = {"<answer>Left</answer>", "<answer>Down</answer>", "Right", "<answer>Up</answer>",
                                 "hop"};
  return kMoves[std::hash<std::string>()(absl::StrCat(key, observation, step)) % 5];
}

void WaitDead(const ClusterBase& cluster, int rank) {
  for (int i = 0; i < 200 && cluster.workers()[rank].alive; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
}

class EnvironmentTest : public ::testing::Test {
 protected:
  void Start(const std::string& env_options = kEnvOptions, int max_per_worker = 6) {
    envs_.reset();  // a cluster must not outlive its controller
    controller_.reset();
    const std::string yaml = absl::StrCat(
        "exp_name: env_test\noutput_dir: ", testing::TempDir("env"),
        "\ntrain_env_manager:\n  worker_cls: environment\n  world_size: 2\n  env_type: frozen_lake\n  env_options: ",
        env_options, "\n  max_env_num_per_worker: ", max_per_worker, "\nruntime:\n  worker_binary: ",
        testing::RollBinary(), "\n  health_check_interval_s: 0.2\n  worker_timeout_s: 1.5\n");
    auto config = ParsePipelineConfig(yaml, "<test>");
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    auto controller = Controller::Create(config_);
    ASSERT_TRUE(controller.ok()) << controller.status();
    controller_ = *std::move(controller);
    auto envs = controller_->StartCluster<EnvironmentApi>("train_env_manager");
    start_status_ = envs.status();
    if (envs.ok()) envs_ = *std::move(envs);
  }

  // A client whose restarts replace the dead workers; `after_restart` runs
  // after each.
  std::unique_ptr<EnvironmentClient> Client(std::function<void(int)> after_restart = nullptr) {
    return std::make_unique<EnvironmentClient>(
        envs_.get(), config_.train_env_manager.max_env_num_per_worker,
        [this, after_restart](ClusterBase& cluster, const absl::Status&) -> absl::StatusOr<std::vector<int>> {
          ++restarts_;
          ROLL_ASSIGN_OR_RETURN(std::vector<int> replaced, controller_->RestartDeadWorkers(cluster));
          if (after_restart) after_restart(restarts_);
          return replaced;
        });
  }

  // Plays 8 episodes to the end, one step of each per round; before round
  // `kill_round`, kills rank 0.
  Trajectories Play(EnvironmentClient* client, int kill_round = -1) {
    Trajectories out;
    std::vector<EpisodeStart> starts;
    for (int i = 0; i < 8; ++i) starts.push_back({absl::StrCat("ep", i), 100u + i});
    auto first = client->Reset(starts);
    EXPECT_TRUE(first.ok()) << first.status();
    if (!first.ok()) return out;
    std::map<std::string, std::string> obs;
    for (const EnvObservation& o : *first) {
      obs[o.key] = o.observation;
      out[o.key].push_back({o.observation, 0, false, 0});
      EXPECT_THAT(o.instructions, HasSubstr("slippery"));
    }
    for (int round = 0; !obs.empty() && round < 20; ++round) {
      if (round == kill_round) {
        int running_on_0 = 0;
        for (const auto& [key, o] : obs) running_on_0 += client->rank_of(key) == 0;
        EXPECT_GT(running_on_0, 0) << "the killed rank must owe steps, or nothing is resent";
        EXPECT_EQ(::kill(envs_->workers()[0].pid, SIGKILL), 0);
        WaitDead(*envs_, 0);
      }
      std::vector<EnvAction> actions;
      for (const auto& [key, o] : obs) actions.push_back({key, Policy(key, o, out[key].size())});
      auto steps = client->Step(actions);
      EXPECT_TRUE(steps.ok()) << steps.status();
      if (!steps.ok()) return out;
      for (const EnvTransition& t : *steps) {
        out[t.key].push_back({t.observation, t.reward, t.done, t.step});
        if (t.done) {
          obs.erase(t.key);
        } else {
          obs[t.key] = t.observation;
        }
      }
    }
    EXPECT_TRUE(obs.empty()) << "episodes still running after 20 rounds";
    return out;
  }

  // The trajectories of an uninterrupted run; then a new job for the next.
  Trajectories PlayOnceThenStartAfresh() {
    Start();
    EXPECT_TRUE(start_status_.ok()) << start_status_;
    if (!start_status_.ok()) return {};
    const Trajectories plain = Play(Client().get());
    EXPECT_TRUE(envs_->Shutdown().ok());
    Start();
    EXPECT_TRUE(start_status_.ok()) << start_status_;
    return plain;
  }

  PipelineConfig config_;
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<Cluster<EnvironmentApi>> envs_;
  absl::Status start_status_;
  int restarts_ = 0;
};

TEST_F(EnvironmentTest, EpisodesRunOnBothRanksAsTheEnvironmentPlaysThem) {
  Start();
  ASSERT_TRUE(start_status_.ok()) << start_status_;
  auto client = Client();
  const Trajectories got = Play(client.get());
  ASSERT_EQ(got.size(), 8u);
  int on_rank0 = 0;
  for (int i = 0; i < 8; ++i) on_rank0 += client->rank_of(absl::StrCat("ep", i)) == 0;
  EXPECT_EQ(on_rank0, 4) << "episodes are spread over the ranks";
  // Each episode is what the environment itself gives for that seed and
  // those actions, one step at a time.
  for (const auto& [key, seen] : got) {
    auto env = MakeEnvironment("frozen_lake", config_.train_env_manager.env_options);
    ASSERT_TRUE(env.ok());
    EXPECT_EQ(*(*env)->Reset(100u + std::stoi(key.substr(2))), seen[0].observation);
    for (size_t s = 1; s < seen.size(); ++s) {
      auto step = (*env)->Step(Policy(key, seen[s - 1].observation, s));
      ASSERT_TRUE(step.ok());
      EXPECT_EQ(step->observation, seen[s].observation) << key << " step " << s;
      EXPECT_EQ(step->reward, seen[s].reward);
      EXPECT_EQ(step->done, seen[s].done);
      EXPECT_EQ(seen[s].step, static_cast<int64_t>(s));
    }
    EXPECT_TRUE(seen.back().done) << key;
  }
  EXPECT_EQ(restarts_, 0);
  EXPECT_EQ(client->Step({{"ep0", "Left"}}).status().code(), absl::StatusCode::kFailedPrecondition)
      << "ep0 is done";
  ASSERT_TRUE(client->Close({"ep0", "ep1", "never-opened"}).ok());
  EXPECT_EQ(client->open_episodes(), 6);
  EXPECT_EQ(client->Step({{"ep0", "Left"}}).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(EnvironmentTest, AKilledWorkerIsReplacedAndItsEpisodesGoOnAsIfNothingHappened) {
  const Trajectories plain = PlayOnceThenStartAfresh();
  ASSERT_TRUE(start_status_.ok());
  const pid_t survivor = envs_->workers()[1].pid;
  auto client = Client();
  const Trajectories retried = Play(client.get(), /*kill_round=*/3);
  EXPECT_EQ(restarts_, 1);
  EXPECT_EQ(envs_->workers()[1].pid, survivor) << "rank 1 keeps its process and its episodes";
  EXPECT_GT(client->replayed_steps(), 0);
  ASSERT_EQ(retried.size(), plain.size());
  for (const auto& [key, seen] : plain) EXPECT_EQ(retried.at(key), seen) << key;
}

TEST_F(EnvironmentTest, ARankThatDiesWhileAnotherIsRebuiltIsRebuiltToo) {
  const Trajectories plain = PlayOnceThenStartAfresh();
  ASSERT_TRUE(start_status_.ok());
  // Right after rank 0 is replaced, and before its episodes are replayed,
  // rank 1 dies: it had already applied the step of the round in which
  // rank 0 died, so its episodes must be rebuilt with that step.
  auto client = Client([this](int restart) {
    if (restart != 1) return;
    EXPECT_EQ(::kill(envs_->workers()[1].pid, SIGKILL), 0);
    WaitDead(*envs_, 1);
  });
  const Trajectories retried = Play(client.get(), /*kill_round=*/3);
  EXPECT_EQ(restarts_, 2);
  ASSERT_EQ(retried.size(), plain.size());
  for (const auto& [key, seen] : plain) EXPECT_EQ(retried.at(key), seen) << key;
}

TEST_F(EnvironmentTest, AnErrorOfALiveRankIsReturnedEvenWhenAnotherRankDied) {
  Start();
  ASSERT_TRUE(start_status_.ok()) << start_status_;
  auto a = Client();
  auto b = Client();
  ASSERT_TRUE(a->Reset({{"a0", 1}, {"a1", 2}}).ok());
  ASSERT_EQ(a->rank_of("a1"), 1);
  // Another client closes a1 on rank 1 behind a's back.
  ASSERT_TRUE(b->Reset({{"b0", 3}, {"a1", 2}}).ok());
  ASSERT_EQ(b->rank_of("a1"), 1);
  ASSERT_TRUE(b->Close({"a1"}).ok());
  ASSERT_EQ(::kill(envs_->workers()[0].pid, SIGKILL), 0);
  WaitDead(*envs_, 0);
  auto s = a->Step({{"a0", "Down"}, {"a1", "Down"}});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound) << s.status();
  EXPECT_THAT(s.status().message(), HasSubstr("train_env_manager rank 1: episode 'a1' is not open here"));
  EXPECT_EQ(restarts_, 0) << "replacing rank 0 cannot fix rank 1's answer";
}

TEST_F(EnvironmentTest, WithoutARestartLeftAFailedCallsEpisodesMustBeReset) {
  Start();
  ASSERT_TRUE(start_status_.ok()) << start_status_;
  EnvironmentClient client(envs_.get(), 0, [](ClusterBase&, const absl::Status& why) -> absl::StatusOr<std::vector<int>> {
    return absl::ResourceExhaustedError("no restart left");
  });
  ASSERT_TRUE(client.Reset({{"a", 1}, {"b", 2}, {"c", 3}, {"d", 4}}).ok());
  ASSERT_EQ(client.rank_of("b"), 1);
  ASSERT_EQ(::kill(envs_->workers()[0].pid, SIGKILL), 0);
  WaitDead(*envs_, 0);
  auto s = client.Step({{"a", "Down"}, {"b", "Down"}, {"c", "Down"}, {"d", "Down"}});
  EXPECT_THAT(s.status().message(), HasSubstr("no restart left"));
  // Rank 1 took b's action, but the caller never saw it: stepping b again
  // would apply a second action behind its back, so it is refused.
  auto again = client.Step({{"b", "Down"}});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("'b' must be reset first"));
  // Rank 1 still serves its episodes; the dead, idle rank 0 is no obstacle.
  ASSERT_TRUE(client.Reset({{"b", 2}}).ok());
  auto b = client.Step({{"b", "Down"}});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)[0].step, 1);
  // A new episode goes to the live rank, although the dead one holds no more.
  ASSERT_TRUE(client.Reset({{"e", 5}}).ok());
  EXPECT_EQ(client.rank_of("e"), 1);
  EXPECT_TRUE(client.Close({"b", "d", "e"}).ok());
  EXPECT_EQ(client.open_episodes(), 2);
  // Episodes of the dead rank are gone with it: closing them needs no restart.
  auto closed = client.Close({"a", "c"});
  EXPECT_TRUE(closed.ok()) << closed;
  EXPECT_EQ(client.open_episodes(), 0);
}

TEST_F(EnvironmentTest, ARankThatDiesAgainDuringItsRecoveryEndsTheCall) {
  Start();
  ASSERT_TRUE(start_status_.ok()) << start_status_;
  // Each replacement of rank 0 dies at once, as if its episodes' actions
  // killed the environment.
  auto client = Client([this](int) {
    EXPECT_EQ(::kill(envs_->workers()[0].pid, SIGKILL), 0);
    WaitDead(*envs_, 0);
  });
  ASSERT_TRUE(client->Reset({{"a", 1}, {"b", 2}}).ok());
  ASSERT_EQ(::kill(envs_->workers()[0].pid, SIGKILL), 0);
  WaitDead(*envs_, 0);
  auto s = client->Step({{"a", "Down"}, {"b", "Down"}});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kAborted) << s.status();
  EXPECT_THAT(s.status().message(), HasSubstr("train_env_manager rank 0 died again while this call was recovered"));
  EXPECT_THAT(s.status().message(), HasSubstr("the episodes it held (a)"));
  EXPECT_EQ(restarts_, 2) << "no endless cycle of restarts";
  EXPECT_EQ(client->Step({{"a", "Down"}}).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(EnvironmentTest, BadRequestsAreRefusedWithoutTouchingAnEpisode) {
  Start(kEnvOptions, /*max_per_worker=*/2);
  ASSERT_TRUE(start_status_.ok()) << start_status_;
  auto client = Client();
  auto first = client->Reset({{"x", 7}, {"y", 8}});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(client->Step({{"nope", "Left"}}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(client->Step({{"x", "Left"}, {"x", "Up"}}).status().message(), HasSubstr("'x' is given twice"));
  auto full = client->Reset({{"a", 1}, {"b", 2}, {"c", 3}});
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.status().message(), HasSubstr("max_env_num_per_worker=2"));
  EXPECT_EQ(client->open_episodes(), 2) << "a refused reset opens nothing";
  // The workers check requests too, whole, before any episode moves.
  Batch bad;
  bad.SetColumn("episode_key", {"x", "ghost"});
  bad.SetColumn("action", {"Left", "Left"});
  const int rx = client->rank_of("x");
  std::vector<Batch> each(2);
  each[rx] = bad;
  auto r = envs_->CallEach(environment::kStep, each).Replies();
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(absl::StrCat("train_env_manager rank ", rx, ": episode 'ghost'")));
  Batch over;
  over.SetColumn("episode_key", {"p", "q", "r"});
  over.SetTensor("seed", at::zeros({3}, at::kLong));
  each[rx] = over;
  r = envs_->CallEach(environment::kReset, each).Replies();
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("max_env_num_per_worker is 2"));
  // x is where it was: its first step counts as step 1.
  auto step = client->Step({{"x", "Left"}});
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ((*step)[0].step, 1);
}

TEST_F(EnvironmentTest, ABadEnvironmentConfigFailsTheStartNamingTheSection) {
  Start("[size=5, slippery=true]");
  EXPECT_FALSE(start_status_.ok());
  EXPECT_THAT(start_status_.ToString(), HasSubstr("train_env_manager"));
  EXPECT_THAT(start_status_.ToString(), HasSubstr("unknown option 'slippery'"));
}

}  // namespace
}  // namespace roll
