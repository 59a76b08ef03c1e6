#include "roll/pipeline/pipeline.h"

#include <algorithm>
#include <mutex>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "roll/common/logging.h"
#include "roll/common/stopwatch.h"
#include "roll/worker/batch_keys.h"

namespace roll {
namespace {

// Devices (CPU slots or GPUs) the job's model roles hold.
int64_t JobDevices(const PipelineConfig& cfg) {
  std::set<int> devices;
  for (const WorkerConfig* role : cfg.PresentRoles()) devices.insert(role->device_mapping.begin(), role->device_mapping.end());
  return static_cast<int64_t>(std::max<size_t>(devices.size(), 1));
}

struct Registry {
  std::mutex mu;
  std::map<std::string, PipelineFactory> factories;
};

Registry& GetRegistry() {
  static Registry* r = new Registry;
  return *r;
}

}  // namespace

absl::Status RegisterPipeline(const std::string& name, PipelineFactory factory) {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  if (name.empty()) return absl::InvalidArgumentError("a pipeline needs a name");
  if (!r.factories.emplace(name, std::move(factory)).second) {
    return absl::AlreadyExistsError(absl::StrCat("pipeline '", name, "' is registered twice"));
  }
  return absl::OkStatus();
}

std::vector<std::string> PipelineNames() {
  Registry& r = GetRegistry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> out;
  for (const auto& [name, f] : r.factories) out.push_back(name);
  return out;
}

absl::StatusOr<std::unique_ptr<Pipeline>> CreatePipeline(const PipelineConfig& config, const RunOptions& options) {
  PipelineFactory factory;
  {
    Registry& r = GetRegistry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(config.pipeline);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) {
    const std::vector<std::string> names = PipelineNames();
    return absl::InvalidArgumentError(absl::StrCat("pipeline: unknown pipeline '", config.pipeline, "'; known: ",
                                                   names.empty() ? "none" : absl::StrJoin(names, ", ")));
  }
  return factory(config, options);
}

absl::Status RunPipeline(const PipelineConfig& config, const RunOptions& options) {
  ROLL_ASSIGN_OR_RETURN(std::unique_ptr<Pipeline> p, CreatePipeline(config, options));
  return p->Run();
}

absl::Status AtStage(const absl::Status& s, int64_t step, std::string_view stage) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("step ", step, ", ", Sv(stage), ": ", s.message()));
}

absl::Status RefuseUnreadState(const std::string& state_json, std::string_view pipeline) {
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(state_json);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline_state.json: ", e.what()));
  }
  if (!state.is_object() || state.empty()) return absl::OkStatus();
  std::vector<std::string> keys;
  for (const auto& [k, v] : state.items()) keys.push_back(k);
  return absl::InvalidArgumentError(absl::StrCat(
      "pipeline_state.json holds ", absl::StrJoin(keys, ", "), ", which the '", Sv(pipeline),
      "' pipeline saved but does not restore (it defines SaveState without RestoreState); "
      "resuming would start that state over"));
}

BasePipeline::BasePipeline(const PipelineConfig& config, const RunOptions& options)
    : config_(config), options_(options), checkpoints_(config.output_dir), job_devices_(JobDevices(config)) {}

// The derived pipeline's clients are gone by now; the clusters stop here.
BasePipeline::~BasePipeline() = default;

absl::Status BasePipeline::Run() {
  ROLL_RETURN_IF_ERROR(CheckTrainPhaseConfig(config_));
  ROLL_RETURN_IF_ERROR(CheckConfig());
  ROLL_ASSIGN_OR_RETURN(const int64_t mini_batch, MiniBatchSize(config_, SamplesPerStep(), SamplesPerStepWhat()));
  ROLL_RETURN_IF_ERROR(Prepare());
  clusters_ = std::make_unique<JobClusters>(config_, Roles(), options_.controller);
  offloader_ = std::make_unique<StageOffloader>(clusters_.get());
  update_ = std::make_unique<ModelUpdate>(clusters_.get());
  train_ = std::make_unique<TrainPhase>(
      config_, clusters_.get(), mini_batch,
      [this](const std::vector<std::string>& roles, Metrics* m) { return Activate(roles, m); });
  ROLL_RETURN_IF_ERROR(StartJob());
  int64_t start_step = 0;
  std::string resume = config_.resume_from_checkpoint;
  if (resume == "latest") {
    // A requeued job: the newest checkpoint of its earlier runs, if any.
    resume = checkpoints_.Latest();
    if (resume.empty()) {
      LogInfo(absl::StrCat("resume_from_checkpoint: latest: no checkpoint in ", config_.output_dir,
                           " yet, starting at step 0"));
    }
  }
  if (!resume.empty()) {
    ROLL_ASSIGN_OR_RETURN(start_step, Resume(resume));
    LogInfo(absl::StrCat("resuming from ", resume, " at step ", start_step));
  }
  ROLL_RETURN_IF_ERROR(OpenTracker(start_step));
  if (start_step == 0) {
    Metrics m;
    ROLL_RETURN_IF_ERROR(AtStage(Activate({"actor_infer"}, &m), 0, "offload"));
    ROLL_RETURN_IF_ERROR(AtStage(Validate(0, &m), 0, "validation"));
    ROLL_RETURN_IF_ERROR(Log(0, m));
  }
  for (int64_t step = start_step + 1; step <= config_.max_steps; ++step) {
    if (absl::Status s = RunStep(step); !s.ok()) {
      // A worker of the model clusters died: restart the job from the last
      // checkpoint (within fault_tolerance.max_restarts), else fail.
      ROLL_ASSIGN_OR_RETURN(const int64_t resumed, RestartFromCheckpoint(s));
      step = resumed;  // the loop goes on with resumed + 1
    }
  }
  // One line of the faults the run survived.
  const int restarts = clusters_->restarts().used();
  if (restarts > 0 || dropped_groups_ > 0 || dropped_episodes_ > 0) {
    LogWarning(absl::StrCat("the run survived faults: ", restarts, " worker restart(s), ",
                            static_cast<int64_t>(dropped_episodes_), " failed episode(s), ",
                            static_cast<int64_t>(dropped_groups_), " dropped env group(s) (faults/... in metrics.jsonl)"));
  }
  return absl::OkStatus();
}

absl::Status BasePipeline::StartJob() {
  ROLL_RETURN_IF_ERROR(clusters_->CreateController());
  ROLL_RETURN_IF_ERROR(CheckWeightSyncPlacement(config_, clusters_->placement()));
  ROLL_RETURN_IF_ERROR(clusters_->Start());
  ROLL_RETURN_IF_ERROR(OnClustersStarted());
  return update_->Setup(train_->UpdatesPerStep(SamplesPerStep()) * config_.max_steps);
}

absl::Status BasePipeline::OpenTracker(int64_t resume_step) {
  tracker_.reset();
  TrackerOptions o;
  o.progress = options_.progress;
  o.on_step = options_.on_step;
  ROLL_ASSIGN_OR_RETURN(tracker_, RunTracker::Open(config_, resume_step, std::move(o)));
  return absl::OkStatus();
}

absl::Status BasePipeline::Step(int64_t step, Metrics* m) {
  ROLL_RETURN_IF_ERROR(AtStage(Activate({"actor_infer"}, m), step, "offload"));
  const Stopwatch rollout_time;
  absl::StatusOr<TrainingBatch> tb = Rollout(step, m);
  ROLL_RETURN_IF_ERROR(AtStage(tb.status(), step, "rollout"));
  if (!m->count("time/rollout_s")) (*m)["time/rollout_s"] = rollout_time.Seconds();
  for (const auto& [k, v] : tb->metrics) (*m)[k] = v;
  (*m)["rollout/worker_restarts"] = clusters_->restarts().used();
  ROLL_RETURN_IF_ERROR(train_->Run(step, &tb->batch, m));
  ROLL_RETURN_IF_ERROR(AtStage(UpdateGenerators(step, m), step, "model update"));
  OnStepTrained(step);
  return absl::OkStatus();
}

absl::Status BasePipeline::RestoreState(const std::string& state_json) {
  return RefuseUnreadState(state_json, config_.pipeline);
}

absl::Status BasePipeline::RunStep(int64_t step) {
  Metrics m;
  const Stopwatch step_time;
  ROLL_RETURN_IF_ERROR(Step(step, &m));
  if (config_.eval_steps > 0 && (step % config_.eval_steps == 0 || step == config_.max_steps)) {
    ROLL_RETURN_IF_ERROR(AtStage(Activate({"actor_infer"}, &m), step, "offload"));
    ROLL_RETURN_IF_ERROR(AtStage(Validate(step, &m), step, "validation"));
  }
  m["time/step_s"] = step_time.Seconds();
  // Cumulative compute (ScaleRL's x axis): the step's training and
  // generation FLOPs, and the devices the job holds times the step's time.
  for (const char* k : {"compute/train_flops", "compute/generation_flops"}) {
    if (auto it = m.find(k); it != m.end()) total_flops_ += it->second;
  }
  total_device_s_ += m["time/step_s"] * static_cast<double>(job_devices_);
  if (m.count("compute/train_flops") > 0) m["compute/flops"] = total_flops_;
  m["compute/device_seconds"] = total_device_s_;
  if (auto it = m.find("rollout/dropped_groups"); it != m.end()) dropped_groups_ += it->second;
  if (auto it = m.find("rollout/dropped_episodes"); it != m.end()) dropped_episodes_ += it->second;
  m["faults/worker_restarts"] = clusters_->restarts().used();
  m["faults/dropped_groups"] = dropped_groups_;
  m["faults/dropped_episodes"] = dropped_episodes_;
  // Logged before the checkpoint: a checkpoint of step N always has step N
  // in metrics.jsonl, and a restart from an older one drops (and then
  // repeats) the later lines.
  ROLL_RETURN_IF_ERROR(Log(step, m));
  if (config_.save_steps > 0 && (step % config_.save_steps == 0 || step == config_.max_steps)) {
    Metrics unused;
    ROLL_RETURN_IF_ERROR(AtStage(Activate({"actor_train", "critic"}, &unused), step, "offload"));
    ROLL_RETURN_IF_ERROR(AtStage(SaveCheckpoint(step), step, "checkpoint"));
  }
  return absl::OkStatus();
}

absl::Status BasePipeline::Log(int64_t step, const Metrics& m) { return tracker_->Log(step, m); }

absl::Status BasePipeline::SaveCheckpoint(int64_t step) {
  auto save_models = [&](const std::string& dir) {
    return CallTrainers(actor::kSaveCheckpoint, critic::kSaveCheckpoint, dir);
  };
  nlohmann::json state = nlohmann::json::parse(SaveState());
  state["compute"] = {{"flops", total_flops_}, {"device_seconds", total_device_s_}};
  return checkpoints_.Save(step, save_models, state.dump());
}

// `on_actor` on actor_train with dir/actor, then `on_critic` on the critic
// (when the job has one) with dir/critic.
absl::Status BasePipeline::CallTrainers(const Method<ActorApi>& on_actor, const Method<CriticApi>& on_critic,
                                        const std::string& dir) {
  Batch b;
  b.SetMeta(keys::kDir, dir + "/actor");
  ROLL_RETURN_IF_ERROR(clusters_->actor_train().Call(on_actor, b).Wait());
  if (Cluster<CriticApi>* critic = clusters_->critic()) {
    b.SetMeta(keys::kDir, dir + "/critic");
    ROLL_RETURN_IF_ERROR(critic->Call(on_critic, b).Wait());
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> BasePipeline::Resume(const std::string& dir) {
  ROLL_ASSIGN_OR_RETURN(const CheckpointStore::State state, checkpoints_.Read(dir));
  Metrics unused;
  ROLL_RETURN_IF_ERROR(Activate({"actor_train", "critic"}, &unused));
  ROLL_RETURN_IF_ERROR(CallTrainers(actor::kLoadCheckpoint, critic::kLoadCheckpoint, dir));
  // The base's own key, "compute", is taken out; the rest is the pipeline's.
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(state.json);
    if (j.contains("compute")) {
      total_flops_ = j["compute"].at("flops").get<double>();
      total_device_s_ = j["compute"].at("device_seconds").get<double>();
      j.erase("compute");
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/pipeline_state.json: compute: ", e.what()));
  }
  if (absl::Status s = RestoreState(j.dump()); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(dir, ": ", s.message()));
  }
  ROLL_RETURN_IF_ERROR(Activate({"actor_train", "actor_infer"}, &unused));
  ROLL_RETURN_IF_ERROR(update_->Sync(state.step));
  return state.step;
}

// After a step failed: when a model worker is dead and restarts are left,
// every cluster is shut down, started again, and the run resumes from the
// newest checkpoint; returns its step. Otherwise returns `why`. (Dead
// generators and reward workers are replaced in place by their clients.)
absl::StatusOr<int64_t> BasePipeline::RestartFromCheckpoint(const absl::Status& why) {
  const std::string dead = clusters_->DeadModelWorker();
  if (dead.empty()) return why;
  ROLL_RETURN_IF_ERROR(clusters_->restarts().Take(why));
  const std::string checkpoint = checkpoints_.Latest();
  if (checkpoint.empty()) {
    return absl::Status(why.code(), absl::StrCat(why.message(), " (no checkpoint in ", config_.output_dir,
                                                 " to restart from; set save_steps)"));
  }
  LogWarning(absl::StrCat(dead, " died (", why.message(), "); restarting the job from ", checkpoint, " (restart ",
                          clusters_->restarts().used(), " of ", clusters_->restarts().max(), ")"));
  OnClustersStopping();
  clusters_->Stop();
  offloader_->Reset();
  ROLL_RETURN_IF_ERROR(StartJob());
  ROLL_ASSIGN_OR_RETURN(const int64_t step, Resume(checkpoint));
  ROLL_RETURN_IF_ERROR(OpenTracker(step));
  return step;
}

absl::Status BasePipeline::Activate(const std::vector<std::string>& roles, Metrics* m) {
  if (!offloader_->enabled()) return absl::OkStatus();
  return WithGenerators([&] { return offloader_->Activate(roles, m); });
}

absl::Status BasePipeline::UpdateGenerators(int64_t version, Metrics* m) {
  const Stopwatch t;
  auto offload_s = [&] {
    auto it = m->find("time/offload_s");
    return it == m->end() ? 0.0 : it->second;
  };
  const double offload_before = offload_s();
  // Both sides resident, then the update; after a generator restart, both again.
  ROLL_RETURN_IF_ERROR(WithGenerators([&] {
    ROLL_RETURN_IF_ERROR(offloader_->Activate({"actor_train", "actor_infer"}, m));
    return update_->Sync(version);
  }));
  // The activation inside is time/offload_s's, not counted twice.
  (*m)["time/model_update_s"] = t.Seconds() - (offload_s() - offload_before);
  return absl::OkStatus();
}

absl::Status BasePipeline::WithGenerators(const std::function<absl::Status()>& stage) {
  absl::Status s = stage();
  // Asynchronous training does not replace generators in place (the
  // rollout running beside this stage holds requests on the dead one and
  // fails its step too): the step fails and the job restarts from its
  // checkpoint, once, whichever of the two saw the death first.
  if (s.ok() || !clusters_->OnlyGeneratorsDied() || config().async_generation_ratio > 0) return s;
  ROLL_RETURN_IF_ERROR(RestartDeadWorkers(clusters_->actor_infer(), s).status());
  return stage();
}

// A dead rank gets a new process in its place while the other ranks keep
// running (and keep the requests they hold). For actor_infer, every
// generator and trainer rank 0 then form a new weight-sync group (the old
// one had the dead rank in it) and the new ranks take the weights the
// others generate with (the others receive the same version again).
// Activation works as before: a new rank starts resident, and loading a
// resident worker is a no-op.
absl::StatusOr<std::vector<int>> BasePipeline::RestartDeadWorkers(ClusterBase& cluster, const absl::Status& why) {
  ROLL_ASSIGN_OR_RETURN(std::vector<int> replaced, clusters_->RestartDeadWorkers(cluster, why));
  if (&cluster != &clusters_->actor_infer()) return replaced;
  LogInfo(absl::StrCat("actor_infer rank(s) ", absl::StrJoin(replaced, ", "), " rejoin the weight sync at version ",
                       update_->version()));
  ROLL_RETURN_IF_ERROR(update_->Rejoin());
  Metrics unused;
  ROLL_RETURN_IF_ERROR(offloader_->Activate({"actor_train", "actor_infer"}, &unused));
  ROLL_RETURN_IF_ERROR(update_->Sync(update_->version()));
  ROLL_RETURN_IF_ERROR(offloader_->Activate({"actor_infer"}, &unused));
  return replaced;
}

WorkerRestarter BasePipeline::Restarter() {
  return [this](ClusterBase& cluster, const absl::Status& why) { return RestartDeadWorkers(cluster, why); };
}

}  // namespace roll
