#include "workers/rl/worker_setup.h"

#include <torch/torch.h>

#include <filesystem>

#include <spdlog/spdlog.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "roll/models/tokenizer.h"
#include "roll/models/transformer.h"
#include "roll/strategies/tensor_parallel.h"
#include "roll/strategies/train_strategy.h"
#include "roll/strategies/weight_sync.h"
#include "roll/worker/batch_keys.h"

namespace roll {

c10::ScalarType ToScalarType(DType dtype) {
  switch (dtype) {
    case DType::kBf16:
      return at::kBFloat16;
    case DType::kFp16:
      return at::kHalf;
    case DType::kFp32:
      break;
  }
  return at::kFloat;
}

absl::StatusOr<std::unique_ptr<CausalLM>> LoadRoleModel(const WorkerConfig& role, DeviceType device_type,
                                                        bool trainable, bool value_head, uint64_t seed) {
  const std::string& dir = role.model_args.model_name_or_path;
  if (dir.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(role.name, ".model_args.model_name_or_path: a model directory is required"));
  }
  ModelOptions o;
  if (device_type == DeviceType::kCuda) {
    // The worker sees only its own devices (CUDA_VISIBLE_DEVICES); the
    // model goes on the first of them.
    if (!torch::cuda::is_available()) {
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      return absl::FailedPreconditionError(absl::StrCat(
          role.name, ": device_type is cuda, but this process sees no CUDA device (CUDA_VISIBLE_DEVICES=",
          visible ? visible : "unset", "; this LibTorch is ", at::hasCUDA() ? "built with CUDA" : "built without CUDA",
          ")"));
    }
    o.device = c10::Device(c10::DeviceType::CUDA, 0);
  }
  o.dtype = ToScalarType(role.model_args.dtype);
  o.fp32_logits = role.model_args.fp32_lm_head;
  o.requires_grad = trainable;
  o.value_head = value_head;
  o.lm_head = !value_head;
  o.seed = seed;
  auto model = CausalLM::FromPretrained(dir, o);
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat(role.name, ".model_args.model_name_or_path: ",
                                     model.status().message()));
  }
  // One contiguous buffer: the model update then sends it in one transfer.
  FlattenParameters((*model)->Parameters());
  return std::move(*model);
}

absl::StatusOr<std::optional<Tokenizer>> LoadDirTokenizer(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "tokenizer.json").string();
  if (!std::filesystem::exists(path)) return std::optional<Tokenizer>();
  ROLL_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::FromFile(path));
  return std::optional<Tokenizer>(std::move(tok));
}

absl::StatusOr<int64_t> MetaInt(const Batch& b, const std::string& key,
                                std::optional<int64_t> fallback) {
  auto it = b.meta().find(key);
  if (it == b.meta().end()) {
    if (fallback) return *fallback;
    return absl::InvalidArgumentError(absl::StrCat("meta '", key, "' is required"));
  }
  int64_t v = 0;
  if (!absl::SimpleAtoi(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("meta '", key, "': expected an integer, got '", it->second, "'"));
  }
  return v;
}

absl::StatusOr<double> MetaDouble(const Batch& b, const std::string& key,
                                  std::optional<double> fallback) {
  auto it = b.meta().find(key);
  if (it == b.meta().end()) {
    if (fallback) return *fallback;
    return absl::InvalidArgumentError(absl::StrCat("meta '", key, "' is required"));
  }
  double v = 0;
  if (!absl::SimpleAtod(it->second, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("meta '", key, "': expected a number, got '", it->second, "'"));
  }
  return v;
}

absl::StatusOr<CommunicatorOptions> ControllerStoreOptions(const WorkerContext& ctx, int64_t timeout_s) {
  // The controller hosts the rendezvous store at its own address.
  const size_t colon = ctx.controller.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 || !absl::SimpleAtoi(ctx.controller.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("collectives: the controller address '", ctx.controller, "' is not host:port"));
  }
  CommunicatorOptions base;
  base.store_host = ctx.controller.substr(0, colon);
  base.store_port = port;
  base.store_token = ctx.token;
  base.timeout = std::chrono::seconds(timeout_s);
  // Peers reach this rank at its node's address.
  base.gloo_hostname = ctx.host;
  return base;
}

absl::StatusOr<std::unique_ptr<TensorParallelGroup>> MakeTensorParallelGroup(const WorkerContext& ctx,
                                                                             const CausalLM& whole, int tp) {
  ROLL_ASSIGN_OR_RETURN(CommunicatorOptions base, ControllerStoreOptions(ctx, 120));
  base.gloo_hostname = "127.0.0.1";  // the group lives in this process
  base.group_name = absl::StrCat(ctx.cluster, ".", ctx.rank, ".tp.", getpid());
  return TensorParallelGroup::Create(whole, tp, base);
}

absl::StatusOr<std::unique_ptr<TrainStrategy>> CreateTrainStrategy(const WorkerContext& ctx,
                                                                   std::unique_ptr<CausalLM> model,
                                                                   int64_t total_updates, Communicator* dp) {
  const WorkerConfig& role = *ctx.role;
  TrainStrategyOptions o = TrainStrategyOptions::FromTrainingArgs(role.training_args, total_updates);
  o.fully_sharded = role.strategy_args.strategy_name == kFullyShardedStrategyName;
  std::unique_ptr<TensorParallelGroup> slices;
  if (const int tp = role.strategy_args.strategy_config.tensor_model_parallel_size; tp > 1) {
    ROLL_ASSIGN_OR_RETURN(slices, MakeTensorParallelGroup(ctx, *model, tp));
    spdlog::info("{} trains {} tensor-parallel slices of the model", ctx.cluster, tp);
  }
  return TrainStrategy::Create(std::move(model), o, dp, std::move(slices));
}

absl::Status JoinCollectives(const Batch& in, const WorkerContext& ctx, Collectives* out) {
  const int rank = ctx.rank;
  const int world_size = ctx.world_size;
  ROLL_ASSIGN_OR_RETURN(int64_t timeout_s, MetaInt(in, keys::kTimeoutS, 120));
  ROLL_ASSIGN_OR_RETURN(CommunicatorOptions base, ControllerStoreOptions(ctx, timeout_s));
  const std::string group = in.MetaOr(keys::kGroup, "");
  if (!group.empty() && world_size > 1) {
    CommunicatorOptions o = base;
    o.group_name = group;
    o.rank = rank;
    o.world_size = world_size;
    ROLL_ASSIGN_OR_RETURN(out->dp, CreateCommunicator(o));
  }
  ROLL_ASSIGN_OR_RETURN(int64_t sync_rank, MetaInt(in, keys::kSyncRank, -1));
  ROLL_ASSIGN_OR_RETURN(int64_t sync_world, MetaInt(in, keys::kSyncWorld, 0));
  out->sync_rank = static_cast<int>(sync_rank);
  // A generator of a fully sharded trainer joins one group per trainer
  // rank ("<sync_group>.shard<r>"); everyone else joins one group.
  ROLL_ASSIGN_OR_RETURN(int64_t sync_shards, MetaInt(in, keys::kSyncShards, 0));
  out->sync_shards.clear();
  if (sync_rank >= 0 && sync_world > 1) {
    CommunicatorOptions o = base;
    o.group_name = in.MetaOr(keys::kSyncGroup, "weight_sync");
    o.rank = static_cast<int>(sync_rank);
    o.world_size = static_cast<int>(sync_world);
    if (sync_shards > 0) {
      for (int64_t r = 0; r < sync_shards; ++r) {
        CommunicatorOptions shard = o;
        shard.group_name = absl::StrCat(o.group_name, ".shard", r);
        ROLL_ASSIGN_OR_RETURN(auto comm, CreateCommunicator(shard));
        out->sync_shards.push_back(std::move(comm));
      }
    } else {
      ROLL_ASSIGN_OR_RETURN(out->sync, CreateCommunicator(o));
    }
  }
  return absl::OkStatus();
}

}  // namespace roll
