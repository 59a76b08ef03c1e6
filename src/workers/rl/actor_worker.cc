// The "actor" worker type: one class for the three roles a policy model
// plays, chosen by the role section the worker serves:
//   actor_train  a TrainStrategy (data parallel over the dp group), the
//                policy loss, checkpoints, and the source of weight sync;
//   actor_infer  a GenerationEngine driven request by request (submit, poll,
//                abort) and the receiving end of weight sync;
//   reference    a frozen copy scoring log-probs.

#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "roll/models/tokenizer.h"
#include "roll/models/transformer.h"
#include "roll/strategies/communicator.h"
#include "roll/strategies/generation_engine.h"
#include "roll/strategies/sharding.h"
#include "roll/strategies/tensor_parallel.h"
#include "roll/strategies/offload.h"
#include "roll/strategies/train_strategy.h"
#include "roll/strategies/weight_sync.h"
#include "roll/worker/batch_keys.h"
#include "roll/worker/rl_workers.h"
#include "workers/rl/rl_loss.h"
#include "workers/rl/worker_setup.h"

namespace roll {
namespace {

enum class ActorRole { kTrain, kInfer, kReference };

Batch MetricsReply(const std::map<std::string, double>& metrics) {
  Batch out;
  for (const auto& [k, v] : metrics) out.SetMeta(k, absl::StrCat(v));
  return out;
}

class ActorWorker : public Worker {
 public:
  absl::Status Initialize(const WorkerContext& ctx) override {
    ctx_ = ctx;
    const std::string& c = ctx.cluster;
    if (c == "actor_train") {
      role_ = ActorRole::kTrain;
    } else if (c == "actor_infer") {
      role_ = ActorRole::kInfer;
    } else if (c == "reference") {
      role_ = ActorRole::kReference;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker type 'actor' serves actor_train, actor_infer or reference, not '", c, "'"));
    }
    const PipelineConfig& cfg = *ctx.config;
    if (cfg.deterministic) at::manual_seed(static_cast<uint64_t>(cfg.seed) + ctx.rank);
    ROLL_ASSIGN_OR_RETURN(model_, LoadRoleModel(*ctx.role, cfg.device_type, role_ == ActorRole::kTrain,
                                                             /*value_head=*/false, cfg.seed));
    ROLL_ASSIGN_OR_RETURN(tokenizer_,
                          LoadDirTokenizer(ctx.role->model_args.model_name_or_path));
    if (role_ == ActorRole::kTrain) {
      ROLL_ASSIGN_OR_RETURN(loss_, MakeActorLoss(cfg));
    }
    if (role_ == ActorRole::kInfer) ROLL_RETURN_IF_ERROR(CreateEngine());
    offload_ = std::make_unique<StateOffload>(absl::StrCat(c, " rank ", ctx.rank), cfg.offload_dir);
    return absl::OkStatus();
  }

  void RegisterMethods(MethodTable& t) override {
    t.Bind(actor::kShareWeights, this, &ActorWorker::ShareWeights);
    t.Bind(actor::kSetupCollectives, this, &ActorWorker::SetupCollectives);
    t.Bind(actor::kTrainStep, this, &ActorWorker::TrainStepMethod);
    t.Bind(actor::kComputeLogProbs, this, &ActorWorker::ComputeLogProbs);
    t.Bind(actor::kSaveCheckpoint, this, &ActorWorker::SaveCheckpoint);
    t.Bind(actor::kLoadCheckpoint, this, &ActorWorker::LoadCheckpoint);
    t.Bind(actor::kSendWeights, this, &ActorWorker::SendWeights);
    t.Bind(actor::kReceiveWeights, this, &ActorWorker::ReceiveWeights);
    t.Bind(actor::kSubmit, this, &ActorWorker::Submit);
    t.Bind(actor::kPoll, this, &ActorWorker::Poll);
    t.Bind(actor::kAbort, this, &ActorWorker::Abort);
    t.Bind(actor::kOffloadStates, this, &ActorWorker::OffloadStates);
    t.Bind(actor::kLoadStates, this, &ActorWorker::LoadStates);
  }

 private:
  // The method runs on role `r` only and, unless it touches no model state
  // (abort), not while the states are offloaded.
  absl::Status Require(ActorRole r, std::string_view method, bool needs_states = true) const {
    if (role_ != r) {
      return absl::FailedPreconditionError(
          absl::StrCat("method '", Sv(method), "' is not available on the ", ctx_.cluster, " role"));
    }
    return needs_states ? offload_->Check(method) : absl::OkStatus();
  }

  // The model whatever the role (the trainer's lives in its strategy).
  CausalLM& Model() { return strategy_ ? strategy_->model() : *model_; }

  absl::StatusOr<Batch> OffloadStates(const Batch&) {
    if (offload_->offloaded()) return offload_->Offload({});
    std::vector<at::Tensor> tensors = strategy_ ? strategy_->StateTensors() : Model().Parameters();
    if (tp_group_) {
      for (CausalLM* s : tp_group_->slices()) {
        for (const at::Tensor& p : s->Parameters()) tensors.push_back(p);
        s->ReleaseInferenceWeights();
      }
    }
    int64_t freed = 0;
    if (engine_) {
      // Between rollouts nothing is pending; the cache holds nothing worth keeping.
      freed = engine_->kv_cache_bytes();
      ROLL_RETURN_IF_ERROR(Annotate(engine_->ReleaseKvCache(), absl::StrCat(ctx_.cluster, " rank ", ctx_.rank)));
    }
    Model().ReleaseInferenceWeights();
    return offload_->Offload(tensors, freed);
  }

  absl::StatusOr<Batch> LoadStates(const Batch&) {
    ROLL_ASSIGN_OR_RETURN(Batch out, offload_->Onload());
    if (engine_) ROLL_RETURN_IF_ERROR(engine_->AllocateKvCache());
    return out;
  }

  absl::Status CreateEngine() {
    const PipelineConfig& cfg = *ctx_.config;
    EngineOptions eo;
    eo.max_batch = ctx_.role->infer_batch_size;
    // Agentic trajectories hold every turn: up to sequence_length positions.
    eo.max_len = std::max<int64_t>(cfg.prompt_length + cfg.response_length, cfg.sequence_length);
    eo.seed = static_cast<uint64_t>(cfg.seed);
    std::vector<int64_t> eos = model_->config().eos_token_ids;
    if (eos.empty() && tokenizer_ && tokenizer_->eos_id()) eos.push_back(*tokenizer_->eos_id());
    eo.eos_token_ids = eos;
    if (tokenizer_) eo.tokenizer = &*tokenizer_;
    eo.enable_prefix_caching = ctx_.role->strategy_args.strategy_config.enable_prefix_caching;
    const int tp = ctx_.role->strategy_args.strategy_config.tensor_model_parallel_size;
    if (tp <= 1) {
      ROLL_ASSIGN_OR_RETURN(engine_, GenerationEngine::Create(model_.get(), eo));
      return absl::OkStatus();
    }
    ROLL_ASSIGN_OR_RETURN(tp_group_, MakeTensorParallelGroup(ctx_, *model_, tp));
    ROLL_ASSIGN_OR_RETURN(engine_, GenerationEngine::Create(tp_group_->slices(), eo));
    spdlog::info("generating with {} tensor-parallel slices of the model", tp);
    return absl::OkStatus();
  }

  // Colocated generators read the model updates from shared memory.
  absl::StatusOr<Batch> ShareWeights(const Batch&) {
    ROLL_ASSIGN_OR_RETURN(shared_, SharedWeights::Create(model_->Parameters()));
    Batch out;
    out.SetMeta(keys::kWeightsPath, shared_->path());
    return out;
  }

  absl::StatusOr<Batch> SetupCollectives(const Batch& in) {
    ROLL_RETURN_IF_ERROR(JoinCollectives(in, ctx_, &coll_));
    sync_sharded_ = in.MetaOr(keys::kSyncSharded, "0") == "1";
    shared_update_ = in.MetaOr(keys::kSharedUpdate, "0") == "1";
    if (!coll_.sync_shards.empty()) {
      spdlog::info("model updates come from {} sharded trainer ranks, each sending its own shard",
                   coll_.sync_shards.size());
    }
    ROLL_ASSIGN_OR_RETURN(int64_t timeout_s, MetaInt(in, keys::kTimeoutS, 120));
    sync_timeout_ = absl::Seconds(timeout_s);
    if (const std::string path = in.MetaOr(keys::kWeightsPath, ""); role_ == ActorRole::kInfer && !path.empty()) {
      ROLL_ASSIGN_OR_RETURN(shared_, SharedWeights::Open(path));
      spdlog::info("model updates come from shared memory ({})", path);
    }
    if (tp_group_ && !slices_only_) {
      // Every update goes straight into the slices (from a sharded
      // trainer's shards, a broadcast's windows or shared memory): the
      // whole model the slices were cut from is not kept.
      slices_only_ = true;
      for (const at::Tensor& p : model_->Parameters()) {
        at::Tensor t = p;
        t.set_data(at::empty({0}, p.options()));
      }
      spdlog::info("model updates go straight into the {} tensor-parallel slices; the whole model is not kept",
                   tp_group_->slices().size());
    }
    if (role_ == ActorRole::kTrain && !strategy_) {
      ROLL_ASSIGN_OR_RETURN(int64_t total, MetaInt(in, keys::kTotalUpdates, 1));
      ROLL_ASSIGN_OR_RETURN(strategy_, CreateTrainStrategy(ctx_, std::move(model_), total, coll_.dp.get()));
    }
    return Batch();
  }

  absl::StatusOr<Batch> TrainStepMethod(const Batch& in) {
    ROLL_RETURN_IF_ERROR(Require(ActorRole::kTrain, "train_step"));
    if (!strategy_) return absl::FailedPreconditionError("train_step before setup_collectives");
    ForwardSpec spec;
    spec.entropy = true;
    ROLL_ASSIGN_OR_RETURN(TrainStepResult r, strategy_->TrainStep(in, loss_, spec));
    std::map<std::string, double> m;
    for (const auto& [k, v] : r.metrics) {
      m[k.find('/') == std::string::npos ? absl::StrCat("actor/", k) : k] = v;
    }
    return MetricsReply(m);
  }

  absl::StatusOr<Batch> ComputeLogProbs(const Batch& in) {
    ROLL_RETURN_IF_ERROR(offload_->Check("compute_log_probs"));
    const bool entropy = in.MetaOr(keys::kEntropy, "0") == "1";
    Batch out;
    if (role_ == ActorRole::kTrain) {
      if (!strategy_) return absl::FailedPreconditionError("compute_log_probs before setup_collectives");
      ForwardSpec spec;
      spec.entropy = entropy;
      ROLL_ASSIGN_OR_RETURN(ModelOutputs o, strategy_->Forward(in, spec));
      out.SetTensor(keys::kLogProbs, o.log_probs);
      if (entropy) out.SetTensor(keys::kEntropy, o.entropy);
      return out;
    }
    if (slices_only_) {
      return absl::FailedPreconditionError(
          "compute_log_probs: this tensor-parallel generator keeps only its slices, not the whole model");
    }
    ROLL_ASSIGN_OR_RETURN(ScoredTokens s,
                          ScoreTokens(*model_, in, ctx_.role->infer_batch_size, entropy));
    out.SetTensor(keys::kLogProbs, s.log_probs);
    if (entropy) out.SetTensor(keys::kEntropy, s.entropy);
    return out;
  }

  absl::StatusOr<Batch> SaveCheckpoint(const Batch& in) {
    ROLL_RETURN_IF_ERROR(Require(ActorRole::kTrain, "save_checkpoint"));
    const std::string dir = in.MetaOr(keys::kDir, "");
    if (dir.empty()) return absl::InvalidArgumentError("save_checkpoint: meta 'dir' is required");
    SaveOptions so;
    if (tokenizer_) so.extra_files["tokenizer.json"] = tokenizer_->json();
    ROLL_RETURN_IF_ERROR(strategy_->Save(dir, so));
    return Batch();
  }

  absl::StatusOr<Batch> LoadCheckpoint(const Batch& in) {
    ROLL_RETURN_IF_ERROR(Require(ActorRole::kTrain, "load_checkpoint"));
    const std::string dir = in.MetaOr(keys::kDir, "");
    if (dir.empty()) return absl::InvalidArgumentError("load_checkpoint: meta 'dir' is required");
    ROLL_RETURN_IF_ERROR(strategy_->Load(dir));
    return Batch();
  }

  // Created on the first update; its staging buffers serve every later one.
  ParameterBroadcaster& Broadcaster() {
    if (broadcaster_ == nullptr) {
      broadcaster_ = std::make_unique<ParameterBroadcaster>(
          static_cast<int64_t>(ctx_.config->model_update_buffer_size_mb) << 20);
    }
    return *broadcaster_;
  }

  absl::StatusOr<Batch> SendWeights(const Batch& in) {
    ROLL_RETURN_IF_ERROR(Require(ActorRole::kTrain, "send_weights"));
    if (const std::vector<CausalLM*> slices = strategy_->TensorParallelSlices(); !slices.empty()) {
      // A tensor-parallel trainer: the whole model's bytes are read out of
      // its slices, window by window or straight into the shared region,
      // so the whole model is never joined; receivers take it as any update.
      if (!logged_slice_send_) {
        spdlog::info("model updates are read out of the {} tensor-parallel slices; the whole model is not joined",
                     slices.size());
        logged_slice_send_ = true;
      }
      SliceStream stream(slices);
      auto read = [&](int64_t offset, const at::Tensor& bytes) { return stream.Read(offset, bytes); };
      ROLL_RETURN_IF_ERROR(SendUpdate(
          in,
          [&](int64_t version) {
            return shared_->Publish(version, [&](const at::Tensor& region) -> absl::Status {
              if (region.numel() != stream.total_bytes()) {
                return absl::InvalidArgumentError(absl::StrCat("send_weights: the shared region holds ",
                                                               region.numel(), " bytes, the model ",
                                                               stream.total_bytes()));
              }
              return read(0, region);
            });
          },
          [&] {
            return Broadcaster().Send(*coll_.sync, stream.total_bytes(),
                                      slices.front()->Parameters().front().options(), read);
          }));
      return Batch();
    }
    if (sync_sharded_ && !shared_update_) {
      // A fully sharded trainer's ranks each send their own pieces on a
      // group of their own; no rank gathers the model.
      ROLL_RETURN_IF_ERROR(
          SendUpdate(in, nullptr, [&] { return Broadcaster().Run(*coll_.sync, strategy_->ShardPieces()); }));
      return Batch();
    }
    // Shared memory takes the whole model: a fully sharded trainer gathers
    // it on every rank for this (rank 0 publishes it).
    ROLL_RETURN_IF_ERROR(strategy_->WithFullModel([&](CausalLM& model) {
      return SendUpdate(
          in, [&](int64_t version) { return shared_->Publish(model.Parameters(), version); },
          [&] {
            return sync_sharded_ ? Broadcaster().Run(*coll_.sync, strategy_->ShardPieces())
                                 : Broadcaster().Run(*coll_.sync, model.Parameters());
          });
    }));
    return Batch();
  }

  // One model update out: `publish(version)` fills the shared region of
  // colocated generators (when this rank has one; null: nothing to
  // publish), then rank 0 of the sync group runs `broadcast`.
  absl::Status SendUpdate(const Batch& in, const std::function<absl::Status(int64_t version)>& publish,
                          const std::function<absl::Status()>& broadcast) {
    if (shared_ && publish) {
      ROLL_ASSIGN_OR_RETURN(int64_t version, MetaInt(in, keys::kVersion));
      ROLL_RETURN_IF_ERROR(publish(version));
    }
    if (coll_.sync && coll_.sync_rank == 0) {
      absl::Status s = broadcast();
      // A failed transfer (a receiver died) breaks the group for good.
      // Closing it now releases the receivers still waiting for data from
      // this rank: they fail at once instead of at the group's timeout, so
      // the pipeline can re-form the group without waiting.
      if (!s.ok()) coll_.sync.reset();
      ROLL_RETURN_IF_ERROR(s);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Batch> ReceiveWeights(const Batch& in) {
    ROLL_RETURN_IF_ERROR(Require(ActorRole::kInfer, "receive_weights"));
    if (!coll_.sync && !shared_ && coll_.sync_shards.empty()) {
      return absl::FailedPreconditionError("receive_weights: no weight-sync group and no shared weights");
    }
    ROLL_ASSIGN_OR_RETURN(int64_t version, MetaInt(in, keys::kVersion));
    // Runs on the executor, between two poll calls, i.e. between decode
    // steps: the engine sees either the old or the complete new version.
    // Parameters are written in place, so a transfer that fails midway
    // leaves a mix of versions: this worker then refuses to generate.
    absl::Status s;
    if (slices_only_ && (shared_ || coll_.sync_shards.empty())) {
      // A tensor-parallel generator: the whole model's bytes stream into
      // the slices, from shared memory or window by window.
      SliceStream writer(tp_group_->slices());
      auto deliver = [&](int64_t offset, const at::Tensor& bytes) { return writer.Write(offset, bytes); };
      s = shared_ ? shared_->Read(version, sync_timeout_, [&](const at::Tensor& b) { return deliver(0, b); })
                  : Broadcaster().Receive(*coll_.sync, writer.total_bytes(),
                                          tp_group_->slices().front()->Parameters().front().options(), deliver);
      if (s.ok()) s = writer.Finish();
    } else if (shared_) {
      s = shared_->Read(model_->Parameters(), version, sync_timeout_);
    } else if (slices_only_) {
      s = ReceiveShardedUpdateIntoSlices(Broadcaster(), coll_.sync_shards, tp_group_->slices(),
                                                      &shard_layout_);
    } else if (!coll_.sync_shards.empty()) {
      s = ReceiveShardedUpdate(Broadcaster(), coll_.sync_shards, *model_, &shard_layout_);
    } else {
      s = Broadcaster().Run(*coll_.sync, model_->Parameters());
    }
    if (!s.ok()) {
      weights_broken_ = absl::StrCat("the model update to version ", version, " failed midway (",
                                     s.message(), "); the weights mix two versions");
      // Broken for good; closing it releases peers that wait on this rank.
      if (!shared_) {
        coll_.sync.reset();
        coll_.sync_shards.clear();
      }
      return s;
    }
    weights_broken_.clear();
    engine_->set_weight_version(version);
    // Asynchronous training's recompute option: the samples in flight get
    // the new weights' keys and values for their whole prefix.
    if (ctx_.config->async_recompute_kv) ROLL_RETURN_IF_ERROR(engine_->RecomputeKvCache().status());
    return Batch();
  }

  absl::StatusOr<Batch> Submit(const Batch& in) {
    ROLL_RETURN_IF_ERROR(Require(ActorRole::kInfer, "submit"));
    if (!weights_broken_.empty()) return absl::FailedPreconditionError(weights_broken_);
    if (in.empty()) return Batch();
    ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* keys, in.Column(keys::kRequestKey));
    ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* prompts, in.Column(keys::kPrompt));
    ROLL_ASSIGN_OR_RETURN(at::Tensor seeds, in.Tensor(keys::kSeed));
    // Token in (multi-turn histories): rows with a length take their ids.
    std::optional<at::Tensor> token_ids, token_len;
    if (in.HasTensor(keys::kPromptTokenIds)) {
      ROLL_ASSIGN_OR_RETURN(token_ids, in.Tensor(keys::kPromptTokenIds));
      ROLL_ASSIGN_OR_RETURN(token_len, in.Tensor(keys::kPromptTokenLen));
      if (token_ids->dim() != 2 || token_ids->size(0) != static_cast<int64_t>(keys->size()) ||
          token_len->numel() != static_cast<int64_t>(keys->size())) {
        return absl::InvalidArgumentError("submit: prompt_token_ids must be [N, P] and prompt_token_len [N]");
      }
      token_ids = token_ids->to(at::kLong).contiguous();
      token_len = token_len->to(at::kLong).contiguous();
    }
    const bool all_tokens =
        token_len.has_value() && (token_len->numel() == 0 || token_len->min().item<int64_t>() > 0);
    if (!tokenizer_ && !all_tokens) {
      return absl::FailedPreconditionError(absl::StrCat(
          ctx_.role->model_args.model_name_or_path, " has no tokenizer.json to encode prompts"));
    }
    SamplingParams p;
    ROLL_ASSIGN_OR_RETURN(p.temperature, MetaDouble(in, keys::kTemperature, 1.0));
    ROLL_ASSIGN_OR_RETURN(p.top_p, MetaDouble(in, keys::kTopP, 1.0));
    ROLL_ASSIGN_OR_RETURN(p.top_k, MetaInt(in, keys::kTopK, 0));
    ROLL_ASSIGN_OR_RETURN(p.max_new_tokens, MetaInt(in, keys::kMaxNewTokens));
    ROLL_ASSIGN_OR_RETURN(int64_t n, MetaInt(in, keys::kN, 1));
    p.stop_strings = ctx_.role->generating_args.stop_strings;
    // Forced length interruption (ScaleRL): meta interrupt_text (the phrase),
    // interrupt_min, interrupt_max, answer_budget.
    if (const std::string phrase = in.MetaOr(keys::kInterruptText, ""); !phrase.empty()) {
      ROLL_ASSIGN_OR_RETURN(p.interrupt_ids, InterruptIds(phrase));
      ROLL_ASSIGN_OR_RETURN(p.interrupt_min, MetaInt(in, keys::kInterruptMin));
      ROLL_ASSIGN_OR_RETURN(p.interrupt_max, MetaInt(in, keys::kInterruptMax));
      ROLL_ASSIGN_OR_RETURN(p.answer_budget, MetaInt(in, keys::kAnswerBudget));
    }
    const int64_t prompt_cap = ctx_.config->prompt_length;
    for (size_t i = 0; i < keys->size(); ++i) {
      GenerationRequest r;
      const int64_t row = static_cast<int64_t>(i);
      const int64_t given = token_len ? token_len->data_ptr<int64_t>()[row] : 0;
      if (given > 0) {
        // A multi-turn history: bounded by the engine's max_len (sequence_length).
        if (given > token_ids->size(1)) {
          return absl::InvalidArgumentError(absl::StrCat("request '", (*keys)[i], "': prompt_token_len ", given,
                                                         " exceeds the ids given"));
        }
        const int64_t* ids = token_ids->data_ptr<int64_t>() + row * token_ids->size(1);
        r.prompt_ids.assign(ids, ids + given);
      } else {
        for (int32_t id : tokenizer_->Encode((*prompts)[i])) r.prompt_ids.push_back(id);
        if (static_cast<int64_t>(r.prompt_ids.size()) > prompt_cap) {
          return absl::InvalidArgumentError(absl::StrCat(
              "request '", (*keys)[i], "': prompt has ", r.prompt_ids.size(),
              " tokens, more than prompt_length=", prompt_cap));
        }
      }
      r.params = p;
      r.params.seed = static_cast<uint64_t>(seeds[row].item<int64_t>());
      r.n = n;
      std::vector<int64_t> prompt_ids = r.prompt_ids;
      ROLL_ASSIGN_OR_RETURN(RequestId id, engine_->Submit(std::move(r)));
      requests_[id] = Request{(*keys)[i], std::move(prompt_ids), n};
      by_key_[(*keys)[i]] = id;
    }
    return Batch();
  }

  // The interruption phrase's ids, encoded once per phrase (every submit of
  // a run sends the same one). A phrase the vocabulary cannot spell would
  // inject something else: refused.
  absl::StatusOr<std::vector<int64_t>> InterruptIds(const std::string& phrase) {
    if (phrase == interrupt_phrase_) return interrupt_ids_;
    if (!tokenizer_) {
      return absl::FailedPreconditionError(absl::StrCat(
          ctx_.role->model_args.model_name_or_path, " has no tokenizer.json to encode the interruption phrase"));
    }
    const std::vector<int32_t> ids = tokenizer_->Encode(phrase);
    auto round_trip = tokenizer_->Decode(ids);
    if (ids.empty() || !round_trip.ok() || *round_trip != phrase) {
      return absl::InvalidArgumentError(absl::StrCat(
          "interrupt_text '", phrase, "' does not survive ", ctx_.role->model_args.model_name_or_path,
          "'s tokenizer (it decodes back as '", round_trip.ok() ? *round_trip : round_trip.status().ToString(),
          "'): characters outside its vocabulary"));
    }
    interrupt_phrase_ = phrase;
    interrupt_ids_.assign(ids.begin(), ids.end());
    return interrupt_ids_;
  }

  absl::StatusOr<Batch> Poll(const Batch& in) {
    ROLL_RETURN_IF_ERROR(Require(ActorRole::kInfer, "poll"));
    ROLL_ASSIGN_OR_RETURN(int64_t wait_ms, MetaInt(in, keys::kWaitMs, 50));
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    std::vector<GenerationResult> done;
    // Run engine steps until something finished (after a short minimum, so
    // replies carry several samples) or the time budget is spent.
    while (engine_->HasPending()) {
      ROLL_ASSIGN_OR_RETURN(std::vector<GenerationResult> r, engine_->Step());
      for (auto& x : r) done.push_back(std::move(x));
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
      if (ms >= wait_ms || (!done.empty() && ms >= std::min<int64_t>(wait_ms, 20))) break;
    }
    return ResultsBatch(done);
  }

  Batch ResultsBatch(const std::vector<GenerationResult>& done) {
    Batch out;
    out.SetMeta(keys::kRunning, absl::StrCat(engine_->num_running() + engine_->num_waiting()));
    const int64_t m = static_cast<int64_t>(done.size());
    if (m == 0) return out;
    int64_t max_p = 1, max_r = 1;
    for (const auto& r : done) {
      max_p = std::max<int64_t>(max_p, requests_[r.request_id].prompt_ids.size());
      max_r = std::max<int64_t>(max_r, r.token_ids.size());
    }
    at::Tensor pids = at::zeros({m, max_p}, at::kLong), plen = at::zeros({m}, at::kLong);
    at::Tensor rids = at::zeros({m, max_r}, at::kLong), rlen = at::zeros({m}, at::kLong);
    at::Tensor lps = at::zeros({m, max_r}, at::kFloat), sidx = at::zeros({m}, at::kLong);
    at::Tensor ents = at::zeros({m, max_r}, at::kFloat), certs = at::zeros({m, max_r}, at::kFloat);
    at::Tensor ver = at::zeros({m}, at::kLong), cached = at::zeros({m}, at::kLong);
    at::Tensor tver = at::zeros({m, max_r}, at::kLong);
    // Only with length interruption: no bytes for it on every poll otherwise.
    const bool any_forced =
        std::any_of(done.begin(), done.end(), [](const GenerationResult& r) { return !r.forced.empty(); });
    at::Tensor forced = at::zeros({any_forced ? m : 0, max_r}, at::kLong);
    auto fa = forced.accessor<int64_t, 2>();
    auto va = tver.accessor<int64_t, 2>();
    std::vector<std::string> keys, reasons, texts;
    auto pa = pids.accessor<int64_t, 2>();
    auto ra = rids.accessor<int64_t, 2>();
    auto la = lps.accessor<float, 2>();
    auto ea = ents.accessor<float, 2>();
    auto ca = certs.accessor<float, 2>();
    for (int64_t i = 0; i < m; ++i) {
      const GenerationResult& r = done[i];
      const Request& req = requests_[r.request_id];
      for (size_t j = 0; j < req.prompt_ids.size(); ++j) pa[i][j] = req.prompt_ids[j];
      plen[i] = static_cast<int64_t>(req.prompt_ids.size());
      for (size_t j = 0; j < r.token_ids.size(); ++j) {
        ra[i][j] = r.token_ids[j];
        la[i][j] = r.logprobs[j];
        ea[i][j] = j < r.entropies.size() ? r.entropies[j] : 0.0f;
        ca[i][j] = j < r.self_certainties.size() ? r.self_certainties[j] : 0.0f;
        va[i][j] = j < r.token_versions.size() ? r.token_versions[j] : r.weight_version_first;
        if (any_forced) fa[i][j] = j < r.forced.size() ? r.forced[j] : 0;
      }
      rlen[i] = static_cast<int64_t>(r.token_ids.size());
      sidx[i] = r.sample_index;
      ver[i] = r.weight_version_first;
      cached[i] = r.cached_prompt_tokens;
      keys.push_back(req.key);
      reasons.emplace_back(FinishReasonName(r.finish_reason));
      texts.push_back(r.text);
      if (++finished_[r.request_id] == req.n) {
        by_key_.erase(req.key);
        requests_.erase(r.request_id);
        finished_.erase(r.request_id);
      }
    }
    out.SetTensor(keys::kPromptIds, pids);
    out.SetTensor(keys::kPromptLen, plen);
    out.SetTensor(keys::kResponseIds, rids);
    out.SetTensor(keys::kResponseLen, rlen);
    out.SetTensor(keys::kResponseLogprobs, lps);
    out.SetTensor(keys::kResponseEntropy, ents);
    out.SetTensor(keys::kResponseSelfCertainty, certs);
    out.SetTensor(keys::kSampleIndex, sidx);
    out.SetTensor(keys::kWeightVersion, ver);
    out.SetTensor(keys::kResponseVersions, tver);
    if (any_forced) out.SetTensor(keys::kResponseForced, forced);
    out.SetTensor(keys::kCachedTokens, cached);
    out.SetColumn(keys::kRequestKey, std::move(keys));
    out.SetColumn(keys::kFinishReason, std::move(reasons));
    out.SetColumn(keys::kResponseText, std::move(texts));
    return out;
  }

  absl::StatusOr<Batch> Abort(const Batch& in) {
    ROLL_RETURN_IF_ERROR(Require(ActorRole::kInfer, "abort", /*needs_states=*/false));
    if (in.empty()) return Batch();
    ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* keys, in.Column(keys::kRequestKey));
    for (const std::string& k : *keys) {
      auto it = by_key_.find(k);
      if (it == by_key_.end()) continue;  // finished already, or on another rank
      // NotFound only when the request finished in the meantime.
      absl::Status s = engine_->Abort(it->second);
      if (!s.ok() && !absl::IsNotFound(s)) return s;
    }
    return Batch();
  }

  struct Request {
    std::string key;
    std::vector<int64_t> prompt_ids;
    int64_t n = 1;
  };

  WorkerContext ctx_;
  ActorRole role_ = ActorRole::kTrain;
  std::unique_ptr<CausalLM> model_;  // moved into strategy_ for the trainer
  std::optional<Tokenizer> tokenizer_;
  std::string interrupt_phrase_;        // the last interruption phrase encoded
  std::vector<int64_t> interrupt_ids_;  // and its ids
  std::unique_ptr<TrainStrategy> strategy_;
  LossFn loss_;
  // Tensor-parallel generation: the group and slices the engine runs
  // (declared first: destroyed after the engine).
  std::unique_ptr<TensorParallelGroup> tp_group_;
  // A tensor-parallel generator that receives updates straight into its
  // slices: model_'s parameters are empty.
  bool slices_only_ = false;
  std::unique_ptr<GenerationEngine> engine_;
  std::unique_ptr<ParameterBroadcaster> broadcaster_;
  // The model update through shared memory: the trainer's region (rank 0
  // with colocated generators), or a generator's view of it.
  std::unique_ptr<SharedWeights> shared_;
  std::unique_ptr<StateOffload> offload_;
  absl::Duration sync_timeout_ = absl::Seconds(120);
  std::string weights_broken_;  // non-empty after a model update failed midway
  // Trainer of a fully sharded update: this rank sends its own pieces.
  bool sync_sharded_ = false;
  // Trainer of a fully sharded update with colocated generators: every
  // rank joins the gather of the model that rank 0 publishes.
  bool shared_update_ = false;
  bool logged_slice_send_ = false;
  // Generator of a fully sharded update: the trainer's layout.
  std::optional<ShardLayout> shard_layout_;
  Collectives coll_;
  std::map<RequestId, Request> requests_;
  std::map<RequestId, int64_t> finished_;
  std::map<std::string, RequestId> by_key_;
};

}  // namespace

void RegisterActorWorker() { RegisterWorkerType<ActorApi, ActorWorker>(); }

}  // namespace roll
