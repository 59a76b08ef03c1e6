// `roll sft CONFIG [key.path=value ...]`: supervised fine-tuning on the
// prompts of the config's `data` section, answers taken from their ground
// truths. Starts from sft.init_from, or from a fresh Qwen2-shaped model with
// a character tokenizer over the data's alphabet (how the quickstart makes
// its tiny base model). Writes a Hugging Face directory (config.json,
// model.safetensors, tokenizer.json) to sft.output_dir, atomically, and
// prints one JSON line: loss at the first and last step and greedy accuracy
// on the validation prompts before and after.

#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <random>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "cli/cli.h"
#include "roll/pipeline/rlvr.h"
#include "roll/common/cli_args.h"
#include "roll/common/config.h"
#include "roll/models/hf_config.h"
#include "roll/models/tokenizer.h"
#include "roll/models/transformer.h"
#include "roll/rewards/reward_function.h"
#include "roll/strategies/generation_engine.h"
#include "roll/strategies/train_strategy.h"

namespace roll {
namespace {

using Clock = std::chrono::steady_clock;

// A wrong answer for answer_noise: integers move by a nonzero offset; other
// answers stay (the noise only weakens arithmetic-like tasks).
std::string Corrupt(const std::string& answer, std::mt19937_64& rng) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(answer, &v)) return answer;
  std::uniform_int_distribution<int64_t> d(1, 9);
  const int64_t off = d(rng) * ((rng() & 1) ? 1 : -1);
  return std::to_string(v + off);
}

absl::StatusOr<Tokenizer> MakeTokenizer(const PipelineConfig& cfg, const PromptSets& data) {
  if (!cfg.sft.init_from.empty()) {
    const std::string path = (std::filesystem::path(cfg.sft.init_from) / "tokenizer.json").string();
    return Tokenizer::FromFile(path);
  }
  // Every character of the data, in a stable order, so the vocabulary is
  // the same for the same data.
  std::set<char32_t> seen;
  std::string alphabet = "0123456789-";
  for (char c : alphabet) seen.insert(static_cast<unsigned char>(c));
  for (const auto* set : {&data.train, &data.val}) {
    for (const PromptItem& p : *set) {
      for (const std::string* s : {&p.prompt, &p.ground_truth}) {
        for (unsigned char c : *s) {
          if (c >= 0x80) {
            return absl::InvalidArgumentError(
                "sft: a fresh model's character tokenizer covers ASCII text only; set sft.init_from "
                "to a model with its own tokenizer");
          }
          if (seen.insert(c).second) alphabet.push_back(static_cast<char>(c));
        }
      }
    }
  }
  CharTokenizerOptions o;
  o.alphabet = alphabet;
  return MakeCharTokenizer(o);
}

absl::StatusOr<std::unique_ptr<CausalLM>> MakeModel(const PipelineConfig& cfg, const Tokenizer& tok) {
  if (!cfg.sft.init_from.empty()) return CausalLM::FromPretrained(cfg.sft.init_from);
  const SftArgs& s = cfg.sft;
  ModelConfig c;
  c.model_type = "qwen2";
  c.num_hidden_layers = s.num_layers;
  c.hidden_size = s.hidden_size;
  c.num_attention_heads = s.num_attention_heads;
  c.num_key_value_heads = s.num_key_value_heads;
  c.intermediate_size = s.intermediate_size;
  c.vocab_size = tok.vocab_size();
  c.max_position_embeddings = std::max<int64_t>(512, cfg.prompt_length + cfg.response_length);
  c.tie_word_embeddings = true;
  c.attention_bias = true;
  if (tok.bos_id()) c.bos_token_id = *tok.bos_id();
  if (tok.eos_id()) c.eos_token_ids = {*tok.eos_id()};
  if (s.hidden_size % s.num_attention_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("sft.hidden_size (", s.hidden_size,
                                                   ") must be a multiple of sft.num_attention_heads (",
                                                   s.num_attention_heads, ")"));
  }
  c.head_dim = s.hidden_size / s.num_attention_heads;
  ROLL_RETURN_IF_ERROR(c.Validate("sft model"));
  return CausalLM::Random(c, static_cast<uint64_t>(cfg.seed));
}

// Greedy accuracy on the validation prompts, scored by the first reward
// domain's reward type.
absl::StatusOr<double> GreedyAccuracy(CausalLM& model, const Tokenizer& tok, const PipelineConfig& cfg,
                                      const std::vector<PromptItem>& val, RewardFunction& reward) {
  EngineOptions eo;
  eo.max_batch = 64;
  eo.max_len = cfg.prompt_length + cfg.response_length;
  eo.tokenizer = &tok;
  if (tok.eos_id()) eo.eos_token_ids = std::vector<int64_t>{*tok.eos_id()};
  ROLL_ASSIGN_OR_RETURN(auto engine, GenerationEngine::Create(&model, eo));
  std::map<RequestId, const PromptItem*> by_id;
  for (const PromptItem& p : val) {
    GenerationRequest r;
    for (int32_t id : tok.Encode(p.prompt)) r.prompt_ids.push_back(id);
    r.params.temperature = 0;
    r.params.max_new_tokens = std::min(cfg.response_length, cfg.actor_infer.generating_args.max_new_tokens);
    ROLL_ASSIGN_OR_RETURN(RequestId id, engine->Submit(std::move(r)));
    by_id[id] = &p;
  }
  ROLL_ASSIGN_OR_RETURN(auto results, engine->RunToCompletion());
  double correct = 0;
  for (const GenerationResult& r : results) {
    const PromptItem& p = *by_id.at(r.request_id);
    RewardInput in;
    in.response = r.text;
    in.ground_truth = p.ground_truth;
    in.tag = p.tag;
    ROLL_ASSIGN_OR_RETURN(RewardResult s, reward.Score(in));
    correct += s.score >= 1.0 - 1e-9;
  }
  model.ReleaseInferenceWeights();
  return val.empty() ? 0.0 : correct / static_cast<double>(val.size());
}

absl::StatusOr<std::string> RunSft(const PipelineConfig& cfg) {
  if (cfg.sft.output_dir.empty()) return absl::InvalidArgumentError("sft.output_dir is required");
  const auto t0 = Clock::now();
  at::manual_seed(static_cast<uint64_t>(cfg.seed));
  if (cfg.runtime.threads_per_worker > 0) at::set_num_threads(cfg.runtime.threads_per_worker);
  ROLL_ASSIGN_OR_RETURN(PromptSets data, LoadPromptSets(cfg));
  ROLL_ASSIGN_OR_RETURN(Tokenizer tok, MakeTokenizer(cfg, data));
  if (!tok.eos_id()) return absl::InvalidArgumentError("sft: the tokenizer has no EOS token");
  ROLL_ASSIGN_OR_RETURN(std::unique_ptr<CausalLM> model, MakeModel(cfg, tok));

  std::string reward_type = "math_rule";
  if (!cfg.rewards.empty() && !cfg.rewards.begin()->second.reward_type.empty()) {
    reward_type = cfg.rewards.begin()->second.reward_type;
  }
  ROLL_ASSIGN_OR_RETURN(std::unique_ptr<RewardFunction> reward, MakeRewardFunction(reward_type, ""));
  std::vector<PromptItem> val(data.val.begin(), data.val.begin() + std::min<size_t>(data.val.size(), 256));
  ROLL_ASSIGN_OR_RETURN(double acc_before, GreedyAccuracy(*model, tok, cfg, val, *reward));

  // Tokenized training examples: prompt, answer, EOS; the loss is on the
  // answer and EOS only.
  std::mt19937_64 rng(static_cast<uint64_t>(cfg.seed));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  struct Example {
    std::vector<int64_t> ids;
    int64_t prompt_len;
  };
  std::vector<Example> examples;
  for (const PromptItem& p : data.train) {
    std::string answer = p.ground_truth;
    if (cfg.sft.answer_noise > 0 && u(rng) < cfg.sft.answer_noise) answer = Corrupt(answer, rng);
    Example e;
    for (int32_t id : tok.Encode(p.prompt)) e.ids.push_back(id);
    e.prompt_len = static_cast<int64_t>(e.ids.size());
    for (int32_t id : tok.Encode(answer)) e.ids.push_back(id);
    e.ids.push_back(*tok.eos_id());
    examples.push_back(std::move(e));
  }
  if (examples.empty()) return absl::InvalidArgumentError("sft: no training records");

  TrainingArgs ta = cfg.actor_train.training_args;
  ta.learning_rate = cfg.sft.learning_rate;
  ta.warmup_steps = cfg.sft.warmup_steps;
  ta.lr_scheduler_type = LrSchedulerType::kCosine;
  ta.per_device_train_batch_size = cfg.sft.batch_size;
  TrainStrategyOptions o = TrainStrategyOptions::FromTrainingArgs(ta, cfg.sft.max_steps);
  o.micro_batch_size = cfg.sft.batch_size;
  ROLL_ASSIGN_OR_RETURN(auto strategy, TrainStrategy::Create(std::move(model), o));
  const LossFn loss = [](const ModelOutputs& out, const MicroBatch& mb) -> absl::StatusOr<LossOutput> {
    return LossOutput{TokenMeanLoss(-out.log_probs, mb), {}};
  };
  std::vector<size_t> order(examples.size());
  std::iota(order.begin(), order.end(), 0);
  size_t cursor = order.size();
  double loss_first = 0, loss_last = 0;
  for (int step = 0; step < cfg.sft.max_steps; ++step) {
    std::vector<const Example*> rows;
    for (int i = 0; i < cfg.sft.batch_size; ++i) {
      if (cursor == order.size()) {
        std::shuffle(order.begin(), order.end(), rng);
        cursor = 0;
      }
      rows.push_back(&examples[order[cursor++]]);
    }
    int64_t T = 2;
    for (const Example* e : rows) T = std::max<int64_t>(T, e->ids.size());
    const int64_t B = static_cast<int64_t>(rows.size());
    at::Tensor ids = at::zeros({B, T}, at::kLong), attn = at::zeros({B, T}, at::kLong);
    at::Tensor resp = at::zeros({B, T}, at::kLong);
    for (int64_t i = 0; i < B; ++i) {
      const Example& e = *rows[i];
      for (size_t j = 0; j < e.ids.size(); ++j) {
        ids[i][j] = e.ids[j];
        attn[i][j] = 1;
        resp[i][j] = static_cast<int64_t>(j) >= e.prompt_len ? 1 : 0;
      }
    }
    Batch b;
    b.SetTensor("input_ids", ids);
    b.SetTensor("attention_mask", attn);
    b.SetTensor("response_mask", resp);
    ROLL_ASSIGN_OR_RETURN(TrainStepResult r, strategy->TrainStep(b, loss));
    if (step == 0) loss_first = r.metrics.at("loss");
    loss_last = r.metrics.at("loss");
    if ((step + 1) % 50 == 0 || step + 1 == cfg.sft.max_steps) {
      std::cerr << absl::StrFormat("sft step %d/%d loss %.4f lr %.2e\n", step + 1, cfg.sft.max_steps,
                                   loss_last, r.metrics.at("lr"));
    }
  }
  ROLL_ASSIGN_OR_RETURN(double acc_after, GreedyAccuracy(strategy->model(), tok, cfg, val, *reward));
  SaveOptions so;
  so.extra_files["tokenizer.json"] = tok.json();
  ROLL_RETURN_IF_ERROR(strategy->model().SavePretrained(cfg.sft.output_dir, so));
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  return absl::StrFormat(
      R"({"sft": "done", "output_dir": "%s", "params": %d, "steps": %d, "loss_first": %.4f, )"
      R"("loss_last": %.4f, "val_accuracy_before": %.4f, "val_accuracy_after": %.4f, "seconds": %.1f})",
      cfg.sft.output_dir, strategy->model().NumParameters(), cfg.sft.max_steps, loss_first, loss_last,
      acc_before, acc_after, secs);
}

}  // namespace

int SftCommand(const std::vector<std::string>& args) {
  auto flags = CliArgs::Parse(args, {}, {});
  if (!flags.ok()) return CliFail(flags.status());
  if (flags->positional().empty()) {
    std::cerr << "usage: roll sft CONFIG [key.path=value ...]\n";
    return 2;
  }
  std::vector<std::string> overrides(flags->positional().begin() + 1, flags->positional().end());
  auto config = LoadPipelineConfig(flags->positional()[0], overrides);
  if (!config.ok()) {
    std::cerr << config.status().message() << "\n";
    return 1;
  }
  auto out = RunSft(*config);
  if (!out.ok()) return CliFail(out.status());
  std::cout << *out << std::endl;
  return 0;
}

}  // namespace roll
