// `roll bench train`: training throughput of the TrainStrategy on this
// machine, next to the machine's own GEMM rate measured in the same process.
//
//   roll bench train [--model DIR | --layers L --hidden H --heads N
//                     --kv-heads K --intermediate I --vocab V]
//                    [--batch B] [--seq-len T] [--steps S] [--warmup-steps W]
//                    [--micro-batch M] [--threads N]
//
// Without --model a Qwen2-shaped model of the given shape is built with
// random weights (defaults: 4 layers, hidden 256, 4 heads, 2 KV heads,
// intermediate 704, vocab 8192). Each step is one TrainStep (SFT token-mean
// cross entropy over every token of a random [B, T] batch; AdamW; clipping
// at 1.0). The W warmup steps are not timed. Prints one JSON line.
//
// FLOPs are counted as 6 x parameters per trained token (forward 2, backward
// 4; attention score FLOPs and the optimizer are not counted), and
// gemm_fraction = achieved FLOP/s / at::mm(1024x1024 fp32) FLOP/s.
// gemm_fraction_non_embedding counts 6 x (parameters - input embedding)
// instead, since the embedding lookup does no matrix product.

#include <torch/torch.h>

#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "cli/cli.h"
#include "roll/common/cli_args.h"
#include "roll/models/hf_config.h"
#include "roll/models/transformer.h"
#include "roll/strategies/train_strategy.h"

namespace roll {
namespace {

using Clock = std::chrono::steady_clock;

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}


absl::StatusOr<std::string> RunTrainBench(const CliArgs& flags) {
  auto get = [&](const char* name, int64_t fallback, int64_t min) -> absl::StatusOr<int64_t> {
    ROLL_ASSIGN_OR_RETURN(int64_t v, flags.GetInt(name, fallback));
    if (v < min) return absl::InvalidArgumentError(absl::StrCat("--", name, " must be >= ", min, ", got ", v));
    return v;
  };
  const int64_t hw = std::max<int64_t>(1, std::thread::hardware_concurrency());
  ROLL_ASSIGN_OR_RETURN(int64_t threads, get("threads", hw, 1));
  ROLL_ASSIGN_OR_RETURN(int64_t batch, get("batch", 8, 1));
  ROLL_ASSIGN_OR_RETURN(int64_t seq_len, get("seq-len", 256, 2));
  ROLL_ASSIGN_OR_RETURN(int64_t steps, get("steps", 5, 1));
  ROLL_ASSIGN_OR_RETURN(int64_t warmup, get("warmup-steps", 1, 0));
  ROLL_ASSIGN_OR_RETURN(int64_t micro, get("micro-batch", batch, 1));
  at::set_num_threads(static_cast<int>(threads));

  std::unique_ptr<CausalLM> model;
  std::string source = "random";
  if (flags.Has("model")) {
    for (const char* shape_flag : {"layers", "hidden", "heads", "kv-heads", "intermediate", "vocab"}) {
      if (flags.Has(shape_flag)) {
        return absl::InvalidArgumentError(absl::StrCat("--", shape_flag, " cannot be combined with --model"));
      }
    }
    source = flags.Get("model");
    ROLL_ASSIGN_OR_RETURN(model, CausalLM::FromPretrained(source));
  } else {
    ModelConfig c;
    c.model_type = "qwen2";
    ROLL_ASSIGN_OR_RETURN(c.num_hidden_layers, get("layers", 4, 1));
    ROLL_ASSIGN_OR_RETURN(c.hidden_size, get("hidden", 256, 1));
    ROLL_ASSIGN_OR_RETURN(c.num_attention_heads, get("heads", 4, 1));
    ROLL_ASSIGN_OR_RETURN(c.num_key_value_heads, get("kv-heads", 2, 1));
    ROLL_ASSIGN_OR_RETURN(c.intermediate_size, get("intermediate", 704, 1));
    ROLL_ASSIGN_OR_RETURN(c.vocab_size, get("vocab", 8192, 2));
    if (c.hidden_size % c.num_attention_heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat("--hidden (", c.hidden_size,
                                                     ") must be a multiple of --heads (",
                                                     c.num_attention_heads, ")"));
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
    c.max_position_embeddings = std::max<int64_t>(seq_len, 32768);
    c.attention_bias = true;
    ROLL_RETURN_IF_ERROR(Annotate(c.Validate("bench model"), "--layers/--hidden/--heads/..."));
    ROLL_ASSIGN_OR_RETURN(model, CausalLM::Random(c, /*seed=*/1));
  }
  const ModelConfig config = model->config();
  const int64_t params = model->NumParameters();
  // The input embedding is a lookup, not a matmul (unless tied to the LM head).
  const int64_t embedding = config.tie_word_embeddings ? 0 : config.vocab_size * config.hidden_size;

  TrainStrategyOptions o;
  o.lr.base_lr = 1e-4;
  o.micro_batch_size = micro;
  ROLL_ASSIGN_OR_RETURN(auto strategy, TrainStrategy::Create(std::move(model), o));

  Batch data;
  data.SetTensor("input_ids", at::randint(0, config.vocab_size, {batch, seq_len}, at::kLong));
  const LossFn loss = [](const ModelOutputs& out, const MicroBatch& mb) -> absl::StatusOr<LossOutput> {
    return LossOutput{TokenMeanLoss(-out.log_probs, mb), {}};
  };
  double loss_first = 0, loss_last = 0;
  for (int64_t i = 0; i < warmup; ++i) {
    ROLL_ASSIGN_OR_RETURN(TrainStepResult r, strategy->TrainStep(data, loss));
    if (i == 0) loss_first = r.metrics.at("loss");
  }
  const auto start = Clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    ROLL_ASSIGN_OR_RETURN(TrainStepResult r, strategy->TrainStep(data, loss));
    if (warmup == 0 && i == 0) loss_first = r.metrics.at("loss");
    loss_last = r.metrics.at("loss");
  }
  const double elapsed = Seconds(start);
  const double gemm = MeasureGemmGflops() * 1e9;
  const BlasInfo blas = LoadedBlas();

  const double tokens_per_s = static_cast<double>(batch * seq_len * steps) / elapsed;
  const double train_flops = 6.0 * static_cast<double>(params) * tokens_per_s;
  const double matmul_flops = 6.0 * static_cast<double>(params - embedding) * tokens_per_s;
  return absl::StrFormat(
      R"({"bench": "train", "model": "%s", "params": %d, "layers": %d, "hidden": %d, )"
      R"("intermediate": %d, "heads": %d, "kv_heads": %d, "vocab": %d, "batch": %d, )"
      R"("seq_len": %d, "micro_batch": %d, "steps": %d, "warmup_steps": %d, "threads": %d, )"
      R"("step_s": %.4f, "tokens_per_s": %.1f, "train_gflops": %.2f, "gemm_gflops": %.2f, )"
      R"("gemm_fraction": %.4f, "non_embedding_params": %d, "gemm_fraction_non_embedding": %.4f, )"
      R"("loss_first": %.4f, "loss_last": %.4f, "blas_threading": "%s", "blas_threads": %d})",
      JsonEscape(source), params, config.num_hidden_layers, config.hidden_size, config.intermediate_size,
      config.num_attention_heads, config.num_key_value_heads, config.vocab_size, batch, seq_len,
      micro, steps, warmup, at::get_num_threads(), elapsed / steps, tokens_per_s, train_flops / 1e9,
      gemm / 1e9, train_flops / gemm, params - embedding, matmul_flops / gemm, loss_first,
      loss_last, blas.threading, blas.threads);
}

}  // namespace

int BenchTrainCommand(const std::vector<std::string>& args) {
  auto flags = CliArgs::Parse(args,
                              {"model", "layers", "hidden", "heads", "kv-heads", "intermediate",
                               "vocab", "batch", "seq-len", "steps", "warmup-steps", "micro-batch",
                               "threads"},
                              {});
  if (!flags.ok()) return CliFail(flags.status());
  absl::StatusOr<std::string> json;
  try {
    json = RunTrainBench(*flags);
  } catch (const c10::Error& e) {
    json = absl::InternalError(absl::StrCat("bench train: ", e.what_without_backtrace()));
  }
  if (!json.ok()) return CliFail(Annotate(json.status(), "bench train"));
  std::cout << *json << std::endl;
  return 0;
}

}  // namespace roll
