#include "workers/rl/rl_common.h"

#include <torch/torch.h>

#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "roll/models/tokenizer.h"
#include "roll/models/transformer.h"
#include "roll/strategies/communicator.h"
#include "roll/strategies/train_strategy.h"

namespace roll::rl_internal {

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

absl::StatusOr<std::unique_ptr<CausalLM>> LoadRoleModel(const WorkerConfig& role, bool trainable,
                                                        bool value_head, uint64_t seed) {
  const std::string& dir = role.model_args.model_name_or_path;
  if (dir.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(role.name, ".model_args.model_name_or_path: a model directory is required"));
  }
  ModelOptions o;
  o.dtype = ToScalarType(role.model_args.dtype);
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

absl::Status JoinCollectives(const Batch& in, int rank, int world_size, Collectives* out) {
  ROLL_ASSIGN_OR_RETURN(int64_t port, MetaInt(in, "store_port"));
  const std::string host = in.MetaOr("store_host", "127.0.0.1");
  ROLL_ASSIGN_OR_RETURN(int64_t timeout_s, MetaInt(in, "timeout_s", 120));
  CommunicatorOptions base;
  base.store_host = host;
  base.store_port = static_cast<int>(port);
  base.timeout = std::chrono::seconds(timeout_s);
  base.gloo_hostname = in.MetaOr("gloo_hostname", "127.0.0.1");
  const std::string group = in.MetaOr("group", "");
  if (!group.empty() && world_size > 1) {
    CommunicatorOptions o = base;
    o.group_name = group;
    o.rank = rank;
    o.world_size = world_size;
    ROLL_ASSIGN_OR_RETURN(out->dp, CreateCommunicator(o));
  }
  ROLL_ASSIGN_OR_RETURN(int64_t sync_rank, MetaInt(in, "sync_rank", -1));
  ROLL_ASSIGN_OR_RETURN(int64_t sync_world, MetaInt(in, "sync_world", 0));
  out->sync_rank = static_cast<int>(sync_rank);
  if (sync_rank >= 0 && sync_world > 1) {
    CommunicatorOptions o = base;
    o.group_name = in.MetaOr("sync_group", "weight_sync");
    o.rank = static_cast<int>(sync_rank);
    o.world_size = static_cast<int>(sync_world);
    ROLL_ASSIGN_OR_RETURN(out->sync, CreateCommunicator(o));
  }
  return absl::OkStatus();
}

absl::Status BroadcastParameters(Communicator& comm, const std::vector<at::Tensor>& params,
                                 int64_t bucket_bytes) {
  torch::NoGradGuard no_grad;
  const bool sender = comm.rank() == 0;
  size_t i = 0;
  while (i < params.size()) {
    // One bucket: consecutive parameters of one dtype within the byte budget
    // (a parameter larger than the budget travels alone).
    const auto dtype = params[i].scalar_type();
    size_t j = i;
    int64_t bytes = 0;
    while (j < params.size() && params[j].scalar_type() == dtype &&
           (j == i || bytes + params[j].numel() * params[j].element_size() <= bucket_bytes)) {
      bytes += params[j].numel() * params[j].element_size();
      ++j;
    }
    std::vector<at::Tensor> flat_parts;
    for (size_t k = i; k < j; ++k) flat_parts.push_back(params[k].detach().reshape({-1}));
    at::Tensor flat = sender ? at::cat(flat_parts) : at::empty({bytes / params[i].element_size()},
                                                                params[i].options());
    ROLL_RETURN_IF_ERROR(comm.Broadcast(flat, 0));
    if (!sender) {
      int64_t off = 0;
      for (size_t k = i; k < j; ++k) {
        const int64_t n = params[k].numel();
        params[k].detach().copy_(flat.narrow(0, off, n).view(params[k].sizes()));
        off += n;
      }
    }
    i = j;
  }
  return absl::OkStatus();
}

absl::StatusOr<at::Tensor> LossMask(const Batch& batch) {
  ROLL_ASSIGN_OR_RETURN(at::Tensor ids, batch.Tensor("input_ids"));
  at::Tensor mask = batch.HasTensor("response_mask") ? *batch.Tensor("response_mask")
                                                     : at::ones_like(ids);
  if (batch.HasTensor("attention_mask")) mask = mask * *batch.Tensor("attention_mask");
  return mask.slice(1, 1).to(at::kFloat);
}

absl::StatusOr<ScoredTokens> ScoreTokens(const CausalLM& model, const Batch& batch, int64_t micro,
                                         bool with_entropy) {
  torch::NoGradGuard no_grad;
  ROLL_ASSIGN_OR_RETURN(at::Tensor ids, batch.Tensor("input_ids"));
  at::Tensor attn = batch.HasTensor("attention_mask") ? *batch.Tensor("attention_mask")
                                                      : at::ones_like(ids);
  ROLL_ASSIGN_OR_RETURN(at::Tensor mask, LossMask(batch));
  std::vector<at::Tensor> lps, ents;
  for (int64_t b = 0; b < ids.size(0); b += micro) {
    const int64_t e = std::min<int64_t>(ids.size(0), b + micro);
    at::Tensor mids = ids.slice(0, b, e);
    ROLL_ASSIGN_OR_RETURN(at::Tensor logits, model.Forward(mids, attn.slice(0, b, e)));
    ROLL_ASSIGN_OR_RETURN(TokenLogProbs t, LogProbsFromLogits(logits, mids, with_entropy));
    at::Tensor m = mask.slice(0, b, e);
    lps.push_back(t.log_probs * m);
    if (with_entropy) ents.push_back(t.entropy * m);
  }
  ScoredTokens out;
  out.log_probs = at::cat(lps);
  if (with_entropy) out.entropy = at::cat(ents);
  return out;
}

}  // namespace roll::rl_internal
