#include "roll/pipeline/model_update.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "roll/strategies/train_strategy.h"
#include "roll/worker/batch_keys.h"

namespace roll {

std::vector<bool> GeneratorsColocatedWithTrainer(const PipelineConfig& config, const DeviceMapping& placement,
                                                 bool honor_flag) {
  const int world = config.actor_infer.world_size;
  std::vector<bool> out(world, false);
  if (honor_flag && !config.colocated_weight_update) return out;
  for (int r = 0; r < world; ++r) {
    const WorkerPlacement* p = placement.Find("actor_infer", r);
    out[r] = p != nullptr &&
             std::find(p->colocated_with.begin(), p->colocated_with.end(), "actor_train:0") != p->colocated_with.end();
  }
  return out;
}

absl::Status CheckWeightSyncPlacement(const PipelineConfig& config, const DeviceMapping& placement) {
  if (placement.device_type() != DeviceType::kCuda || config.colocated_weight_update) return absl::OkStatus();
  const std::vector<bool> shares = GeneratorsColocatedWithTrainer(config, placement, /*honor_flag=*/false);
  for (int r = 0; r < static_cast<int>(shares.size()); ++r) {
    if (!shares[r]) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "colocated_weight_update: false, but actor_infer rank ", r,
        " shares a GPU with actor_train rank 0, and NCCL cannot put two ranks of the weight-sync group on one "
        "GPU; set colocated_weight_update: true (the update then goes through host shared memory)"));
  }
  return absl::OkStatus();
}

absl::Status ModelUpdate::Setup(int64_t total_updates) {
  total_updates_ = total_updates;
  const std::vector<bool> colocated = GeneratorsColocatedWithTrainer(clusters_->config(), clusters_->placement());
  weights_path_.clear();
  if (std::find(colocated.begin(), colocated.end(), true) != colocated.end()) {
    ROLL_ASSIGN_OR_RETURN(Batch shared, clusters_->actor_train().Call(actor::kShareWeights, Batch()).Get());
    weights_path_ = shared.MetaOr(keys::kWeightsPath, "");
  }
  return Join(/*all=*/true);
}

absl::Status ModelUpdate::Rejoin() { return Join(/*all=*/false); }

// Every cluster joins its collectives (`all`), or only trainer rank 0 and
// every generator form a new weight-sync group. The controller's store
// outlives restarted clusters, so every formation names its groups anew.
absl::Status ModelUpdate::Join(bool all) {
  const std::string epoch = absl::StrCat(".", formed_++);
  const std::vector<bool> colocated = GeneratorsColocatedWithTrainer(clusters_->config(), clusters_->placement());
  int remote_receivers = 0;
  for (bool c : colocated) remote_receivers += c ? 0 : 1;
  auto base = [&](const std::string& group) {
    Batch b;
    b.SetMeta(keys::kGroup, group);
    b.SetMeta(keys::kTotalUpdates, absl::StrCat(total_updates_));
    b.SetMeta(keys::kSyncGroup, "actor_weight_sync" + epoch);
    b.SetMeta(keys::kSyncWorld, absl::StrCat(1 + remote_receivers));
    return b;
  };
  Cluster<ActorApi>& train = clusters_->actor_train();
  Cluster<ActorApi>& infer = clusters_->actor_infer();
  Cluster<CriticApi>* critic = clusters_->critic();
  // A fully sharded trainer sends without gathering: trainer rank r and
  // the remote generators form group "<sync_group>.shard<r>", where rank r
  // broadcasts its own shard pieces (docs/parallelism.md).
  const bool sharded = train.world_size() > 1 && remote_receivers > 0 &&
                       clusters_->config().actor_train.strategy_args.strategy_name == kFullyShardedStrategyName;
  std::vector<Batch> tin, iin;
  for (int r = 0; r < train.world_size(); ++r) {
    Batch b = base(all ? "actor_train_dp" + epoch : "");
    if (sharded) {
      b.SetMeta(keys::kSyncGroup, absl::StrCat("actor_weight_sync", epoch, ".shard", r));
      b.SetMeta(keys::kSyncRank, "0");
      b.SetMeta(keys::kSyncSharded, "1");
      // Rank 0 publishes the gathered model to colocated generators: every
      // rank takes part in the gather.
      b.SetMeta(keys::kSharedUpdate, weights_path_.empty() ? "0" : "1");
    } else {
      b.SetMeta(keys::kSyncRank, r == 0 ? "0" : "-1");
    }
    tin.push_back(std::move(b));
  }
  for (int r = 0, next = 1; r < infer.world_size(); ++r) {
    Batch b = base("");
    if (colocated[r]) {
      b.SetMeta(keys::kSyncRank, "-1");
      b.SetMeta(keys::kWeightsPath, weights_path_);
    } else {
      b.SetMeta(keys::kSyncRank, absl::StrCat(next++));
      if (sharded) b.SetMeta(keys::kSyncShards, absl::StrCat(train.world_size()));
    }
    iin.push_back(std::move(b));
  }
  // Each call blocks in the rendezvous until its peers join: issue all first.
  CallHandle th = train.CallEach(actor::kSetupCollectives, std::move(tin));
  CallHandle ih = infer.CallEach(actor::kSetupCollectives, std::move(iin));
  CallHandle ch;
  if (critic != nullptr && all) {
    std::vector<Batch> cin;
    for (int r = 0; r < critic->world_size(); ++r) {
      Batch b = base("critic_dp" + epoch);
      b.SetMeta(keys::kSyncRank, "-1");
      cin.push_back(std::move(b));
    }
    ch = critic->CallEach(critic::kSetupCollectives, std::move(cin));
  }
  ROLL_RETURN_IF_ERROR(th.Wait());
  ROLL_RETURN_IF_ERROR(ih.Wait());
  if (critic != nullptr && all) ROLL_RETURN_IF_ERROR(ch.Wait());
  return absl::OkStatus();
}

absl::Status ModelUpdate::Sync(int64_t version) {
  Batch b;
  b.SetMeta(keys::kVersion, absl::StrCat(version));
  CallHandle send = clusters_->actor_train().Call(actor::kSendWeights, b);
  CallHandle recv = clusters_->actor_infer().Call(actor::kReceiveWeights, b);
  absl::Status sent = send.WaitAll(), received = recv.WaitAll();
  ROLL_RETURN_IF_ERROR(sent.ok() ? received : sent);
  version_ = version;
  return absl::OkStatus();
}

}  // namespace roll
