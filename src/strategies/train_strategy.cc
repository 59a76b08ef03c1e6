#include "roll/strategies/train_strategy.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <set>
#include <utility>

#include "absl/strings/str_join.h"
#include "roll/models/transformer.h"
#include "roll/strategies/communicator.h"
#include "roll/strategies/tensor_parallel.h"
#include "strategies/parallel_mode.h"
#include "strategies/train_internal.h"

namespace roll {

using strategies_internal::ShapeString;
namespace {

// The step's model inputs, validated, on CPU.
struct Inputs {
  at::Tensor input_ids;       // [B, T] int64
  at::Tensor attention_mask;  // [B, T] int64
  at::Tensor position_ids;    // [B, T] int64 or undefined
  at::Tensor loss_mask;       // [B, T-1] float32
  int64_t rows = 0, cols = 0;
};

absl::StatusOr<Inputs> PrepareInputs(const Batch& batch) {
  ROLL_RETURN_IF_ERROR(batch.Validate());
  Inputs in;
  ROLL_ASSIGN_OR_RETURN(at::Tensor ids, batch.Tensor("input_ids"));
  if (ids.dim() != 2 || ids.size(1) < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch tensor 'input_ids' must be [B, T] with T >= 2, got ", ShapeString(ids.sizes())));
  }
  if (at::isFloatingType(ids.scalar_type()) || ids.scalar_type() == at::kBool) {
    return absl::InvalidArgumentError("batch tensor 'input_ids' must hold integers");
  }
  in.rows = ids.size(0);
  in.cols = ids.size(1);
  in.input_ids = ids.to(at::kCPU, at::kLong);
  auto optional_mask = [&](const char* name, at::Tensor* out) -> absl::Status {
    if (!batch.HasTensor(name)) return absl::OkStatus();
    at::Tensor t = batch.tensors().at(name);
    if (t.sizes() != ids.sizes()) {
      return absl::InvalidArgumentError(absl::StrCat("batch tensor '", name, "' has shape ",
                                                     ShapeString(t.sizes()), ", expected ",
                                                     ShapeString(ids.sizes()), " like input_ids"));
    }
    *out = t.to(at::kCPU, at::kLong);
    return absl::OkStatus();
  };
  at::Tensor response_mask;
  ROLL_RETURN_IF_ERROR(optional_mask("attention_mask", &in.attention_mask));
  ROLL_RETURN_IF_ERROR(optional_mask("response_mask", &response_mask));
  ROLL_RETURN_IF_ERROR(optional_mask("position_ids", &in.position_ids));
  if (!in.attention_mask.defined()) in.attention_mask = at::ones_like(in.input_ids);
  at::Tensor shifted = in.attention_mask.slice(1, 1) != 0;
  if (response_mask.defined()) shifted = shifted & (response_mask.slice(1, 1) != 0);
  in.loss_mask = shifted.to(at::kFloat);
  return in;
}

// Runs `fn`, turning LibTorch exceptions into a status with `context`.
template <typename Fn>
auto Guarded(const std::string& context, Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(context, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(context, ": ", e.what()));
  }
}

void ClearGrads(const std::vector<at::Tensor>& params) {
  for (const at::Tensor& p : params) {
    at::Tensor q = p;
    q.mutable_grad() = at::Tensor();
  }
}

// Sharded steps issue collectives in every micro-batch, so the ranks must
// run the same number of them and must not fail one by one in the middle.
// Agrees on the largest micro-batch count (ranks with fewer run empty
// ones) and checks every rank's token ids against the vocabulary first.
absl::StatusOr<int64_t> AgreeOnShardedMicroBatches(Communicator* comm, const Inputs& in,
                                                   int64_t local_count, int64_t vocab,
                                                   const char* what) {
  absl::Status mine;  // this rank's ids
  if (in.input_ids.numel() > 0) {
    const int64_t lo = in.input_ids.min().item<int64_t>(), hi = in.input_ids.max().item<int64_t>();
    if (lo < 0 || hi >= vocab) {
      mine = absl::OutOfRangeError(
          absl::StrCat(what, ": token id ", lo < 0 ? lo : hi, " outside vocabulary [0, ", vocab, ")"));
    }
  }
  if (comm == nullptr || comm->world_size() == 1) {
    ROLL_RETURN_IF_ERROR(mine);
    return local_count;
  }
  at::Tensor agree = torch::tensor({static_cast<double>(local_count), mine.ok() ? 0.0 : 1.0}, at::kDouble);
  ROLL_RETURN_IF_ERROR(Annotate(comm->AllReduce(agree, ReduceOp::kMax),
                                absl::StrCat(what, ": agreeing on the micro-batches")));
  ROLL_RETURN_IF_ERROR(mine);
  if (agree[1].item<double>() > 0) {
    return absl::OutOfRangeError(absl::StrCat(what, ": another rank's batch holds token ids outside the vocabulary"));
  }
  return static_cast<int64_t>(agree[0].item<double>());
}

// Whether every rank's `ok` is true (one small all-reduce).
absl::StatusOr<bool> EveryRankOk(Communicator* comm, bool ok, const std::string& what) {
  at::Tensor failed = torch::tensor({ok ? 0.0 : 1.0}, at::kDouble);
  ROLL_RETURN_IF_ERROR(Annotate(comm->AllReduce(failed, ReduceOp::kMax), what));
  return failed.item<double>() == 0.0;
}

absl::Status CheckSpec(const CausalLM& model, const ForwardSpec& spec) {
  if (!spec.log_probs && !spec.entropy && !spec.values) {
    return absl::InvalidArgumentError("ForwardSpec requests no output");
  }
  if ((spec.log_probs || spec.entropy) && !model.options().lm_head) {
    return absl::InvalidArgumentError("log-probs/entropy requested but the model has no LM head");
  }
  if (spec.values && !model.options().value_head) {
    return absl::InvalidArgumentError("values requested but the model has no value head");
  }
  return absl::OkStatus();
}

}  // namespace

at::Tensor TokenMeanLoss(const at::Tensor& per_token, const MicroBatch& mb) {
  const double denom = static_cast<double>(std::max<int64_t>(mb.global_loss_tokens, 1));
  return (per_token * mb.loss_mask.to(per_token.device())).sum() / denom;
}

absl::StatusOr<TokenLogProbs> LogProbsFromLogits(const at::Tensor& logits,
                                                 const at::Tensor& input_ids, bool with_entropy) {
  if (!logits.defined() || logits.dim() != 3 || !input_ids.defined() || input_ids.dim() != 2 ||
      logits.size(0) != input_ids.size(0) || logits.size(1) != input_ids.size(1) ||
      input_ids.size(1) < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LogProbsFromLogits: want logits [B, T, V] and input_ids [B, T] with T >= 2, got ",
        logits.defined() ? ShapeString(logits.sizes()) : "<undefined>", " and ",
        input_ids.defined() ? ShapeString(input_ids.sizes()) : "<undefined>"));
  }
  return Guarded("LogProbsFromLogits", [&]() -> absl::StatusOr<TokenLogProbs> {
    const int64_t cols = input_ids.size(1);
    const int64_t vocab = logits.size(2);
    at::Tensor targets = input_ids.slice(1, 1).to(logits.device(), at::kLong);
    if (targets.numel() > 0) {
      const int64_t lo = targets.min().item<int64_t>(), hi = targets.max().item<int64_t>();
      if (lo < 0 || hi >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat("input_ids holds token id ", lo < 0 ? lo : hi,
                                                       " outside the vocabulary [0, ", vocab, ")"));
      }
    }
    at::Tensor lsm = at::log_softmax(logits.slice(1, 0, cols - 1).to(at::kFloat), -1);
    TokenLogProbs out;
    out.log_probs = lsm.gather(-1, targets.unsqueeze(-1)).squeeze(-1);
    if (with_entropy) out.entropy = -(lsm.exp() * lsm).sum(-1);
    return out;
  });
}

TrainStrategy::TrainStrategy(std::unique_ptr<CausalLM> model, const TrainStrategyOptions& options,
                             Communicator* communicator, LrSchedule schedule,
                             std::unique_ptr<strategies_internal::ParallelMode> mode,
                             std::unique_ptr<AdamW> optimizer)
    : model_(std::move(model)),
      options_(options),
      communicator_(communicator),
      schedule_(std::move(schedule)),
      mode_(std::move(mode)),
      optimizer_(std::move(optimizer)) {}

bool TrainStrategy::fully_sharded() const { return mode_->shard_layout() != nullptr; }
int TrainStrategy::tensor_parallel_size() const { return mode_->tensor_parallel_size(); }
std::vector<CausalLM*> TrainStrategy::TensorParallelSlices() const { return mode_->slices(); }
const ShardLayout* TrainStrategy::shard_layout() const { return mode_->shard_layout(); }
std::vector<at::Tensor> TrainStrategy::ShardPieces() const { return mode_->ShardPieces(); }

absl::Status TrainStrategy::WithFullModel(const std::function<absl::Status(CausalLM& model)>& fn) {
  return mode_->WithFullModel(fn);
}

// Model outputs of one micro-batch (autograd as the caller's mode says).
absl::StatusOr<ModelOutputs> TrainStrategy::RunModel(int copy, const at::Tensor& ids, const at::Tensor& mask,
                                                     const at::Tensor& pos, const at::Tensor& loss_mask,
                                                     const ForwardSpec& spec) {
  const bool need_lm = spec.log_probs || spec.entropy;
  ROLL_ASSIGN_OR_RETURN(strategies_internal::RawOutputs raw,
                        mode_->Run(copy, ids, mask, pos, need_lm, spec.values));
  ModelOutputs out;
  if (spec.values) out.values = raw.values.to(at::kFloat);
  if (need_lm) {
    ROLL_ASSIGN_OR_RETURN(TokenLogProbs lp, LogProbsFromLogits(raw.logits, ids, spec.entropy));
    if (spec.log_probs) out.log_probs = lp.log_probs;
    if (spec.entropy) out.entropy = lp.entropy;
  }
  // Padding and prompt positions hold unspecified finite values; zero them
  // so no consumer can pick them up by accident.
  const at::Tensor off = loss_mask == 0;
  for (at::Tensor* t : {&out.log_probs, &out.entropy, &out.values}) {
    if (t->defined()) *t = t->masked_fill(off, 0.0);
  }
  return out;
}

TrainStrategy::~TrainStrategy() = default;

bool TrainStrategy::distributed() const {
  return communicator_ != nullptr && communicator_->world_size() > 1;
}

absl::StatusOr<std::unique_ptr<TrainStrategy>> TrainStrategy::Create(
    std::unique_ptr<CausalLM> model, const TrainStrategyOptions& options, Communicator* communicator) {
  return Create(std::move(model), options, communicator, nullptr);
}

absl::StatusOr<std::unique_ptr<TrainStrategy>> TrainStrategy::Create(
    std::unique_ptr<CausalLM> model, const TrainStrategyOptions& options,
    Communicator* communicator, std::unique_ptr<TensorParallelGroup> tensor_parallel) {
  if (model == nullptr) return absl::InvalidArgumentError("TrainStrategy: no model");
  if (tensor_parallel != nullptr && options.fully_sharded) {
    return absl::InvalidArgumentError(
        "TrainStrategy: tensor parallelism and fully sharded data parallelism cannot be combined yet");
  }
  if (options.micro_batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("TrainStrategy: micro_batch_size must be >= 1, got ", options.micro_batch_size));
  }
  if (options.max_tokens_per_micro_batch < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TrainStrategy: max_tokens_per_micro_batch must be >= 0, got ", options.max_tokens_per_micro_batch));
  }
  if (options.bucket_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("TrainStrategy: bucket_bytes must be >= 1, got ", options.bucket_bytes));
  }
  if (!(options.max_grad_norm >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("TrainStrategy: max_grad_norm must be >= 0, got ", options.max_grad_norm));
  }
  ROLL_ASSIGN_OR_RETURN(LrSchedule schedule, LrSchedule::Create(options.lr));
  std::unique_ptr<strategies_internal::ParallelMode> mode;
  if (options.fully_sharded) {
    ROLL_ASSIGN_OR_RETURN(mode, strategies_internal::CreateFullyShardedMode(*model, communicator));
  } else if (tensor_parallel != nullptr) {
    ROLL_ASSIGN_OR_RETURN(mode, strategies_internal::CreateTensorParallelMode(
                                    *model, std::move(tensor_parallel), communicator, options.bucket_bytes));
  } else {
    ROLL_ASSIGN_OR_RETURN(mode, strategies_internal::CreateReplicatedMode(*model, communicator, options.bucket_bytes));
  }
  ROLL_ASSIGN_OR_RETURN(auto optimizer, mode->CreateOptimizer(options.adam));
  return std::unique_ptr<TrainStrategy>(new TrainStrategy(std::move(model), options, communicator,
                                                          std::move(schedule), std::move(mode),
                                                          std::move(optimizer)));
}

absl::StatusOr<std::vector<std::vector<int64_t>>> TrainStrategy::PlanMicroBatches(
    const Batch& batch) const {
  ROLL_ASSIGN_OR_RETURN(Inputs in, PrepareInputs(batch));
  std::vector<std::vector<int64_t>> plan;
  if (options_.max_tokens_per_micro_batch <= 0) {
    for (int64_t b = 0; b < in.rows; b += options_.micro_batch_size) {
      std::vector<int64_t> idx(std::min(options_.micro_batch_size, in.rows - b));
      std::iota(idx.begin(), idx.end(), b);
      plan.push_back(std::move(idx));
    }
    return plan;
  }
  const at::Tensor lengths = in.attention_mask.ne(0).sum(1);
  std::vector<int64_t> len(in.rows);
  for (int64_t b = 0; b < in.rows; ++b) len[b] = lengths[b].item<int64_t>();
  std::vector<int64_t> order(in.rows);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return len[a] > len[b]; });
  // First-fit decreasing: few micro-batches, each close to the budget.
  std::vector<int64_t> used;
  for (int64_t b : order) {
    size_t bin = 0;
    while (bin < plan.size() && used[bin] + len[b] > options_.max_tokens_per_micro_batch) ++bin;
    if (bin == plan.size()) {
      plan.emplace_back();
      used.push_back(0);
    }
    plan[bin].push_back(b);
    used[bin] += len[b];
  }
  for (auto& idx : plan) std::sort(idx.begin(), idx.end());
  std::sort(plan.begin(), plan.end());
  return plan;
}

absl::StatusOr<TrainStepResult> TrainStrategy::TrainStep(const Batch& batch, const LossFn& loss_fn,
                                                         const ForwardSpec& spec) {
  auto result = Guarded("TrainStep", [&] { return TrainStepImpl(batch, loss_fn, spec); });
  ClearGrads(mode_->trained());
  return result;
}

absl::StatusOr<TrainStepResult> TrainStrategy::TrainStepImpl(const Batch& batch,
                                                             const LossFn& loss_fn,
                                                             const ForwardSpec& spec) {
  if (!loss_fn) return absl::InvalidArgumentError("TrainStep: no loss function");
  ROLL_RETURN_IF_ERROR(CheckSpec(*model_, spec));
  ROLL_ASSIGN_OR_RETURN(Inputs in, PrepareInputs(batch));
  ROLL_ASSIGN_OR_RETURN(auto plan, PlanMicroBatches(batch));

  // Step-wide counts first: every micro-batch's loss is normalized by them.
  at::Tensor counts = torch::tensor(
      {in.loss_mask.sum().item<double>(), static_cast<double>(in.rows), in.rows == 0 ? 1.0 : 0.0},
      at::kDouble);
  if (distributed()) ROLL_RETURN_IF_ERROR(Annotate(communicator_->AllReduce(counts, ReduceOp::kSum), "TrainStep: reducing token counts"));
  if (counts[2].item<double>() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TrainStep: ", static_cast<int64_t>(counts[2].item<double>()), " rank(s) got an empty batch"));
  }
  const int64_t global_tokens = static_cast<int64_t>(std::llround(counts[0].item<double>()));
  const int64_t global_sequences = static_cast<int64_t>(std::llround(counts[1].item<double>()));

  const c10::Device device = model_->device();
  ClearGrads(mode_->trained());
  int64_t rounds = static_cast<int64_t>(plan.size());
  mode_->BeginPass();
  if (mode_->collective_micro_batches()) {
    ROLL_ASSIGN_OR_RETURN(rounds, AgreeOnShardedMicroBatches(communicator_, in, rounds,
                                                             model_->config().vocab_size, "TrainStep"));
  }
  double loss_sum = 0;
  std::map<std::string, double> metric_sums;
  // A rank with fewer micro-batches than another runs empty ones: its first
  // micro-batch again with the loss times 0, so the gathers and
  // reduce-scatters of its units still meet the other ranks'.
  for (int64_t extra = static_cast<int64_t>(plan.size()); extra < rounds; ++extra) {
    const at::Tensor index = torch::tensor(plan[0], at::kLong);
    const at::Tensor pos =
        in.position_ids.defined() ? in.position_ids.index_select(0, index).to(device) : at::Tensor();
    ROLL_ASSIGN_OR_RETURN(ModelOutputs out, RunModel(0, in.input_ids.index_select(0, index).to(device),
                                                     in.attention_mask.index_select(0, index).to(device), pos,
                                                     in.loss_mask.index_select(0, index).to(device), spec));
    at::Tensor zero;
    for (const at::Tensor* t : {&out.log_probs, &out.entropy, &out.values}) {
      if (t->defined()) zero = zero.defined() ? zero + t->sum() * 0.0 : t->sum() * 0.0;
    }
    // The loss check every real micro-batch makes (below), answered "fine".
    ROLL_ASSIGN_OR_RETURN(const bool all_ok, EveryRankOk(communicator_, true, "TrainStep: checking the losses"));
    if (!all_ok) {
      return absl::AbortedError("TrainStep: another rank's loss function failed; this step made no update");
    }
    zero.backward();
  }
  // With sharding every micro-batch's backward issues collectives: a loss
  // that fails on one rank is told to all before anyone starts it, so the
  // step fails everywhere at once instead of at the group's timeout.
  const bool agree_on_losses = mode_->collective_micro_batches() && distributed();
  for (size_t i = 0; i < plan.size(); ++i) {
    const std::string where = absl::StrCat("micro-batch ", i, " of ", plan.size());
    const at::Tensor index = torch::tensor(plan[i], at::kLong);
    MicroBatch mb;
    ROLL_ASSIGN_OR_RETURN(mb.data, batch.Select(plan[i]));
    for (auto& [name, t] : mb.data.tensors()) t = t.to(device);
    mb.loss_mask = in.loss_mask.index_select(0, index).to(device);
    mb.global_loss_tokens = global_tokens;
    mb.global_sequences = global_sequences;
    mb.index = static_cast<int>(i);
    mb.count = static_cast<int>(plan.size());
    const at::Tensor ids = in.input_ids.index_select(0, index).to(device);
    const at::Tensor mask = in.attention_mask.index_select(0, index).to(device);
    const at::Tensor pos =
        in.position_ids.defined() ? in.position_ids.index_select(0, index).to(device) : at::Tensor();
    // With tensor parallelism every slice computes the same loss from the
    // same gathered logits; slice 0's is the step's. The losses are checked
    // on every copy before any starts its backward (whose collectives would
    // otherwise wait for a copy that failed).
    std::vector<absl::StatusOr<LossOutput>> losses(mode_->copies());
    ROLL_RETURN_IF_ERROR(mode_->RunOnCopies([&](int c) -> absl::Status {
      losses[c] = LossOfMicroBatch(c, loss_fn, mb, ids, mask, pos, spec, where, agree_on_losses);
      return losses[c].status();
    }));
    ROLL_RETURN_IF_ERROR(mode_->RunOnCopies([&](int c) { return Backward(*losses[c], where); }));
    const absl::StatusOr<LossOutput>& loss = losses[0];
    const at::Tensor& l = loss->loss;
    loss_sum += l.item<double>();
    for (const auto& [k, v] : loss->metrics) metric_sums[k] += v;
  }

  // A parameter no micro-batch reached still takes part in the reduction,
  // so every rank sends the same buckets.
  {
    torch::NoGradGuard no_grad;
    for (const at::Tensor& p : mode_->trained()) {
      if (!p.grad().defined()) {
        at::Tensor q = p;
        q.mutable_grad() = at::zeros_like(p);
      }
    }
  }
  ROLL_ASSIGN_OR_RETURN(const strategies_internal::GradientReduction reduced,
                        mode_->ReduceGradients(options_.max_grad_norm));
  const double grad_norm = reduced.grad_norm;
  const double lr = schedule_.LrAt(step_);
  const bool skip = !std::isfinite(grad_norm);
  if (!skip) {
    ROLL_RETURN_IF_ERROR(optimizer_->Step(lr));
    ++step_;
  }
  ClearGrads(mode_->trained());

  if (distributed()) {
    // Metric keys must agree across ranks before their values are summed
    // position by position.
    std::string keys = absl::StrJoin(metric_sums, ",", [](std::string* out, const auto& kv) { out->append(kv.first); });
    const double fp = static_cast<double>(std::hash<std::string>{}(keys) >> 12);
    at::Tensor check = torch::tensor({fp, -fp}, at::kDouble);
    ROLL_RETURN_IF_ERROR(Annotate(communicator_->AllReduce(check, ReduceOp::kMax), "TrainStep: checking metric names"));
    if (check[0].item<double>() != -check[1].item<double>()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "TrainStep: the loss function returned different metric names on different ranks (here: ",
          keys.empty() ? "none" : keys, ")"));
    }
    std::vector<double> values = {loss_sum};
    for (const auto& [k, v] : metric_sums) values.push_back(v);
    at::Tensor sums = torch::tensor(values, at::kDouble);
    ROLL_RETURN_IF_ERROR(Annotate(communicator_->AllReduce(sums, ReduceOp::kSum), "TrainStep: reducing metrics"));
    loss_sum = sums[0].item<double>();
    int64_t j = 1;
    for (auto& [k, v] : metric_sums) v = sums[j++].item<double>();
  }

  TrainStepResult result;
  result.metrics = std::move(metric_sums);
  result.metrics["loss"] = loss_sum;
  result.metrics["grad_norm"] = grad_norm;
  result.metrics["lr"] = lr;
  result.metrics["tokens"] = static_cast<double>(global_tokens);
  result.metrics["sequences"] = static_cast<double>(global_sequences);
  result.metrics["micro_batches"] = static_cast<double>(plan.size());
  result.metrics["skipped"] = skip ? 1.0 : 0.0;
  result.metrics["comm_bytes"] = static_cast<double>(reduced.comm_bytes);
  mode_->AddStepMetrics(&result.metrics);
  return result;
}

absl::StatusOr<LossOutput> TrainStrategy::LossOfMicroBatch(int copy, const LossFn& loss_fn, const MicroBatch& mb,
                                                            const at::Tensor& ids, const at::Tensor& mask,
                                                            const at::Tensor& pos, const ForwardSpec& spec,
                                                            const std::string& where, bool agree_on_losses) {
  auto outputs = RunModel(copy, ids, mask, pos, mb.loss_mask, spec);
  if (!outputs.ok()) return Annotate(outputs.status(), where);
  absl::StatusOr<LossOutput> loss;
  try {
    loss = loss_fn(*outputs, mb);
  } catch (const c10::Error& e) {
    loss = absl::InternalError(e.what_without_backtrace());
  } catch (const std::exception& e) {
    loss = absl::InternalError(e.what());
  }
  absl::Status checked;
  if (!loss.ok()) {
    checked = Annotate(loss.status(), absl::StrCat("loss function, ", where));
  } else if (!loss->loss.defined() || loss->loss.numel() != 1 || !loss->loss.is_floating_point()) {
    checked = absl::InvalidArgumentError(
        absl::StrCat("loss function, ", where, ": the loss must be a floating-point scalar"));
  } else if (!loss->loss.requires_grad()) {
    checked = absl::InvalidArgumentError(absl::StrCat(
        "loss function, ", where, ": the loss does not depend on the model outputs"));
  }
  if (agree_on_losses) {
    ROLL_ASSIGN_OR_RETURN(const bool all_ok,
                          EveryRankOk(communicator_, checked.ok(), "TrainStep: checking the losses"));
    if (checked.ok() && !all_ok) {
      return absl::AbortedError(absl::StrCat(
          "TrainStep: another rank's loss function failed in its ", where, "; this step made no update"));
    }
  }
  ROLL_RETURN_IF_ERROR(checked);
  return loss;
}

absl::Status TrainStrategy::Backward(const LossOutput& loss, const std::string& where) {
  try {
    loss.loss.reshape({}).backward();
  } catch (const std::exception& e) {
    // A collective inside autograd failed (a sharded unit's).
    absl::Status cause = mode_->TakeBackwardError();
    if (!cause.ok()) return Annotate(cause, absl::StrCat("backward, ", where));
    throw;
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelOutputs> TrainStrategy::Forward(const Batch& batch, const ForwardSpec& spec) {
  return Guarded("Forward", [&] { return ForwardImpl(batch, spec); });
}

absl::StatusOr<ModelOutputs> TrainStrategy::ForwardImpl(const Batch& batch, const ForwardSpec& spec) {
  ROLL_RETURN_IF_ERROR(CheckSpec(*model_, spec));
  ROLL_ASSIGN_OR_RETURN(Inputs in, PrepareInputs(batch));
  ROLL_ASSIGN_OR_RETURN(auto plan, PlanMicroBatches(batch));
  torch::NoGradGuard no_grad;
  const c10::Device device = model_->device();
  ModelOutputs full;
  auto place = [&](at::Tensor* dst, const at::Tensor& part, const at::Tensor& index) {
    if (!part.defined()) return;
    if (!dst->defined()) dst->operator=(at::zeros({in.rows, in.cols - 1}, part.options()));
    dst->index_copy_(0, index.to(part.device()), part);
  };
  mode_->BeginPass();
  if (mode_->collective_micro_batches()) {
    ROLL_ASSIGN_OR_RETURN(const int64_t rounds,
                          AgreeOnShardedMicroBatches(communicator_, in, static_cast<int64_t>(plan.size()),
                                                     model_->config().vocab_size, "Forward"));
    // Empty rounds (see TrainStepImpl): a one-row dummy when this rank has
    // no rows at all.
    for (int64_t extra = static_cast<int64_t>(plan.size()); extra < rounds; ++extra) {
      const at::Tensor ids = plan.empty() ? at::zeros({1, std::max<int64_t>(in.cols, 2)}, at::kLong)
                                          : in.input_ids.index_select(0, torch::tensor(plan[0], at::kLong));
      ROLL_RETURN_IF_ERROR(mode_->Run(0, ids.to(device), at::Tensor(), at::Tensor(), spec.log_probs || spec.entropy,
                                      spec.values)
                               .status());
    }
  }
  for (size_t i = 0; i < plan.size(); ++i) {
    const at::Tensor index = torch::tensor(plan[i], at::kLong);
    const at::Tensor pos =
        in.position_ids.defined() ? in.position_ids.index_select(0, index).to(device) : at::Tensor();
    const at::Tensor ids = in.input_ids.index_select(0, index).to(device);
    const at::Tensor mask = in.attention_mask.index_select(0, index).to(device);
    const at::Tensor loss_mask = in.loss_mask.index_select(0, index).to(device);
    absl::StatusOr<ModelOutputs> out;
    const absl::Status all = mode_->RunOnCopies([&](int c) -> absl::Status {
      auto o = RunModel(c, ids, mask, pos, loss_mask, spec);
      if (c == 0) out = o;  // copy 0 runs on this thread
      return o.status();
    });
    if (!all.ok()) out = all;
    if (!out.ok()) return Annotate(out.status(), absl::StrCat("micro-batch ", i, " of ", plan.size()));
    place(&full.log_probs, out->log_probs, index);
    place(&full.entropy, out->entropy, index);
    place(&full.values, out->values, index);
  }
  // An empty batch still yields [0, T-1] tensors for what was asked.
  const auto zeros = [&] { return at::zeros({in.rows, in.cols - 1}, at::TensorOptions().dtype(at::kFloat).device(device)); };
  if ((spec.log_probs && !full.log_probs.defined())) full.log_probs = zeros();
  if ((spec.entropy && !full.entropy.defined())) full.entropy = zeros();
  if ((spec.values && !full.values.defined())) full.values = zeros();
  return full;
}

std::vector<at::Tensor> TrainStrategy::StateTensors() const {
  std::vector<at::Tensor> out = mode_->ParameterTensors();
  for (const auto& [name, t] : optimizer_->StateDict()) out.push_back(t);
  return out;
}

}  // namespace roll
