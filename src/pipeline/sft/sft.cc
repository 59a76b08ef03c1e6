// RunSft (roll/pipeline/sft.h): supervised fine-tuning in one process on
// the config's data.

#include "roll/pipeline/sft.h"

#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "roll/common/cpu_load.h"
#include "roll/common/logging.h"
#include "roll/common/stopwatch.h"
#include "roll/envs/environment.h"
#include "roll/models/hf_config.h"
#include "roll/models/tokenizer.h"
#include "roll/models/transformer.h"
#include "roll/pipeline/agentic.h"
#include "roll/pipeline/rlvr.h"
#include "roll/rewards/reward_function.h"
#include "roll/scheduler/device_mapping.h"
#include "roll/strategies/generation_engine.h"
#include "roll/strategies/train_strategy.h"

namespace roll {
namespace {

// A wrong answer for answer_noise: integers move by a nonzero offset; other
// answers stay (the noise only weakens arithmetic-like tasks).
std::string Corrupt(const std::string& answer, std::mt19937_64& rng) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(answer, &v)) return answer;
  std::uniform_int_distribution<int64_t> d(1, 9);
  const int64_t off = d(rng) * ((rng() & 1) ? 1 : -1);
  return std::to_string(v + off);
}

absl::StatusOr<Tokenizer> MakeTokenizer(const PipelineConfig& cfg, const std::vector<std::string>& texts) {
  if (!cfg.sft.init_from.empty()) {
    const std::string path = (std::filesystem::path(cfg.sft.init_from) / "tokenizer.json").string();
    return Tokenizer::FromFile(path);
  }
  // Every character of the data, in a stable order, so the vocabulary is
  // the same for the same data.
  std::set<char32_t> seen;
  std::string alphabet = "0123456789-";
  for (char c : alphabet) seen.insert(static_cast<unsigned char>(c));
  for (const std::string& s : texts) {
    for (unsigned char c : s) {
      if (c >= 0x80) {
        return absl::InvalidArgumentError(
            "sft: a fresh model's character tokenizer covers ASCII text only; set sft.init_from "
            "to a model with its own tokenizer");
      }
      if (seen.insert(c).second) alphabet.push_back(static_cast<char>(c));
    }
  }
  CharTokenizerOptions o;
  o.alphabet = alphabet;
  return MakeCharTokenizer(o);
}

// Positions a model needs: the RLVR prompt and response, or an agentic
// trajectory.
int64_t MaxLen(const PipelineConfig& cfg) {
  return std::max<int64_t>(cfg.prompt_length + cfg.response_length, cfg.sequence_length);
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
  c.max_position_embeddings = std::max<int64_t>(512, MaxLen(cfg));
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

// The fraction of `prompts` whose greedy answer `correct` accepts.
absl::StatusOr<double> GreedyAccuracy(CausalLM& model, const Tokenizer& tok, const PipelineConfig& cfg,
                                      const std::vector<std::vector<int64_t>>& prompts, int64_t max_new_tokens,
                                      const std::function<absl::StatusOr<bool>(size_t, const std::string&)>& correct) {
  EngineOptions eo;
  eo.max_batch = 64;
  eo.max_len = MaxLen(cfg);
  eo.tokenizer = &tok;
  if (tok.eos_id()) eo.eos_token_ids = std::vector<int64_t>{*tok.eos_id()};
  ROLL_ASSIGN_OR_RETURN(auto engine, GenerationEngine::Create(&model, eo));
  std::map<RequestId, size_t> by_id;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.prompt_ids = prompts[i];
    r.params.temperature = 0;
    r.params.max_new_tokens = max_new_tokens;
    ROLL_ASSIGN_OR_RETURN(RequestId id, engine->Submit(std::move(r)));
    by_id[id] = i;
  }
  ROLL_ASSIGN_OR_RETURN(auto results, engine->RunToCompletion());
  double right = 0;
  for (const GenerationResult& r : results) {
    ROLL_ASSIGN_OR_RETURN(bool ok, correct(by_id.at(r.request_id), r.text));
    right += ok;
  }
  model.ReleaseInferenceWeights();
  return prompts.empty() ? 0.0 : right / static_cast<double>(prompts.size());
}

std::vector<int64_t> EncodeIds(const Tokenizer& tok, const std::string& text) {
  std::vector<int64_t> out;
  for (int32_t id : tok.Encode(text)) out.push_back(id);
  return out;
}

// What one supervised run trains on: token sequences with the positions
// the loss covers, and a greedy check on held-out prompts.
struct SftExample {
  std::vector<int64_t> ids;
  std::vector<uint8_t> loss;  // 1 where the token is learned
};
struct SftData {
  std::vector<SftExample> train;
  std::vector<std::vector<int64_t>> val_prompts;
  int64_t max_new_tokens = 0;  // of the greedy check
  std::function<absl::StatusOr<bool>(size_t, const std::string&)> correct;
  std::string accuracy_what;  // how the JSON names the check
  std::mt19937_64 rng;        // the batches' shuffles
};

// RLVR: prompt, then the ground truth (with sft.answer_noise) and EOS; the
// check is the first reward domain's reward type.
absl::StatusOr<SftData> PromptData(const PipelineConfig& cfg, const PromptSets& data, const Tokenizer& tok) {
  std::string reward_type = "math_rule";
  if (!cfg.rewards.empty() && !cfg.rewards.begin()->second.reward_type.empty()) {
    reward_type = cfg.rewards.begin()->second.reward_type;
  }
  ROLL_ASSIGN_OR_RETURN(std::shared_ptr<RewardFunction> reward, MakeRewardFunction(reward_type, ""));
  SftData out;
  std::mt19937_64 rng(static_cast<uint64_t>(cfg.seed));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (const PromptItem& p : data.train) {
    std::string answer = p.solution.empty() ? p.ground_truth : p.solution;
    if (cfg.sft.answer_noise > 0 && u(rng) < cfg.sft.answer_noise) answer = Corrupt(answer, rng);
    SftExample e;
    e.ids = EncodeIds(tok, p.prompt);
    e.loss.assign(e.ids.size(), 0);
    for (int64_t id : EncodeIds(tok, answer)) e.ids.push_back(id);
    e.ids.push_back(*tok.eos_id());
    e.loss.resize(e.ids.size(), 1);
    out.train.push_back(std::move(e));
  }
  auto val = std::make_shared<std::vector<PromptItem>>(
      data.val.begin(), data.val.begin() + std::min<size_t>(data.val.size(), 256));
  for (const PromptItem& p : *val) out.val_prompts.push_back(EncodeIds(tok, p.prompt));
  out.correct = [val, reward](size_t i, const std::string& text) -> absl::StatusOr<bool> {
    RewardInput in;
    in.response = text;
    in.ground_truth = (*val)[i].ground_truth;
    in.tag = (*val)[i].tag;
    ROLL_ASSIGN_OR_RETURN(RewardResult s, reward->Score(in));
    return s.score >= 1.0 - 1e-9;
  };
  out.max_new_tokens = std::min(cfg.response_length, cfg.actor_infer.generating_args.max_new_tokens);
  out.accuracy_what = "val_accuracy";
  out.rng = rng;  // the shuffles go on from the noise draws
  return out;
}

// Agentic: whole episodes of play (PlayEpisodes), the loss on every answer and the
// EOS after it; turns that would pass sequence_length are left out. The
// check: the environment reads the greedy first answer of a held-out
// episode as a valid action.
absl::StatusOr<SftData> PlayData(const PipelineConfig& cfg, const std::vector<PlayedEpisode>& train,
                                 const std::vector<PlayedEpisode>& val, const Tokenizer& tok) {
  const int64_t cap = SequenceLength(cfg);
  SftData out;
  for (const PlayedEpisode& ep : train) {
    SftExample e;
    for (size_t i = 0; i < ep.segments.size(); ++i) {
      const PlayedEpisode::Segment& seg = ep.segments[i];
      std::vector<int64_t> ids = EncodeIds(tok, seg.text);
      if (seg.answer) ids.push_back(*tok.eos_id());
      if (static_cast<int64_t>(e.ids.size() + ids.size()) > cap) break;
      e.ids.insert(e.ids.end(), ids.begin(), ids.end());
      e.loss.resize(e.ids.size(), seg.answer ? 1 : 0);
    }
    // An episode whose first answer does not fit teaches nothing.
    if (std::find(e.loss.begin(), e.loss.end(), 1) != e.loss.end()) out.train.push_back(std::move(e));
  }
  auto seeds = std::make_shared<std::vector<uint64_t>>();
  for (const PlayedEpisode& ep : val) {
    out.val_prompts.push_back(EncodeIds(tok, ep.segments.front().text));
    seeds->push_back(ep.env_seed);
  }
  ROLL_ASSIGN_OR_RETURN(std::shared_ptr<Environment> env,
                        MakeEnvironment(cfg.train_env_manager.env_type, DemonstrationEnvOptions(cfg)));
  out.correct = [env, seeds](size_t i, const std::string& text) -> absl::StatusOr<bool> {
    ROLL_RETURN_IF_ERROR(env->Reset((*seeds)[i]).status());
    ROLL_ASSIGN_OR_RETURN(EnvStep s, env->Step(text));
    return s.action_valid;
  };
  out.max_new_tokens = MaxTokensPerStep(cfg);
  out.accuracy_what = "val_valid_moves";
  out.rng.seed(static_cast<uint64_t>(cfg.seed));
  return out;
}

// LibTorch threads of `roll sft`: runtime.threads_per_worker if set, else
// every thread of the node's CPU slots (num_gpus_per_node x
// cpu_threads_per_slot on cpu; the process's cores otherwise), never more
// than the cores the process may run on.
int SftThreads(const PipelineConfig& cfg) {
  if (cfg.runtime.threads_per_worker > 0) return cfg.runtime.threads_per_worker;
  const int cores = HostCores();
  if (cfg.device_type == DeviceType::kCpu && cfg.num_gpus_per_node > 0) {
    return std::min(cores, cfg.num_gpus_per_node * std::max(1, cfg.cpu_threads_per_slot));
  }
  return cores;
}

}  // namespace

absl::StatusOr<SftResult> RunSft(const PipelineConfig& cfg, const SftProgress& progress) {
  if (cfg.sft.output_dir.empty()) return absl::InvalidArgumentError("sft.output_dir is required");
  const Stopwatch clock;
  at::manual_seed(static_cast<uint64_t>(cfg.seed));
  // One process trains: the node's CPU slots' threads within its affinity
  // (LibTorch may start with one), or runtime.threads_per_worker if set.
  LoadAwareThreads threads(SftThreads(cfg), cfg.runtime.threads_follow_load && !cfg.deterministic);
  at::set_num_threads(threads.Threads());
  int fewest_threads = at::get_num_threads();
  // The texts the tokenizer must cover, then the examples in its ids.
  std::vector<std::string> texts;
  PromptSets prompts;
  std::vector<PlayedEpisode> played_train, played_val;
  const bool agentic = cfg.pipeline == "agentic";
  if (!agentic && cfg.sft.expert_moves > 0) {
    return absl::InvalidArgumentError(absl::StrCat("sft.expert_moves (", cfg.sft.expert_moves,
                                                   ") applies to agentic configs; this config's pipeline is ",
                                                   cfg.pipeline, " (use sft.answer_noise for a weaker base)"));
  }
  if (!agentic && !cfg.sft.env_options.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("sft.env_options applies to agentic configs; this config's "
                                                   "pipeline is ", cfg.pipeline));
  }
  if (agentic) {
    ROLL_ASSIGN_OR_RETURN(played_train, PlayEpisodes(cfg, cfg.data.num_train, cfg.seed, false));
    ROLL_ASSIGN_OR_RETURN(played_val, PlayEpisodes(cfg, std::min(cfg.data.num_val, 256), cfg.seed, true));
    for (const auto* set : {&played_train, &played_val}) {
      for (const PlayedEpisode& ep : *set) {
        for (const PlayedEpisode::Segment& seg : ep.segments) texts.push_back(seg.text);
      }
    }
  } else {
    ROLL_ASSIGN_OR_RETURN(prompts, LoadPromptSets(cfg));
    for (const auto* set : {&prompts.train, &prompts.val}) {
      for (const PromptItem& p : *set) {
        texts.push_back(p.prompt);
        texts.push_back(p.ground_truth);
        texts.push_back(p.solution);
      }
    }
  }
  ROLL_ASSIGN_OR_RETURN(Tokenizer tok, MakeTokenizer(cfg, texts));
  if (!tok.eos_id()) return absl::InvalidArgumentError("sft: the tokenizer has no EOS token");
  ROLL_ASSIGN_OR_RETURN(std::unique_ptr<CausalLM> model, MakeModel(cfg, tok));
  SftData data;
  if (agentic) {
    ROLL_ASSIGN_OR_RETURN(data, PlayData(cfg, played_train, played_val, tok));
  } else {
    ROLL_ASSIGN_OR_RETURN(data, PromptData(cfg, prompts, tok));
  }
  ROLL_ASSIGN_OR_RETURN(double acc_before, GreedyAccuracy(*model, tok, cfg, data.val_prompts, data.max_new_tokens, data.correct));
  const std::vector<SftExample>& examples = data.train;
  if (examples.empty()) return absl::InvalidArgumentError("sft: no training records");
  std::mt19937_64& rng = data.rng;

  TrainingArgs ta = cfg.actor_train.training_args;
  ta.learning_rate = cfg.sft.learning_rate;
  ta.warmup_steps = cfg.sft.warmup_steps;
  ta.lr_scheduler_type = LrSchedulerType::kCosine;
  ta.per_device_train_batch_size = cfg.sft.batch_size;
  TrainStrategyOptions o = TrainStrategyOptions::FromTrainingArgs(ta, cfg.sft.max_steps);
  o.micro_batch_size = cfg.sft.micro_batch_size > 0 ? std::min(cfg.sft.micro_batch_size, cfg.sft.batch_size)
                                                    : cfg.sft.batch_size;
  ROLL_ASSIGN_OR_RETURN(auto strategy, TrainStrategy::Create(std::move(model), o));
  const LossFn loss = [](const ModelOutputs& out, const MicroBatch& mb) -> absl::StatusOr<LossOutput> {
    return LossOutput{TokenMeanLoss(-out.log_probs, mb), {}};
  };
  std::vector<size_t> order(examples.size());
  std::iota(order.begin(), order.end(), 0);
  size_t cursor = order.size();
  double loss_first = 0, loss_last = 0;
  for (int step = 0; step < cfg.sft.max_steps; ++step) {
    const int n = threads.Threads();
    if (n != at::get_num_threads()) {
      LogInfo(absl::StrCat("sft: ", n, " intra-op thread(s) of ", threads.wanted(), ": ", threads.why()));
      at::set_num_threads(n);
      fewest_threads = std::min(fewest_threads, n);
    }
    std::vector<const SftExample*> rows;
    for (int i = 0; i < cfg.sft.batch_size; ++i) {
      if (cursor == order.size()) {
        std::shuffle(order.begin(), order.end(), rng);
        cursor = 0;
      }
      rows.push_back(&examples[order[cursor++]]);
    }
    int64_t T = 2;
    for (const SftExample* e : rows) T = std::max<int64_t>(T, e->ids.size());
    const int64_t B = static_cast<int64_t>(rows.size());
    at::Tensor ids = at::zeros({B, T}, at::kLong), attn = at::zeros({B, T}, at::kLong);
    at::Tensor resp = at::zeros({B, T}, at::kLong);
    for (int64_t i = 0; i < B; ++i) {
      const SftExample& e = *rows[i];
      int64_t* pi = ids.data_ptr<int64_t>() + i * T;
      int64_t* pa = attn.data_ptr<int64_t>() + i * T;
      int64_t* pr = resp.data_ptr<int64_t>() + i * T;
      for (size_t j = 0; j < e.ids.size(); ++j) {
        pi[j] = e.ids[j];
        pa[j] = 1;
        pr[j] = e.loss[j];
      }
    }
    Batch b;
    b.SetTensor("input_ids", ids);
    b.SetTensor("attention_mask", attn);
    b.SetTensor("response_mask", resp);
    ROLL_ASSIGN_OR_RETURN(TrainStepResult r, strategy->TrainStep(b, loss));
    if (step == 0) loss_first = r.metrics.at("loss");
    loss_last = r.metrics.at("loss");
    if (progress && ((step + 1) % 50 == 0 || step + 1 == cfg.sft.max_steps)) {
      progress(step + 1, loss_last, r.metrics.at("lr"));
    }
  }
  ROLL_ASSIGN_OR_RETURN(double acc_after, GreedyAccuracy(strategy->model(), tok, cfg, data.val_prompts, data.max_new_tokens, data.correct));
  SaveOptions so;
  so.extra_files["tokenizer.json"] = tok.json();
  ROLL_RETURN_IF_ERROR(strategy->model().SavePretrained(cfg.sft.output_dir, so));
  SftResult result;
  result.output_dir = cfg.sft.output_dir;
  result.params = strategy->model().NumParameters();
  result.steps = cfg.sft.max_steps;
  result.loss_first = loss_first;
  result.loss_last = loss_last;
  result.check = data.accuracy_what;
  result.check_before = acc_before;
  result.check_after = acc_after;
  result.threads = threads.wanted();
  result.fewest_threads = fewest_threads;
  result.seconds = clock.Seconds();
  return result;
}

std::string SftResult::ToJson() const {
  return absl::StrFormat(
      R"({"sft": "done", "output_dir": "%s", "params": %d, "steps": %d, "loss_first": %.4f, )"
      R"("loss_last": %.4f, "%s_before": %.4f, "%s_after": %.4f, "threads": %d, "fewest_threads": %d, "seconds": %.1f})",
      output_dir, params, steps, loss_first, loss_last, check, check_before, check, check_after, threads,
      fewest_threads, seconds);
}

}  // namespace roll
