// `roll bench train`: training throughput of the TrainStrategy on this
// machine, next to the machine's own GEMM rate measured in the same process.
//
//   roll bench train [--model DIR | --layers L --hidden H --heads N
//                     --kv-heads K --intermediate I --vocab V]
//                    [--batch B] [--seq-len T] [--steps S] [--warmup-steps W]
//                    [--micro-batch M] [--threads N] [--sharded [--ranks R]]
//                    [--tensor-parallel P]
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
//
// --tensor-parallel P: after the unsplit model, the same model split into P
// tensor-parallel slices (an in-process Gloo group, one thread each)
// trains on the same batch; the JSON adds its tokens/s, the ratio to the
// unsplit figure, and the parameter + AdamW state bytes the split holds per
// slice against the unsplit model's.
//
// --sharded: R ranks (default 2) as R processes over Gloo, first
// replicated (DDP), then fully sharded, each rank training on its own B
// rows. Each rank counts the bytes LibTorch allocates on the CPU: state
// bytes after the strategy is built (parameters + optimizer state, no
// gradients), and the peak during the timed steps (everything: gradients,
// activations, gathered layers). One JSON line with both modes side by
// side, the measured bytes and the computed ones (the largest unit's
// parameters is what one gathered layer costs).
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <c10/core/CPUAllocator.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "cli/cli.h"
#include "common/spawn.h"
#include "roll/common/cli_args.h"
#include "roll/models/hf_config.h"
#include "roll/models/transformer.h"
#include "roll/scheduler/device_mapping.h"
#include "roll/strategies/communicator.h"
#include "roll/strategies/sharding.h"
#include "roll/strategies/tensor_parallel.h"
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

constexpr char kStoreTokenEnv[] = "ROLL_BENCH_STORE_TOKEN";

// Counts the bytes of every CPU allocation LibTorch makes through its
// allocator (tensors, their storages): what is alive now and the peak.
class CountingAllocator final : public at::Allocator {
 public:
  explicit CountingAllocator(at::Allocator* base) : base_(base) {}

  at::DataPtr allocate(size_t n) override {
    at::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    const int64_t now = live_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    auto* ctx = new Context{std::move(inner), static_cast<int64_t>(n), this};
    return {data, ctx, &Delete, at::Device(at::kCPU)};
  }
  at::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  int64_t live() const { return live_.load(); }
  int64_t peak() const { return peak_.load(); }
  void ResetPeak() { peak_.store(live_.load()); }

 private:
  struct Context {
    at::DataPtr inner;
    int64_t bytes;
    const CountingAllocator* owner;
  };
  static void Delete(void* p) {
    auto* c = static_cast<Context*>(p);
    c->owner->live_.fetch_sub(c->bytes);
    delete c;
  }

  at::Allocator* base_;
  mutable std::atomic<int64_t> live_{0}, peak_{0};
};

// Parameters of the largest sharding unit (the embeddings, one decoder
// layer, or the head): what gathering one unit costs.
absl::StatusOr<int64_t> LargestUnitParameters(const CausalLM& model) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto& [name, p] : model.NamedParametersOrdered()) shapes.emplace_back(name, p.sizes().vec());
  ROLL_ASSIGN_OR_RETURN(ShardLayout layout, ShardLayout::Create(shapes, 1));
  int64_t largest = 0;
  for (const ShardUnitLayout& u : layout.units()) largest = std::max(largest, u.numel);
  return largest;
}

absl::StatusOr<int64_t> FlagAtLeast(const CliArgs& flags, const char* name, int64_t fallback,
                                    int64_t min) {
  ROLL_ASSIGN_OR_RETURN(int64_t v, flags.GetInt(name, fallback));
  if (v < min) return absl::InvalidArgumentError(absl::StrCat("--", name, " must be >= ", min, ", got ", v));
  return v;
}

// The model of --model or of the shape flags.
absl::StatusOr<std::unique_ptr<CausalLM>> BenchModel(const CliArgs& flags, int64_t seq_len,
                                                     std::string* source) {
  auto get = [&](const char* name, int64_t fallback, int64_t min) {
    return FlagAtLeast(flags, name, fallback, min);
  };
  *source = "random";
  if (flags.Has("model")) {
    for (const char* shape_flag : {"layers", "hidden", "heads", "kv-heads", "intermediate", "vocab"}) {
      if (flags.Has(shape_flag)) {
        return absl::InvalidArgumentError(absl::StrCat("--", shape_flag, " cannot be combined with --model"));
      }
    }
    *source = flags.Get("model");
    return CausalLM::FromPretrained(*source);
  }
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
  return CausalLM::Random(c, /*seed=*/1);
}

const LossFn& BenchLoss() {
  static const LossFn* loss = new LossFn(
      [](const ModelOutputs& out, const MicroBatch& mb) -> absl::StatusOr<LossOutput> {
        return LossOutput{TokenMeanLoss(-out.log_probs, mb), {}};
      });
  return *loss;
}

absl::StatusOr<std::string> RunTrainBench(const CliArgs& flags) {
  auto get = [&](const char* name, int64_t fallback, int64_t min) {
    return FlagAtLeast(flags, name, fallback, min);
  };
  const int64_t hw = HostCores();
  ROLL_ASSIGN_OR_RETURN(int64_t threads, get("threads", hw, 1));
  ROLL_ASSIGN_OR_RETURN(int64_t batch, get("batch", 8, 1));
  ROLL_ASSIGN_OR_RETURN(int64_t seq_len, get("seq-len", 256, 2));
  ROLL_ASSIGN_OR_RETURN(int64_t steps, get("steps", 5, 1));
  ROLL_ASSIGN_OR_RETURN(int64_t warmup, get("warmup-steps", 1, 0));
  ROLL_ASSIGN_OR_RETURN(int64_t micro, get("micro-batch", batch, 1));
  at::set_num_threads(static_cast<int>(threads));

  std::string source;
  ROLL_ASSIGN_OR_RETURN(std::unique_ptr<CausalLM> model, BenchModel(flags, seq_len, &source));
  const ModelConfig config = model->config();
  const int64_t params = model->NumParameters();
  // The input embedding is a lookup, not a matmul (unless tied to the LM head).
  const int64_t embedding = config.tie_word_embeddings ? 0 : config.vocab_size * config.hidden_size;

  ROLL_ASSIGN_OR_RETURN(int64_t tp, get("tensor-parallel", 1, 1));

  TrainStrategyOptions o;
  o.lr.base_lr = 1e-4;
  o.micro_batch_size = micro;
  // The split model starts from the same weights.
  std::unique_ptr<CausalLM> split_model;
  if (tp > 1) {
    ROLL_ASSIGN_OR_RETURN(split_model, BenchModel(flags, seq_len, &source));
  }
  ROLL_ASSIGN_OR_RETURN(auto strategy, TrainStrategy::Create(std::move(model), o));

  Batch data;
  data.SetTensor("input_ids", at::randint(0, config.vocab_size, {batch, seq_len}, at::kLong));
  const LossFn& loss = BenchLoss();
  double loss_first = 0, loss_last = 0;
  // Seconds for `steps` timed steps after the warm-up.
  auto run = [&](TrainStrategy& s) -> absl::StatusOr<double> {
    for (int64_t i = 0; i < warmup; ++i) {
      ROLL_ASSIGN_OR_RETURN(TrainStepResult r, s.TrainStep(data, loss));
      if (i == 0) loss_first = r.metrics.at("loss");
    }
    const auto start = Clock::now();
    for (int64_t i = 0; i < steps; ++i) {
      ROLL_ASSIGN_OR_RETURN(TrainStepResult r, s.TrainStep(data, loss));
      if (warmup == 0 && i == 0) loss_first = r.metrics.at("loss");
      loss_last = r.metrics.at("loss");
    }
    return Seconds(start);
  };
  ROLL_ASSIGN_OR_RETURN(const double elapsed, run(*strategy));
  std::string split_json;
  if (tp > 1) {
    auto state_bytes = [](const TrainStrategy& s) {
      int64_t n = 0;
      for (const at::Tensor& t : s.StateTensors()) n += static_cast<int64_t>(t.nbytes());
      return n;
    };
    const int64_t whole_bytes = state_bytes(*strategy);
    strategy.reset();
    ROLL_ASSIGN_OR_RETURN(auto store, StoreServer::Start("127.0.0.1", 0));
    CommunicatorOptions base;
    base.store_port = store->port();
    base.store_token = store->token();
    base.group_name = "bench-train-tp";
    ROLL_ASSIGN_OR_RETURN(auto group, TensorParallelGroup::Create(*split_model, static_cast<int>(tp), base));
    ROLL_ASSIGN_OR_RETURN(auto split, TrainStrategy::Create(std::move(split_model), o, nullptr, std::move(group)));
    const double unsplit_loss_first = loss_first, unsplit_loss_last = loss_last;
    ROLL_ASSIGN_OR_RETURN(const double split_elapsed, run(*split));
    const double split_tokens_per_s = static_cast<double>(batch * seq_len * steps) / split_elapsed;
    const double per_slice = static_cast<double>(state_bytes(*split)) / static_cast<double>(tp);
    split_json = absl::StrFormat(
        R"(, "tensor_parallel": %d, "tp_step_s": %.4f, "tp_tokens_per_s": %.1f, "tp_speed_ratio": %.4f, )"
        R"("state_bytes_unsplit": %d, "tp_state_bytes_per_slice": %.0f, "tp_state_ratio": %.4f, )"
        R"("tp_loss_last": %.4f)",
        tp, split_elapsed / steps, split_tokens_per_s,
        split_tokens_per_s / (static_cast<double>(batch * seq_len * steps) / elapsed), whole_bytes, per_slice,
        per_slice / static_cast<double>(whole_bytes), loss_last);
    loss_first = unsplit_loss_first;
    loss_last = unsplit_loss_last;
  }
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
      R"("loss_first": %.4f, "loss_last": %.4f, "blas": "%s", "blas_threading": "%s", "blas_threads": %d%s})",
      JsonEscape(source), params, config.num_hidden_layers, config.hidden_size, config.intermediate_size,
      config.num_attention_heads, config.num_key_value_heads, config.vocab_size, batch, seq_len,
      micro, steps, warmup, at::get_num_threads(), elapsed / steps, tokens_per_s, train_flops / 1e9,
      gemm / 1e9, train_flops / gemm, params - embedding, matmul_flops / gemm, loss_first,
      loss_last, blas.library, blas.threading, blas.threads, split_json);
}

// One rank of --sharded (a child process): builds the model and the
// strategy of --mode under the counting allocator, trains, prints JSON.
absl::StatusOr<std::string> RunRank(const CliArgs& flags) {
  static auto* counter = new CountingAllocator(c10::GetCPUAllocator());
  c10::SetCPUAllocator(counter, /*priority=*/100);
  auto get = [&](const char* name, int64_t fallback, int64_t min) {
    return FlagAtLeast(flags, name, fallback, min);
  };
  ROLL_ASSIGN_OR_RETURN(int64_t threads, get("threads", 1, 1));
  ROLL_ASSIGN_OR_RETURN(int64_t batch, get("batch", 8, 1));
  ROLL_ASSIGN_OR_RETURN(int64_t seq_len, get("seq-len", 256, 2));
  ROLL_ASSIGN_OR_RETURN(int64_t steps, get("steps", 5, 1));
  ROLL_ASSIGN_OR_RETURN(int64_t warmup, get("warmup-steps", 1, 0));
  ROLL_ASSIGN_OR_RETURN(int64_t micro, get("micro-batch", batch, 1));
  ROLL_ASSIGN_OR_RETURN(int64_t rank, get("rank", 0, 0));
  ROLL_ASSIGN_OR_RETURN(int64_t world, get("ranks", 2, 1));
  ROLL_ASSIGN_OR_RETURN(int64_t port, get("store-port", 0, 1));
  const bool sharded = flags.Get("mode") == "sharded";
  at::set_num_threads(static_cast<int>(threads));

  CommunicatorOptions co;
  co.store_port = static_cast<int>(port);
  const char* token = std::getenv(kStoreTokenEnv);
  co.store_token = token == nullptr ? "" : token;
  co.group_name = absl::StrCat("bench_train_", flags.Get("mode"));
  co.rank = static_cast<int>(rank);
  co.world_size = static_cast<int>(world);
  co.timeout = std::chrono::seconds(300);
  ROLL_ASSIGN_OR_RETURN(auto comm, CreateCommunicator(co));

  const int64_t base = counter->live();
  std::string source;
  ROLL_ASSIGN_OR_RETURN(std::unique_ptr<CausalLM> model, BenchModel(flags, seq_len, &source));
  const ModelConfig config = model->config();
  const int64_t params = model->NumParameters();
  ROLL_ASSIGN_OR_RETURN(const int64_t largest_unit, LargestUnitParameters(*model));
  const int64_t element = static_cast<int64_t>(c10::elementSize(model->dtype()));
  TrainStrategyOptions o;
  o.lr.base_lr = 1e-4;
  o.micro_batch_size = micro;
  o.fully_sharded = sharded;
  ROLL_ASSIGN_OR_RETURN(auto strategy, TrainStrategy::Create(std::move(model), o, comm.get()));
  const int64_t state_bytes = counter->live() - base;
  int64_t computed_state = 0, computed_params = 0;
  for (const at::Tensor& t : strategy->StateTensors()) computed_state += static_cast<int64_t>(t.nbytes());
  computed_params = sharded ? (computed_state / 3) : params * element;

  Batch data;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(rank + 1));
  data.SetTensor("input_ids", at::randint(0, config.vocab_size, {batch, seq_len}, gen, at::TensorOptions().dtype(at::kLong)));
  for (int64_t i = 0; i < warmup; ++i) ROLL_RETURN_IF_ERROR(strategy->TrainStep(data, BenchLoss()).status());
  ROLL_RETURN_IF_ERROR(comm->Barrier());
  counter->ResetPeak();
  const auto start = Clock::now();
  double loss = 0;
  for (int64_t i = 0; i < steps; ++i) {
    ROLL_ASSIGN_OR_RETURN(TrainStepResult r, strategy->TrainStep(data, BenchLoss()));
    loss = r.metrics.at("loss");
  }
  const double elapsed = Seconds(start);
  const int64_t peak_bytes = counter->peak() - base;
  nlohmann::json out = {
      {"rank", rank},
      {"elapsed_s", elapsed},
      {"state_bytes", state_bytes},
      {"peak_step_bytes", peak_bytes},
      {"computed_state_bytes", computed_state},
      {"computed_param_bytes", computed_params},
      {"computed_grad_bytes", computed_params},
      {"largest_unit_bytes", largest_unit * element},
      {"params", params},
      {"loss_last", loss},
  };
  return out.dump();
}

// --sharded: both modes, each as `ranks` child processes of this binary.
absl::StatusOr<std::string> RunShardedBench(const CliArgs& flags, const std::vector<std::string>& args) {
  auto get = [&](const char* name, int64_t fallback, int64_t min) {
    return FlagAtLeast(flags, name, fallback, min);
  };
  ROLL_ASSIGN_OR_RETURN(int64_t world, get("ranks", 2, 2));
  const int64_t hw = HostCores();
  ROLL_ASSIGN_OR_RETURN(int64_t threads, get("threads", std::max<int64_t>(1, hw / world), 1));
  ROLL_ASSIGN_OR_RETURN(int64_t batch, get("batch", 8, 1));
  ROLL_ASSIGN_OR_RETURN(int64_t seq_len, get("seq-len", 256, 2));
  ROLL_ASSIGN_OR_RETURN(int64_t steps, get("steps", 5, 1));
  ROLL_ASSIGN_OR_RETURN(auto store, StoreServer::Start("127.0.0.1", 0));
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return absl::InternalError("cannot find this executable (/proc/self/exe)");
  exe[n] = '\0';
  const std::filesystem::path logs =
      std::filesystem::temp_directory_path() / absl::StrCat("roll_bench_train_", getpid());
  std::filesystem::create_directories(logs);

  nlohmann::json result = {{"bench", "train_sharded"}, {"ranks", world}, {"batch_per_rank", batch},
                           {"seq_len", seq_len}, {"steps", steps}, {"threads_per_rank", threads}};
  for (const std::string mode : {"ddp", "sharded"}) {
    std::vector<pid_t> pids;
    std::vector<std::string> log_paths;
    for (int64_t r = 0; r < world; ++r) {
      common_internal::SpawnOptions so;
      so.argv = {exe, "bench", "train"};
      for (const std::string& a : args) {
        if (a != "--sharded") so.argv.push_back(a);
      }
      for (const std::string& extra : {absl::StrCat("--rank=", r), absl::StrCat("--ranks=", world),
                                       absl::StrCat("--store-port=", store->port()),
                                       absl::StrCat("--mode=", mode), absl::StrCat("--threads=", threads)}) {
        so.argv.push_back(extra);
      }
      so.env[kStoreTokenEnv] = store->token();
      so.log_path = (logs / absl::StrCat(mode, "_rank", r, ".log")).string();
      so.truncate_log = true;
      ROLL_ASSIGN_OR_RETURN(pid_t pid, common_internal::SpawnProcess(so));
      pids.push_back(pid);
      log_paths.push_back(so.log_path);
    }
    std::vector<nlohmann::json> ranks;
    absl::Status failed;
    for (size_t r = 0; r < pids.size(); ++r) {
      int status = 0;
      waitpid(pids[r], &status, 0);
      std::ifstream in(log_paths[r]);
      std::string line, last;
      while (std::getline(in, line)) {
        if (!line.empty()) last = line;
      }
      nlohmann::json j = nlohmann::json::parse(last, nullptr, false);
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || j.is_discarded()) {
        failed = absl::InternalError(absl::StrCat(mode, " rank ", r, " failed: ", last, " (log ", log_paths[r], ")"));
        continue;
      }
      ranks.push_back(j);
    }
    ROLL_RETURN_IF_ERROR(failed);
    double slowest = 0;
    int64_t state = 0, peak = 0;
    for (const auto& j : ranks) {
      slowest = std::max(slowest, j["elapsed_s"].get<double>());
      state = std::max(state, j["state_bytes"].get<int64_t>());
      peak = std::max(peak, j["peak_step_bytes"].get<int64_t>());
    }
    result[mode] = {
        {"tokens_per_s", static_cast<double>(world * batch * seq_len * steps) / slowest},
        {"step_s", slowest / static_cast<double>(steps)},
        {"state_bytes_per_rank", state},
        {"peak_step_bytes_per_rank", peak},
        {"computed_state_bytes_per_rank", ranks[0]["computed_state_bytes"]},
        {"computed_grad_bytes_per_rank", ranks[0]["computed_grad_bytes"]},
        {"loss_last", ranks[0]["loss_last"]},
    };
    result["params"] = ranks[0]["params"];
    result["largest_unit_bytes"] = ranks[0]["largest_unit_bytes"];
  }
  std::filesystem::remove_all(logs);
  const double ddp_state = result["ddp"]["state_bytes_per_rank"].get<double>();
  result["state_ratio"] = result["sharded"]["state_bytes_per_rank"].get<double>() / ddp_state;
  result["peak_ratio"] = result["sharded"]["peak_step_bytes_per_rank"].get<double>() /
                         result["ddp"]["peak_step_bytes_per_rank"].get<double>();
  result["speed_ratio"] = result["sharded"]["tokens_per_s"].get<double>() /
                          result["ddp"]["tokens_per_s"].get<double>();
  // The criterion: sharded parameters + gradients + optimizer state within
  // 1/N of the replicated figure plus one gathered unit.
  const double ddp_total = ddp_state + result["ddp"]["computed_grad_bytes_per_rank"].get<double>();
  const double sharded_total = result["sharded"]["state_bytes_per_rank"].get<double>() +
                               result["sharded"]["computed_grad_bytes_per_rank"].get<double>();
  result["sharded_state_and_grads_bytes"] = sharded_total;
  result["bound_bytes"] = ddp_total / static_cast<double>(world) + result["largest_unit_bytes"].get<double>();
  result["within_bound"] = sharded_total <= result["bound_bytes"].get<double>();
  return result.dump();
}

}  // namespace

int BenchTrainCommand(const std::vector<std::string>& args) {
  auto flags = CliArgs::Parse(args,
                              {"model", "layers", "hidden", "heads", "kv-heads", "intermediate",
                               "vocab", "batch", "seq-len", "steps", "warmup-steps", "micro-batch",
                               "threads", "ranks", "rank", "store-port", "mode", "tensor-parallel"},
                              {"sharded"});
  if (!flags.ok()) return CliFail(flags.status());
  absl::StatusOr<std::string> json;
  try {
    if (flags->Has("rank")) {
      json = RunRank(*flags);
    } else if (flags->Has("sharded") && flags->Has("tensor-parallel")) {
      json = absl::InvalidArgumentError("--sharded and --tensor-parallel are separate benches; give one");
    } else if (flags->Has("sharded")) {
      json = RunShardedBench(*flags, args);
    } else {
      json = RunTrainBench(*flags);
    }
  } catch (const c10::Error& e) {
    json = absl::InternalError(absl::StrCat("bench train: ", e.what_without_backtrace()));
  }
  if (!json.ok()) return CliFail(Annotate(json.status(), "bench train"));
  std::cout << *json << std::endl;
  return 0;
}

}  // namespace roll
