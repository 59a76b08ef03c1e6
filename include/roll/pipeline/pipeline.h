#pragma once
// Pipelines by name, and BasePipeline: the skeleton every training pipeline
// shares. A config names its pipeline (`pipeline: rlvr`, the default);
// `roll run` looks it up in the registry and runs it. A user's pipeline
// registers the same way (ROLL_REGISTER_PIPELINE) and is run by its own
// executable through RunPipeline (examples/custom_pipeline).
//
// BasePipeline composes the pieces of this folder and runs the loop:
//
//   CheckConfig, Prepare              the pipeline's checks and data
//   start the job                     JobClusters (+ OnClustersStarted),
//                                     ModelUpdate::Setup
//   resume                            resume_from_checkpoint: models,
//                                     pipeline state, model update
//   step 0                            Validate before any training
//   for each step                     Step, Validate every eval_steps,
//                                     log, checkpoint every save_steps
//   a model worker died               restart the job from the newest
//                                     checkpoint (fault_tolerance)
//   a worker of another cluster died  replace it alone (RestartDeadWorkers;
//                                     the clients send what it owed again)
//
// and the step itself (Step's default):
//
//   Activate({actor_infer})           offload around the rollout
//   Rollout                           the pipeline's: samples -> training batch
//   its metrics                       + rollout/worker_restarts
//   train_phase().Run                 log-probs, advantages, updates
//   UpdateGenerators(step)            the new weights to the generators
//   OnStepTrained(step)
//
// A pipeline overrides the hooks; each hook's error is annotated with the
// step and the stage. Not thread-safe: the loop runs on the caller's thread.

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "roll/common/config.h"
#include "roll/common/status.h"
#include "roll/pipeline/checkpoints.h"
#include "roll/pipeline/job_clusters.h"
#include "roll/pipeline/model_update.h"
#include "roll/pipeline/run_tracker.h"
#include "roll/pipeline/stage_offloader.h"
#include "roll/pipeline/train_phase.h"

namespace roll {

struct RunOptions {
  // Print the progress line to stdout (default true).
  bool progress = true;
  // Called after each step's metrics are logged (tests observe a run).
  std::function<void(int64_t step, const Metrics&)> on_step;
  // The job's controller: its launcher, the role sections beyond the
  // built-in ones (a custom pipeline's own worker groups), the token.
  ControllerOptions controller;
};

class Pipeline {
 public:
  virtual ~Pipeline() = default;
  // Runs to config.max_steps. Errors name the step and the stage.
  virtual absl::Status Run() = 0;
};

using PipelineFactory =
    std::function<absl::StatusOr<std::unique_ptr<Pipeline>>(const PipelineConfig&, const RunOptions&)>;

// Registers `factory` under `name`; a second registration of a name fails.
absl::Status RegisterPipeline(const std::string& name, PipelineFactory factory);
// The registered names, sorted.
std::vector<std::string> PipelineNames();
// The pipeline config.pipeline names; an unknown name is refused with the
// known ones.
absl::StatusOr<std::unique_ptr<Pipeline>> CreatePipeline(const PipelineConfig& config,
                                                         const RunOptions& options = {});
// CreatePipeline, then Run.
absl::Status RunPipeline(const PipelineConfig& config, const RunOptions& options = {});
// The pipelines that ship with the library (rlvr, agentic) register
// themselves; a program that runs them by name calls this once so that the
// linker keeps them (`roll run` does). Idempotent.
void RegisterBuiltinPipelines();

// Registers class P (constructible from (const PipelineConfig&, const
// RunOptions&)) under `name` when the program starts. For a pipeline
// compiled into the user's own executable.
#define ROLL_REGISTER_PIPELINE(name, P) ROLL_REGISTER_PIPELINE_AT_(name, P, __COUNTER__)
#define ROLL_REGISTER_PIPELINE_AT_(name, P, n) ROLL_REGISTER_PIPELINE_AT2_(name, P, n)
#define ROLL_REGISTER_PIPELINE_AT2_(name, P, n)                                                         \
  static const bool roll_pipeline_registered_##n = [] {                                                  \
    ::roll::RegisterPipeline(name, [](const ::roll::PipelineConfig& c, const ::roll::RunOptions& o)      \
                                       -> absl::StatusOr<std::unique_ptr<::roll::Pipeline>> {            \
                               return std::unique_ptr<::roll::Pipeline>(new P(c, o));                   \
                             })                                                                          \
        .IgnoreError();                                                                                  \
    return true;                                                                                         \
  }()

// "step <step>, <stage>: <message>", or OK.
absl::Status AtStage(const absl::Status& status, int64_t step, std::string_view stage);

// OK when `state_json` (a checkpoint's pipeline state, the base's own keys
// taken out) is an empty object; otherwise an error naming its keys, which
// `pipeline` saved but does not restore: resuming would silently start them
// over (a prompt iterator from its first prompt). BasePipeline's default
// RestoreState.
absl::Status RefuseUnreadState(const std::string& state_json, std::string_view pipeline);

class BasePipeline : public Pipeline {
 public:
  BasePipeline(const PipelineConfig& config, const RunOptions& options);
  ~BasePipeline() override;
  absl::Status Run() override;

 protected:
  // --- hooks ---
  // Checks of the config beyond the schema, before anything starts.
  virtual absl::Status CheckConfig() { return absl::OkStatus(); }
  // Loads what the pipeline reads (prompts, environments' seeds).
  virtual absl::Status Prepare() { return absl::OkStatus(); }
  // The clusters were started (again): make the clients over them.
  virtual absl::Status OnClustersStarted() { return absl::OkStatus(); }
  // The clusters are about to be stopped: drop the clients over them.
  virtual void OnClustersStopping() {}
  // One step; the default is the skeleton above. A pipeline that trains
  // defines Rollout only; one that does other work per step (a benchmark)
  // overrides Step.
  virtual absl::Status Step(int64_t step, Metrics* metrics);
  // The step's samples as a training batch: generation and scoring (or
  // episodes), then the batch the train phase takes, with its metrics in
  // TrainingBatch::metrics or `metrics`. time/rollout_s is the time it took
  // unless it sets that key itself (asynchronous: the time it waited).
  virtual absl::StatusOr<TrainingBatch> Rollout(int64_t step, Metrics* metrics) = 0;
  // The generators hold `step`'s weights (the asynchronous producer learns
  // the version here).
  virtual void OnStepTrained(int64_t step) {}
  // Validation metrics (val/...) of the model the generators hold.
  virtual absl::Status Validate(int64_t step, Metrics* metrics) { return absl::OkStatus(); }
  // The pipeline's own checkpoint state, a JSON object, and its restore
  // (given the object SaveState wrote). The default restore refuses any
  // key (RefuseUnreadState): a pipeline that saves state restores it.
  virtual std::string SaveState() { return "{}"; }
  virtual absl::Status RestoreState(const std::string& state_json);
  // Samples of one training step (for the mini-batch check and the
  // trainers' learning-rate schedule), and how the error message names them.
  virtual int64_t SamplesPerStep() const = 0;
  virtual std::string SamplesPerStepWhat() const = 0;
  // The roles the job starts; default RolesFor(config).
  virtual JobRoles Roles() const { return RolesFor(config_); }

  // --- what the hooks use ---
  const PipelineConfig& config() const { return config_; }
  JobClusters& clusters() { return *clusters_; }
  TrainPhase& train_phase() { return *train_; }
  ModelUpdate& model_update() { return *update_; }
  StageOffloader& offloader() { return *offloader_; }

  // StageOffloader::Activate; when a generator dies meanwhile, it is
  // replaced and the activation runs again.
  absl::Status Activate(const std::vector<std::string>& roles, Metrics* metrics);
  // The model update of `version` with both sides resident (offload), after
  // a generator restart again; adds time/model_update_s.
  absl::Status UpdateGenerators(int64_t version, Metrics* metrics);
  // Runs `stage` (one that calls actor_infer outside a client that replaces
  // generators itself); when it fails because a generator died, replaces
  // the dead generators and runs it once more.
  absl::Status WithGenerators(const std::function<absl::Status()>& stage);
  // Replaces the dead workers of `cluster` in place
  // (JobClusters::RestartDeadWorkers: within the restart budget, logged);
  // for actor_infer also a new weight-sync group and the version the others
  // hold. Any cluster: the job's, or one the pipeline started itself.
  // Returns the replaced ranks; clients retry what was in flight there.
  absl::StatusOr<std::vector<int>> RestartDeadWorkers(ClusterBase& cluster, const absl::Status& why);
  // RestartDeadWorkers as a client's restarter.
  WorkerRestarter Restarter();

 private:
  absl::Status StartJob();
  absl::Status RunStep(int64_t step);
  absl::Status SaveCheckpoint(int64_t step);
  absl::Status CallTrainers(const Method<ActorApi>& on_actor, const Method<CriticApi>& on_critic,
                            const std::string& dir);
  absl::StatusOr<int64_t> Resume(const std::string& dir);
  absl::StatusOr<int64_t> RestartFromCheckpoint(const absl::Status& why);
  absl::Status Log(int64_t step, const Metrics& metrics);
  absl::Status OpenTracker(int64_t resume_step);

  PipelineConfig config_;
  RunOptions options_;
  std::unique_ptr<JobClusters> clusters_;
  std::unique_ptr<StageOffloader> offloader_;
  std::unique_ptr<ModelUpdate> update_;
  std::unique_ptr<TrainPhase> train_;
  std::unique_ptr<RunTracker> tracker_;
  CheckpointStore checkpoints_;
  double total_flops_ = 0;     // compute/flops so far (kept in checkpoints)
  // Faults survived by this process's run so far: faults/... metrics and
  // the end-of-run summary line.
  double dropped_groups_ = 0, dropped_episodes_ = 0;
  double total_device_s_ = 0;  // compute/device_seconds so far
  int64_t job_devices_ = 1;    // devices the job's model roles hold
};

}  // namespace roll
