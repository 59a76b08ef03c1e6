#include "roll/controller/rlvr_pipeline.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "controller/rlvr_clients.h"
#include "controller/rlvr_parts.h"
#include "nlohmann/json.hpp"
#include "roll/controller/controller.h"
#include "roll/scheduler/rollout_scheduler.h"
#include "roll/worker/rl_workers.h"

namespace roll {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using Metrics = std::map<std::string, double>;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

absl::Status AtStage(const absl::Status& s, int64_t step, std::string_view stage) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("step ", step, ", ", Sv(stage), ": ", s.message()));
}

void MergeMeta(const Batch& reply, Metrics* m) {
  for (const auto& [k, v] : reply.meta()) {
    double d = 0;
    if (absl::SimpleAtod(v, &d)) (*m)[k] = d;
  }
}

class RlvrPipeline {
 public:
  RlvrPipeline(const PipelineConfig& cfg, const RlvrRunOptions& opts) : cfg_(cfg), opts_(opts) {}

  absl::Status Run() {
    ROLL_RETURN_IF_ERROR(Validate());
    ROLL_ASSIGN_OR_RETURN(prompts_, LoadPromptSets(cfg_));
    ROLL_ASSIGN_OR_RETURN(train_iter_, MakePromptIterator(prompts_.train, cfg_.seed));
    ROLL_RETURN_IF_ERROR(StartClusters());
    ROLL_RETURN_IF_ERROR(SetupCollectives());
    int64_t start_step = 0;
    if (!cfg_.resume_from_checkpoint.empty()) {
      ROLL_ASSIGN_OR_RETURN(start_step, Resume(cfg_.resume_from_checkpoint));
    }
    ROLL_ASSIGN_OR_RETURN(tracker_, MakeTracker(cfg_, start_step));
    if (start_step == 0) {
      Metrics m;
      ROLL_RETURN_IF_ERROR(AtStage(Activate({"actor_infer"}, &m), 0, "offload"));
      ROLL_RETURN_IF_ERROR(AtStage(Validate(0, &m), 0, "validation"));
      ROLL_RETURN_IF_ERROR(Log(0, m));
    }
    for (int64_t step = start_step + 1; step <= cfg_.max_steps; ++step) {
      if (absl::Status s = RunStep(step); !s.ok()) {
        // A worker of the model clusters died: restart the job from the last
        // checkpoint (within fault_tolerance.max_restarts), else fail.
        ROLL_ASSIGN_OR_RETURN(const int64_t resumed, RestartFromCheckpoint(s));
        step = resumed;  // the loop goes on with resumed + 1
      }
    }
    return absl::OkStatus();
  }

 private:
  // --- set-up ---

  absl::Status Validate() {
    const int64_t n = cfg_.num_return_sequences_in_group;
    const int64_t samples = cfg_.rollout_batch_size * n;
    if (!cfg_.actor_train.present || !cfg_.actor_infer.present) {
      return absl::InvalidArgumentError("the RLVR pipeline needs actor_train and actor_infer sections");
    }
    if (cfg_.rewards.empty()) {
      return absl::InvalidArgumentError("the RLVR pipeline needs at least one rewards.<domain> section");
    }
    const TrainingArgs& ta = cfg_.actor_train.training_args;
    const int64_t dp = cfg_.actor_train.world_size;
    const int64_t mini = static_cast<int64_t>(ta.per_device_train_batch_size) *
                         ta.gradient_accumulation_steps * dp;
    if (samples % mini != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rollout_batch_size x num_return_sequences_in_group = ", cfg_.rollout_batch_size, " x ", n,
          " = ", samples, " samples per step must be a multiple of the mini-batch "
          "actor_train.training_args.per_device_train_batch_size x gradient_accumulation_steps x "
          "world_size = ", ta.per_device_train_batch_size, " x ", ta.gradient_accumulation_steps,
          " x ", dp, " = ", mini, ", so every data-parallel rank gets whole micro-batches"));
    }
    mini_batch_ = mini;
    if (NeedsCritic() && !cfg_.critic.present) {
      return absl::InvalidArgumentError("adv_estimator 'gae' needs a critic section");
    }
    if ((cfg_.use_kl_loss || cfg_.add_token_level_kl) && !cfg_.reference.present) {
      return absl::InvalidArgumentError(
          "use_kl_loss / add_token_level_kl need a reference section");
    }
    for (const std::string& k : cfg_.val_pass_k) {
      int64_t v = 0;
      if (!absl::SimpleAtoi(k, &v) || v < 1) {
        return absl::InvalidArgumentError(absl::StrCat("val_pass_k: '", k, "' is not a positive integer"));
      }
      if (v > cfg_.val_num_return_sequences) {
        return absl::InvalidArgumentError(absl::StrCat(
            "val_pass_k: pass@", v, " needs val_num_return_sequences >= ", v, ", got ",
            cfg_.val_num_return_sequences));
      }
      pass_k_.push_back(v);
    }
    return absl::OkStatus();
  }

  bool NeedsCritic() const { return cfg_.adv_estimator == "gae"; }

  absl::Status StartClusters() {
    // One controller for the whole job: a restart keeps its address, token
    // and the agents of the other nodes.
    if (!controller_) {
      ROLL_ASSIGN_OR_RETURN(controller_, Controller::Create(cfg_));
    }
    ROLL_RETURN_IF_ERROR(CheckGpuColocation());
    ROLL_ASSIGN_OR_RETURN(train_, controller_->StartCluster<ActorApi>("actor_train"));
    ROLL_ASSIGN_OR_RETURN(infer_, controller_->StartCluster<ActorApi>("actor_infer"));
    if (cfg_.reference.present) {
      ROLL_ASSIGN_OR_RETURN(reference_, controller_->StartCluster<ActorApi>("reference"));
    }
    if (NeedsCritic()) {
      ROLL_ASSIGN_OR_RETURN(critic_, controller_->StartCluster<CriticApi>("critic"));
    }
    std::vector<ClusterRewardClient::Domain> domains;
    for (const auto& [name, rc] : cfg_.rewards) {
      ROLL_ASSIGN_OR_RETURN(auto c, controller_->StartCluster<RewardApi>("rewards." + name));
      domains.push_back({name, rc.tag_included, c.get()});
      rewards_.push_back(std::move(c));
    }
    gen_client_ = std::make_unique<ClusterGenerationClient>(
        infer_.get(), [this](const absl::Status& why) { return RestartGenerators(why); });
    reward_client_ = std::make_unique<ClusterRewardClient>(
        std::move(domains), [this](size_t d, const absl::Status& why) { return RestartReward(d, why); });
    return absl::OkStatus();
  }

  int64_t UpdatesPerStep() const {
    const int64_t samples = cfg_.rollout_batch_size * cfg_.num_return_sequences_in_group;
    return samples / mini_batch_ * cfg_.ppo_epochs;
  }

  // Per actor_infer rank: shares a device (CPU slot or GPU) with
  // actor_train rank 0, so the same node: processes there can map one
  // another's memory. With `honor_flag`, false everywhere when
  // colocated_weight_update is off.
  std::vector<bool> ColocatedWithTrainer(bool honor_flag = true) const {
    const DeviceMapping& m = controller_->placement();
    const int world = cfg_.actor_infer.world_size;
    std::vector<bool> out(world, false);
    if (honor_flag && !cfg_.colocated_weight_update) return out;
    for (int r = 0; r < world; ++r) {
      const WorkerPlacement* p = m.Find("actor_infer", r);
      out[r] = p != nullptr && std::find(p->colocated_with.begin(), p->colocated_with.end(), "actor_train:0") !=
                                   p->colocated_with.end();
    }
    return out;
  }

  // Before any worker starts: generators that share a GPU with trainer
  // rank 0 cannot take the update over NCCL (one rank per GPU).
  absl::Status CheckGpuColocation() const {
    if (controller_->placement().device_type() != "cuda" || cfg_.colocated_weight_update) return absl::OkStatus();
    const std::vector<bool> shares = ColocatedWithTrainer(/*honor_flag=*/false);
    for (int r = 0; r < static_cast<int>(shares.size()); ++r) {
      if (!shares[r]) continue;
      return absl::InvalidArgumentError(absl::StrCat(
          "colocated_weight_update: false, but actor_infer rank ", r,
          " shares a GPU with actor_train rank 0, and NCCL cannot put two ranks of the weight-sync group on one "
          "GPU; set colocated_weight_update: true (the update then goes through host shared memory)"));
    }
    return absl::OkStatus();
  }

  absl::Status SetupCollectives() {
    const std::vector<bool> colocated = ColocatedWithTrainer();
    weights_path_.clear();
    if (std::find(colocated.begin(), colocated.end(), true) != colocated.end()) {
      ROLL_ASSIGN_OR_RETURN(Batch shared, train_->Call(actor::kShareWeights, Batch()).Get());
      weights_path_ = shared.MetaOr("weights_path", "");
    }
    return JoinCollectives(/*all=*/true);
  }

  // Every cluster joins its collectives (`all`), or -- after actor_infer was
  // restarted -- trainer rank 0 and every generator form a new weight-sync
  // group (the data-parallel groups stay as they are). The controller's
  // store outlives restarted clusters, so every formation names its groups
  // anew (a group name is used once per store).
  absl::Status JoinCollectives(bool all) {
    const std::string epoch = absl::StrCat(".", collectives_formed_++);
    const std::vector<bool> colocated = ColocatedWithTrainer();
    int remote_receivers = 0;
    for (bool c : colocated) remote_receivers += c ? 0 : 1;
    const int64_t total = UpdatesPerStep() * cfg_.max_steps;
    auto base = [&](const std::string& group) {
      Batch b;
      b.SetMeta("group", group);
      b.SetMeta("total_updates", absl::StrCat(total));
      b.SetMeta("sync_group", "actor_weight_sync" + epoch);
      b.SetMeta("sync_world", absl::StrCat(1 + remote_receivers));
      return b;
    };
    std::vector<Batch> tin, iin;
    for (int r = 0; r < train_->world_size(); ++r) {
      Batch b = base(all ? "actor_train_dp" + epoch : "");
      b.SetMeta("sync_rank", r == 0 ? "0" : "-1");
      tin.push_back(std::move(b));
    }
    for (int r = 0, next = 1; r < infer_->world_size(); ++r) {
      Batch b = base("");
      if (colocated[r]) {
        b.SetMeta("sync_rank", "-1");
        b.SetMeta("weights_path", weights_path_);
      } else {
        b.SetMeta("sync_rank", absl::StrCat(next++));
      }
      iin.push_back(std::move(b));
    }
    // Each call blocks in the rendezvous until its peers join: issue all first.
    CallHandle th = train_->CallEach(actor::kSetupCollectives, std::move(tin));
    CallHandle ih = infer_->CallEach(actor::kSetupCollectives, std::move(iin));
    CallHandle ch;
    if (critic_ && all) {
      std::vector<Batch> cin;
      for (int r = 0; r < critic_->world_size(); ++r) {
        Batch b = base("critic_dp" + epoch);
        b.SetMeta("sync_rank", "-1");
        cin.push_back(std::move(b));
      }
      ch = critic_->CallEach(critic::kSetupCollectives, std::move(cin));
    }
    ROLL_RETURN_IF_ERROR(th.Wait());
    ROLL_RETURN_IF_ERROR(ih.Wait());
    if (critic_ && all) ROLL_RETURN_IF_ERROR(ch.Wait());
    return absl::OkStatus();
  }

  absl::Status RunStep(int64_t step) {
    Metrics m;
    const auto t0 = Clock::now();
    ROLL_RETURN_IF_ERROR(Step(step, &m));
    if (cfg_.eval_steps > 0 && (step % cfg_.eval_steps == 0 || step == cfg_.max_steps)) {
      ROLL_RETURN_IF_ERROR(AtStage(Activate({"actor_infer"}, &m), step, "offload"));
      ROLL_RETURN_IF_ERROR(AtStage(Validate(step, &m), step, "validation"));
    }
    m["time/step_s"] = Since(t0);
    // Logged before the checkpoint: a checkpoint of step N always has step
    // N in metrics.jsonl, and a restart from an older one drops (and then
    // repeats) the later lines.
    ROLL_RETURN_IF_ERROR(Log(step, m));
    if (cfg_.save_steps > 0 && (step % cfg_.save_steps == 0 || step == cfg_.max_steps)) {
      Metrics unused;
      ROLL_RETURN_IF_ERROR(AtStage(Activate({"actor_train", "critic"}, &unused), step, "offload"));
      ROLL_RETURN_IF_ERROR(AtStage(SaveCheckpoint(step), step, "checkpoint"));
    }
    return absl::OkStatus();
  }

  // The newest complete checkpoint-N under output_dir, or "" when none.
  std::string LatestCheckpoint() const {
    std::error_code ec;
    int64_t best = -1;
    std::string dir;
    for (const auto& e : fs::directory_iterator(cfg_.output_dir, ec)) {
      const std::string name = e.path().filename().string();
      int64_t n = 0;
      if (name.rfind("checkpoint-", 0) != 0 || !absl::SimpleAtoi(name.substr(11), &n)) continue;
      if (!fs::exists(e.path() / "pipeline_state.json") || n <= best) continue;
      best = n;
      dir = e.path().string();
    }
    return dir;
  }

  // The clusters of model workers (actor_train, actor_infer, reference,
  // critic) that exist.
  std::vector<ClusterBase*> ModelClusters() const {
    std::vector<ClusterBase*> out;
    for (ClusterBase* c : std::initializer_list<ClusterBase*>{train_.get(), infer_.get(), reference_.get(),
                                                              critic_.get()}) {
      if (c != nullptr) out.push_back(c);
    }
    return out;
  }

  // Counts one restart, or returns `why` annotated when none is left.
  absl::Status TakeRestart(const absl::Status& why) {
    if (restarts_ >= cfg_.fault_tolerance.max_restarts) {
      return absl::Status(why.code(), absl::StrCat(why.message(), " (fault_tolerance.max_restarts=",
                                                   cfg_.fault_tolerance.max_restarts, " restarts used)"));
    }
    ++restarts_;
    return absl::OkStatus();
  }

  // After a step failed: when a model worker is dead and restarts are left,
  // shuts every cluster down, starts them again and resumes from the newest
  // checkpoint; returns its step. Otherwise returns `why`. (Dead reward
  // workers are replaced in place by the reward client, RestartReward.)
  absl::StatusOr<int64_t> RestartFromCheckpoint(const absl::Status& why) {
    std::string dead;
    for (const ClusterBase* c : ModelClusters()) {
      for (const WorkerInfo& w : c->workers()) {
        if (!w.alive && dead.empty()) dead = absl::StrCat(c->name(), " rank ", w.rank);
      }
    }
    if (dead.empty()) return why;
    ROLL_RETURN_IF_ERROR(TakeRestart(why));
    const std::string checkpoint = LatestCheckpoint();
    if (checkpoint.empty()) {
      return absl::Status(why.code(), absl::StrCat(why.message(), " (no checkpoint in ", cfg_.output_dir,
                                                   " to restart from; set save_steps)"));
    }
    std::cerr << "roll: " << dead << " died (" << why.message() << "); restarting the job from " << checkpoint
              << " (restart " << restarts_ << " of " << cfg_.fault_tolerance.max_restarts << ")" << std::endl;
    gen_client_.reset();
    reward_client_.reset();
    for (auto& r : rewards_) r->Shutdown().IgnoreError();
    for (ClusterBase* c : ModelClusters()) c->Shutdown().IgnoreError();
    rewards_.clear();
    train_.reset();
    infer_.reset();
    reference_.reset();
    critic_.reset();
    offloaded_.clear();
    ROLL_RETURN_IF_ERROR(StartClusters());
    ROLL_RETURN_IF_ERROR(SetupCollectives());
    ROLL_ASSIGN_OR_RETURN(const int64_t step, Resume(checkpoint));
    tracker_.reset();
    ROLL_ASSIGN_OR_RETURN(tracker_, MakeTracker(cfg_, step));
    return step;
  }

  // actor_infer lost workers: each dead rank gets a new process in its
  // place while the other ranks keep running (and keep the requests they
  // hold). Every generator and trainer rank 0 then form a new weight-sync
  // group (the old one had the dead rank in it) and the new ranks take the
  // weights the others generate with (version weight_version_; the others
  // receive the same version again). Returns the replaced ranks: the
  // generation client retries the requests that were in flight there.
  // Activation works as before: a new rank starts resident, and loading a
  // resident worker is a no-op.
  absl::StatusOr<std::vector<int>> RestartGenerators(const absl::Status& why) {
    ROLL_RETURN_IF_ERROR(TakeRestart(why));
    std::vector<int> dead;
    for (const WorkerInfo& w : infer_->workers()) {
      if (!w.alive) dead.push_back(w.rank);
    }
    std::cerr << "roll: actor_infer lost a worker (" << why.message() << "); restarting rank(s) "
              << absl::StrJoin(dead, ", ") << " with weight version " << weight_version_ << " (restart " << restarts_
              << " of " << cfg_.fault_tolerance.max_restarts << ")" << std::endl;
    ROLL_ASSIGN_OR_RETURN(dead, controller_->RestartDeadWorkers(*infer_));
    ROLL_RETURN_IF_ERROR(JoinCollectives(/*all=*/false));
    Metrics unused;
    ROLL_RETURN_IF_ERROR(ActivateOnce({"actor_train", "actor_infer"}, &unused));
    ROLL_RETURN_IF_ERROR(SyncWeights(weight_version_));
    ROLL_RETURN_IF_ERROR(ActivateOnce({"actor_infer"}, &unused));
    return dead;
  }

  // Whether actor_infer lost a worker and every other model cluster is whole.
  bool OnlyGeneratorsDied() const {
    if (!LostAWorker(*infer_)) return false;
    for (const ClusterBase* c : ModelClusters()) {
      if (c != infer_.get() && LostAWorker(*c)) return false;
    }
    return true;
  }

  // Runs `stage` (one that calls actor_infer outside the generation client:
  // offload, model update); when it fails because a generator died, restarts
  // actor_infer and runs it once more.
  absl::Status WithGenerators(const std::function<absl::Status()>& stage) {
    absl::Status s = stage();
    if (s.ok() || !OnlyGeneratorsDied()) return s;
    ROLL_RETURN_IF_ERROR(RestartGenerators(s).status());
    return stage();
  }

  // A reward worker died: replace its cluster, within fault_tolerance.max_restarts.
  absl::StatusOr<Cluster<RewardApi>*> RestartReward(size_t d, const absl::Status& why) {
    const std::string name = rewards_[d]->name();
    ROLL_RETURN_IF_ERROR(TakeRestart(why));
    std::cerr << "roll: " << name << " lost a worker (" << why.message() << "); restarting it (restart "
              << restarts_ << " of " << cfg_.fault_tolerance.max_restarts << ")" << std::endl;
    rewards_[d]->Shutdown().IgnoreError();
    ROLL_ASSIGN_OR_RETURN(rewards_[d], controller_->StartCluster<RewardApi>(name));
    return rewards_[d].get();
  }

  // --- one step ---

  absl::Status Step(int64_t step, Metrics* m) {
    ROLL_RETURN_IF_ERROR(AtStage(Activate({"actor_infer"}, m), step, "offload"));
    auto t = Clock::now();
    RolloutOptions ro;
    ro.groups = cfg_.rollout_batch_size;
    ro.params = TrainParams();
    ro.dynamic_sampling = cfg_.dynamic_sampling;
    ro.max_additional_rounds = cfg_.max_additional_rounds;
    ro.redundant_prompts = cfg_.redundant_prompts;
    ro.seed = static_cast<uint64_t>(cfg_.seed);
    RolloutScheduler sched(gen_client_.get(), reward_client_.get());
    auto rollout = sched.Collect(
        ro, [this]() { return NextPrompt(train_iter_.get()); }, step);
    ROLL_RETURN_IF_ERROR(AtStage(rollout.status(), step, "rollout"));
    (*m)["time/rollout_s"] = Since(t);
    for (const auto& [k, v] : rollout->metrics) (*m)[k] = v;
    (*m)["rollout/worker_restarts"] = restarts_;

    ROLL_ASSIGN_OR_RETURN(TrainingBatch tb, BuildTrainingBatch(cfg_, rollout->groups));
    for (const auto& [k, v] : tb.metrics) (*m)[k] = v;
    (*m)["throughput/gen_tokens_per_s"] = tb.metrics["train/response_tokens"] / std::max(1e-9, (*m)["time/rollout_s"]);

    t = Clock::now();
    Batch& batch = tb.batch;
    Batch lp_in = batch;
    ROLL_RETURN_IF_ERROR(AtStage(Activate({"actor_train"}, m), step, "offload"));
    ROLL_ASSIGN_OR_RETURN(Batch old, train_->Call(actor::kComputeLogProbs, lp_in).Get());
    batch.SetTensor("old_log_probs", *old.Tensor("log_probs"));
    {
      // How far the generator's log-probs are from the trainer's on the same
      // tokens (numerics, sampling settings, stale weights).
      at::Tensor mask = (*batch.Tensor("response_mask") * *batch.Tensor("attention_mask")).slice(1, 1).to(at::kFloat);
      at::Tensor diff = (*old.Tensor("log_probs") - *batch.Tensor("infer_log_probs")).abs() * mask;
      (*m)["actor/infer_logprob_abs_diff"] = diff.sum().item<double>() / std::max(1.0, mask.sum().item<double>());
    }
    if (reference_) {
      ROLL_RETURN_IF_ERROR(AtStage(Activate({"reference"}, m), step, "offload"));
      ROLL_ASSIGN_OR_RETURN(Batch ref, reference_->Call(actor::kComputeLogProbs, lp_in).Get());
      batch.SetTensor("ref_log_probs", *ref.Tensor("log_probs"));
    }
    if (critic_) {
      ROLL_RETURN_IF_ERROR(AtStage(Activate({"critic"}, m), step, "offload"));
      ROLL_ASSIGN_OR_RETURN(Batch v, critic_->Call(critic::kComputeValues, lp_in).Get());
      batch.SetTensor("values", *v.Tensor("values"));
    }
    (*m)["time/logprobs_s"] = Since(t);
    ROLL_RETURN_IF_ERROR(AtStage(ComputeAdvantagesInto(cfg_, &batch, m), step, "advantages"));

    ROLL_RETURN_IF_ERROR(AtStage(Activate({"actor_train", "critic"}, m), step, "offload"));
    t = Clock::now();
    const int64_t B = batch.size();
    Metrics actor_sum, critic_sum;
    int64_t updates = 0;
    for (int epoch = 0; epoch < cfg_.ppo_epochs; ++epoch) {
      for (int64_t b = 0; b < B; b += mini_batch_) {
        ROLL_ASSIGN_OR_RETURN(Batch mb, batch.Slice(b, std::min(B, b + mini_batch_)));
        // prompt-mean weights are 1 / (group tokens x groups in the step);
        // one update covers mb.size() / B of the step, so scale them up to
        // make each update a mean over its own prompts.
        if (mb.HasTensor("sample_weight")) {
          mb.SetTensor("sample_weight", *mb.Tensor("sample_weight") *
                                            (static_cast<double>(B) / static_cast<double>(mb.size())));
        }
        if (critic_) {
          auto cr = critic_->Call(critic::kTrainStep, mb).Get();
          ROLL_RETURN_IF_ERROR(AtStage(cr.status(), step, "critic training"));
          Metrics one;
          MergeMeta(*cr, &one);
          for (const auto& [k, v] : one) critic_sum[k] += v;
        }
        auto r = train_->Call(actor::kTrainStep, mb).Get();
        ROLL_RETURN_IF_ERROR(AtStage(r.status(), step, "actor training"));
        Metrics one;
        MergeMeta(*r, &one);
        for (const auto& [k, v] : one) actor_sum[k] += v;
        ++updates;
      }
    }
    for (const auto& [k, v] : actor_sum) (*m)[k] = v / updates;
    for (const auto& [k, v] : critic_sum) (*m)[k] = v / updates;
    (*m)["time/train_s"] = Since(t);

    t = Clock::now();
    auto offload_s = [&] {
      auto it = m->find("time/offload_s");
      return it == m->end() ? 0.0 : it->second;
    };
    const double offload_before = offload_s();
    // Both sides resident, then the update; after a generator restart, both again.
    ROLL_RETURN_IF_ERROR(AtStage(WithGenerators([&] {
                                   ROLL_RETURN_IF_ERROR(ActivateOnce({"actor_train", "actor_infer"}, m));
                                   return SyncWeights(step);
                                 }),
                                 step, "model update"));
    // The activation inside is time/offload_s's, not counted twice.
    (*m)["time/model_update_s"] = Since(t) - (offload_s() - offload_before);
    return absl::OkStatus();
  }

  GenParams TrainParams() const {
    const GeneratingArgs& g = cfg_.actor_infer.generating_args;
    GenParams p;
    p.n = cfg_.num_return_sequences_in_group;
    p.temperature = g.do_sample ? g.temperature : 0.0;
    p.top_p = g.top_p;
    p.top_k = g.top_k;
    p.max_new_tokens = std::min(g.max_new_tokens, cfg_.response_length);
    return p;
  }

  // --- offload (docs/placement.md) ---

  bool OffloadEnabled() const {
    if (cfg_.offload_states == "auto") return controller_->placement().device_type() == "cuda";
    return cfg_.offload_states == "always";
  }

  // Offloadable model clusters (sharing a device with another cluster) and
  // how to offload and load each.
  struct Offloadable {
    ClusterBase* cluster;
    const MethodSpec* offload;
    const MethodSpec* load;
  };
  std::vector<Offloadable> OffloadableClusters() const {
    std::vector<Offloadable> out;
    if (!OffloadEnabled()) return out;
    const DeviceMapping& m = controller_->placement();
    for (ClusterBase* c : ModelClusters()) {
      if (m.ColocatedClusters(c->name()).empty()) continue;
      if (c == critic_.get()) {
        out.push_back({c, &critic::kOffloadStates, &critic::kLoadStates});
      } else {
        out.push_back({c, &actor::kOffloadStates, &actor::kLoadStates});
      }
    }
    return out;
  }

  // Makes the `active` roles (absent ones ignored) the clusters that hold
  // device memory for the next stage: every other offloadable cluster gives
  // its memory up first, then the active ones that had given theirs up take
  // it back. Adds the time to time/offload_s and, per cluster offloaded, its
  // bytes to offload/<cluster>_mb. A generator that dies meanwhile is
  // restarted and the activation run again.
  absl::Status Activate(std::initializer_list<std::string_view> active, Metrics* m) {
    if (!OffloadEnabled()) return absl::OkStatus();
    return WithGenerators([&] { return ActivateOnce(active, m); });
  }

  absl::Status ActivateOnce(std::initializer_list<std::string_view> active, Metrics* m) {
    const std::vector<Offloadable> all = OffloadableClusters();
    if (all.empty()) return absl::OkStatus();
    const auto t = Clock::now();
    auto is_active = [&](const ClusterBase* c) {
      return std::find(active.begin(), active.end(), c->name()) != active.end();
    };
    std::vector<std::pair<const Offloadable*, CallHandle>> calls;
    for (const Offloadable& o : all) {
      if (is_active(o.cluster) || offloaded_.count(o.cluster->name())) continue;
      // Counted as offloaded before the call: whatever part of it succeeds,
      // the next activation sends load_states (a no-op where nothing went).
      offloaded_.insert(o.cluster->name());
      calls.emplace_back(&o, o.cluster->Call(*o.offload, Batch()));
    }
    absl::Status first;
    for (auto& [o, h] : calls) {
      if (absl::Status s = h.WaitAll(); !s.ok()) {
        if (first.ok()) first = s;
        continue;
      }
      ROLL_ASSIGN_OR_RETURN(std::vector<Batch> replies, h.Replies());
      double bytes = 0;
      for (const Batch& r : replies) {
        double b = 0;
        if (absl::SimpleAtod(r.MetaOr("offloaded_bytes", "0"), &b)) bytes += b;
      }
      (*m)[absl::StrCat("offload/", o->cluster->name(), "_mb")] = bytes / (1 << 20);
    }
    ROLL_RETURN_IF_ERROR(first);
    calls.clear();
    for (const Offloadable& o : all) {
      if (!is_active(o.cluster) || !offloaded_.count(o.cluster->name())) continue;
      calls.emplace_back(&o, o.cluster->Call(*o.load, Batch()));
    }
    for (auto& [o, h] : calls) {
      ROLL_RETURN_IF_ERROR(h.Wait());
      offloaded_.erase(o->cluster->name());
    }
    (*m)["time/offload_s"] += Since(t);
    return absl::OkStatus();
  }

  absl::Status SyncWeights(int64_t version) {
    Batch b;
    b.SetMeta("version", absl::StrCat(version));
    CallHandle send = train_->Call(actor::kSendWeights, b);
    CallHandle recv = infer_->Call(actor::kReceiveWeights, b);
    // Both sides finish (a dead receiver fails the sender too): a retry
    // must not meet a transfer still running.
    absl::Status sent = send.WaitAll(), received = recv.WaitAll();
    ROLL_RETURN_IF_ERROR(sent.ok() ? received : sent);
    weight_version_ = version;
    return absl::OkStatus();
  }

  // --- validation ---

  absl::Status Validate(int64_t step, Metrics* m) {
    const auto t = Clock::now();
    GenParams p = TrainParams();
    p.n = cfg_.val_num_return_sequences;
    p.temperature = cfg_.val_temperature;
    RolloutScheduler sched(gen_client_.get(), reward_client_.get());
    std::vector<double> correct_frac;
    std::vector<std::pair<int64_t, int64_t>> counts;  // (n, correct) per prompt
    double reward_sum = 0, len_sum = 0;
    int64_t samples = 0;
    const int64_t total = static_cast<int64_t>(prompts_.val.size());
    for (int64_t begin = 0; begin < total; begin += cfg_.val_batch_size) {
      RolloutOptions ro;
      ro.groups = std::min<int64_t>(cfg_.val_batch_size, total - begin);
      ro.params = p;
      ro.seed = static_cast<uint64_t>(cfg_.seed) ^ 0x5a5a5a5aull;
      int64_t next = begin;
      auto batch = sched.Collect(
          ro, [&]() -> absl::StatusOr<PromptItem> { return prompts_.val[next++]; },
          -1 - begin);
      ROLL_RETURN_IF_ERROR(batch.status());
      for (const RolloutGroup& g : batch->groups) {
        int64_t c = 0;
        for (const SampleResult& s : g.samples) {
          c += s.score >= 1.0 - 1e-9;
          reward_sum += s.score;
          len_sum += static_cast<double>(s.response_ids.size());
          ++samples;
        }
        counts.emplace_back(static_cast<int64_t>(g.samples.size()), c);
      }
    }
    double acc = 0;
    for (const auto& [n, c] : counts) acc += static_cast<double>(c) / n;
    (*m)["val/accuracy"] = counts.empty() ? 0.0 : acc / counts.size();
    (*m)["val/reward_mean"] = samples ? reward_sum / samples : 0.0;
    (*m)["val/response_length"] = samples ? len_sum / samples : 0.0;
    for (int64_t k : pass_k_) (*m)[absl::StrCat("val/pass@", k)] = MeanPassAtK(counts, k);
    (*m)["time/val_s"] = Since(t);
    return absl::OkStatus();
  }

  // --- checkpoints ---

  absl::Status SaveCheckpoint(int64_t step) {
    const fs::path out = fs::path(cfg_.output_dir);
    const fs::path final_dir = out / absl::StrCat("checkpoint-", step);
    const fs::path tmp = out / absl::StrCat(".checkpoint-", step, ".tmp");
    std::error_code ec;
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot create ", tmp.string(), ": ", ec.message()));
    Batch b;
    b.SetMeta("dir", (tmp / "actor").string());
    ROLL_RETURN_IF_ERROR(train_->Call(actor::kSaveCheckpoint, b).Wait());
    if (critic_) {
      b.SetMeta("dir", (tmp / "critic").string());
      ROLL_RETURN_IF_ERROR(critic_->Call(critic::kSaveCheckpoint, b).Wait());
    }
    nlohmann::json state;
    state["step"] = step;
    state["data_position"] = nlohmann::json::parse(train_iter_->PositionJson());
    {
      std::ofstream f(tmp / "pipeline_state.json");
      f << state.dump(2) << "\n";
      f.flush();
      if (!f) return absl::InternalError(absl::StrCat("cannot write ", (tmp / "pipeline_state.json").string()));
    }
    // Swap in the complete directory; an older checkpoint of the same step
    // is only removed once the new one is in place.
    const fs::path old = out / absl::StrCat(".checkpoint-", step, ".old");
    fs::remove_all(old, ec);
    if (fs::exists(final_dir)) fs::rename(final_dir, old, ec);
    fs::rename(tmp, final_dir, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot move ", tmp.string(), " to ", final_dir.string(), ": ", ec.message()));
    fs::remove_all(old, ec);
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> Resume(const std::string& dir) {
    const fs::path d(dir);
    const fs::path state_path = d / "pipeline_state.json";
    std::ifstream f(state_path);
    if (!f) return absl::NotFoundError(absl::StrCat("resume_from_checkpoint: cannot read ", state_path.string()));
    nlohmann::json state;
    try {
      f >> state;
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(state_path.string(), ": ", e.what()));
    }
    if (!state.contains("step") || !state["step"].is_number_integer() || !state.contains("data_position")) {
      return absl::InvalidArgumentError(absl::StrCat(state_path.string(), ": missing 'step' or 'data_position'"));
    }
    Metrics unused;
    ROLL_RETURN_IF_ERROR(Activate({"actor_train", "critic"}, &unused));
    Batch b;
    b.SetMeta("dir", (d / "actor").string());
    ROLL_RETURN_IF_ERROR(train_->Call(actor::kLoadCheckpoint, b).Wait());
    if (critic_) {
      b.SetMeta("dir", (d / "critic").string());
      ROLL_RETURN_IF_ERROR(critic_->Call(critic::kLoadCheckpoint, b).Wait());
    }
    ROLL_RETURN_IF_ERROR(train_iter_->RestorePositionJson(state["data_position"].dump()));
    const int64_t step = state["step"].get<int64_t>();
    ROLL_RETURN_IF_ERROR(Activate({"actor_train", "actor_infer"}, &unused));
    ROLL_RETURN_IF_ERROR(SyncWeights(step));
    return step;
  }

  absl::Status Log(int64_t step, const Metrics& m) {
    ROLL_RETURN_IF_ERROR(tracker_->Log(step, m));
    // Every step's metrics are written; the terminal gets a line every
    // logging_steps steps, and for the first and the last.
    const std::string line = tracker_->ProgressLine(step, cfg_.max_steps, m);
    const bool show = step == 0 || step == cfg_.max_steps || cfg_.logging_steps <= 1 ||
                      step % cfg_.logging_steps == 0;
    if (opts_.progress && show) std::cout << line << std::endl;
    if (opts_.on_step) opts_.on_step(step, m);
    return absl::OkStatus();
  }

  PipelineConfig cfg_;
  RlvrRunOptions opts_;
  int64_t mini_batch_ = 1;
  std::vector<int64_t> pass_k_;
  PromptSets prompts_;
  std::unique_ptr<PromptIterator> train_iter_;
  std::unique_ptr<RunTracker> tracker_;
  std::unique_ptr<Controller> controller_;
  std::unique_ptr<Cluster<ActorApi>> train_, infer_, reference_;
  std::unique_ptr<Cluster<CriticApi>> critic_;
  std::vector<std::unique_ptr<Cluster<RewardApi>>> rewards_;
  std::unique_ptr<ClusterGenerationClient> gen_client_;
  std::unique_ptr<ClusterRewardClient> reward_client_;
  std::set<std::string, std::less<>> offloaded_;  // roles whose states are offloaded
  // The shared weights region of colocated generators (actor_train rank 0's).
  std::string weights_path_;
  int collectives_formed_ = 0;  // JoinCollectives calls so far
  int64_t weight_version_ = 0;  // the version the generators hold
  int restarts_ = 0;  // restarts so far, of either kind (fault_tolerance.max_restarts)
};

}  // namespace

absl::Status RunRlvrPipeline(const PipelineConfig& config, const RlvrRunOptions& options) {
  RlvrPipeline p(config, options);
  return p.Run();
}

}  // namespace roll
