// `roll generate`: sample continuations of prompts from a checkpoint.
// `roll bench generate`: decode throughput of the generation engine, next to
// the machine's GEMM rate and (optionally) an eager PyTorch baseline; with
// --tp N also the same model split into N tensor-parallel slices.
// See docs/generation.md.

#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cli/cli.h"
#include "models/fast_decode.h"
#include "roll/common/cli_args.h"
#include "roll/models/hf_config.h"
#include "roll/models/tokenizer.h"
#include "roll/models/transformer.h"
#include "roll/scheduler/device_mapping.h"
#include "roll/strategies/communicator.h"
#include "roll/strategies/generation_engine.h"
#include "roll/strategies/tensor_parallel.h"

namespace roll {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

absl::Status SetThreads(const CliArgs& flags, int64_t* threads) {
  const int64_t hw = HostCores();
  ROLL_ASSIGN_OR_RETURN(*threads, flags.GetInt("threads", hw));
  if (*threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--threads ", *threads, " must be >= 1"));
  }
  at::set_num_threads(static_cast<int>(*threads));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> ParseIds(absl::string_view text, absl::string_view what) {
  std::vector<int64_t> ids;
  for (absl::string_view piece : absl::StrSplit(text, absl::ByAnyChar(" ,\t"), absl::SkipEmpty())) {
    int64_t id;
    if (!absl::SimpleAtoi(piece, &id)) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": '", piece, "' is not a token id"));
    }
    ids.push_back(id);
  }
  if (ids.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": no token ids"));
  return ids;
}

// `--prompt-ids "1 2 3;4 5"`: one list of token ids per prompt.
absl::StatusOr<std::vector<std::vector<int64_t>>> ParsePromptIds(absl::string_view text) {
  std::vector<std::vector<int64_t>> prompts;
  for (absl::string_view part : absl::StrSplit(text, ';')) {
    ROLL_ASSIGN_OR_RETURN(auto ids, ParseIds(part, absl::StrCat("--prompt-ids prompt ", prompts.size())));
    prompts.push_back(std::move(ids));
  }
  return prompts;
}

// Keeps one output line per sample: backslash and line breaks are escaped.
std::string OneLine(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      out += c;
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<CausalLM>> LoadModel(const std::string& dir) {
  if (!fs::is_directory(dir)) {
    return absl::NotFoundError(absl::StrCat("--model ", dir, ": not a directory"));
  }
  ModelOptions o;
  o.requires_grad = false;
  auto model = CausalLM::FromPretrained(dir, o);
  if (!model.ok()) return Annotate(model.status(), absl::StrCat("--model ", dir));
  return model;
}

}  // namespace

int GenerateCommand(const std::vector<std::string>& args) {
  auto flags = CliArgs::Parse(
      args,
      {"model", "prompt", "prompt-ids", "prompts-file", "max-new-tokens", "temperature", "top-p",
       "top-k", "seed", "format", "n", "stop", "stop-token-ids", "max-batch", "threads"},
      {"ignore-eos", "add-special-tokens"});
  if (!flags.ok()) return CliFail(flags.status());
  auto dir = flags->Required("model");
  if (!dir.ok()) return CliFail(dir.status());
  const std::string format = flags->Get("format", "text");
  if (format != "text" && format != "ids") {
    return CliFail(
        absl::InvalidArgumentError(absl::StrCat("--format '", format, "': use ids or text")));
  }
  const int sources = flags->Has("prompt") + flags->Has("prompt-ids") + flags->Has("prompts-file");
  if (sources != 1) {
    return CliFail(absl::InvalidArgumentError(
        "give exactly one of --prompt TEXT, --prompt-ids \"1 2 3[;4 5]\", --prompts-file FILE"));
  }
  auto max_new = flags->GetInt("max-new-tokens", 32);
  auto temperature = flags->GetDouble("temperature", 1.0);
  auto top_p = flags->GetDouble("top-p", 1.0);
  auto top_k = flags->GetInt("top-k", 0);
  auto seed = flags->GetInt("seed", 0);
  auto n = flags->GetInt("n", 1);
  auto max_batch = flags->GetInt("max-batch", 16);
  for (const absl::Status& s : {max_new.status(), temperature.status(), top_p.status(),
                                top_k.status(), seed.status(), n.status(), max_batch.status()}) {
    if (!s.ok()) return CliFail(s);
  }
  int64_t threads = 0;
  if (absl::Status s = SetThreads(*flags, &threads); !s.ok()) return CliFail(s);

  if (!fs::is_directory(*dir)) {
    return CliFail(absl::NotFoundError(absl::StrCat("--model ", *dir, ": not a directory")));
  }
  // The tokenizer is optional for ids in and out, required for text.
  const std::string tok_path = (fs::path(*dir) / "tokenizer.json").string();
  std::optional<Tokenizer> tok;
  const bool needs_tok = format == "text" || !flags->Has("prompt-ids") || flags->Has("stop");
  if (fs::exists(tok_path)) {
    auto t = Tokenizer::FromFile(tok_path);
    if (!t.ok()) return CliFail(t.status());
    tok = *std::move(t);
  } else if (needs_tok) {
    return CliFail(absl::NotFoundError(
        absl::StrCat(tok_path,
                     " does not exist: text prompts, --format text and --stop need a tokenizer "
                     "(use --prompt-ids and --format ids without one)")));
  }

  std::vector<std::vector<int64_t>> prompts;
  auto encode = [&](const std::string& text, absl::string_view what) -> absl::Status {
    std::vector<int32_t> ids = tok->Encode(text, flags->Has("add-special-tokens"));
    if (ids.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": encodes to no tokens"));
    }
    prompts.emplace_back(ids.begin(), ids.end());
    return absl::OkStatus();
  };
  if (flags->Has("prompt")) {
    if (absl::Status s = encode(flags->Get("prompt"), "--prompt"); !s.ok()) return CliFail(s);
  } else if (flags->Has("prompt-ids")) {
    auto ids = ParsePromptIds(flags->Get("prompt-ids"));
    if (!ids.ok()) return CliFail(ids.status());
    prompts = *std::move(ids);
  } else {
    const std::string path = flags->Get("prompts-file");
    std::ifstream in(path);
    if (!in)
      return CliFail(absl::NotFoundError(absl::StrCat("--prompts-file ", path, ": cannot open")));
    std::string line;
    int64_t line_no = 0;
    while (std::getline(in, line)) {
      ++line_no;
      if (absl::Status s = encode(line, absl::StrCat(path, ":", line_no)); !s.ok())
        return CliFail(s);
    }
    if (prompts.empty())
      return CliFail(absl::InvalidArgumentError(absl::StrCat(path, ": no prompts")));
  }

  auto model = LoadModel(*dir);
  if (!model.ok()) return CliFail(model.status());
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());
  EngineOptions eo;
  eo.max_batch = std::max<int64_t>(*max_batch, *n);
  eo.max_len = static_cast<int64_t>(longest) + std::max<int64_t>(*max_new, 1);
  eo.tokenizer = tok ? &*tok : nullptr;
  std::vector<int64_t> eos = (*model)->config().eos_token_ids;
  if (eos.empty() && tok && tok->eos_id()) eos.push_back(*tok->eos_id());
  eo.eos_token_ids = eos;
  auto engine = GenerationEngine::Create(model->get(), eo);
  if (!engine.ok()) return CliFail(engine.status());

  SamplingParams sp;
  sp.max_new_tokens = *max_new;
  sp.temperature = *temperature;
  sp.top_p = *top_p;
  sp.top_k = *top_k;
  sp.ignore_eos = flags->Has("ignore-eos");
  if (flags->Has("stop")) sp.stop_strings = {flags->Get("stop")};
  if (flags->Has("stop-token-ids")) {
    auto ids = ParseIds(flags->Get("stop-token-ids"), "--stop-token-ids");
    if (!ids.ok()) return CliFail(ids.status());
    sp.stop_token_ids = *std::move(ids);
  }
  std::vector<RequestId> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest req;
    req.prompt_ids = prompts[i];
    req.params = sp;
    // Each prompt gets its own seed so that equal prompts still differ.
    req.params.seed = static_cast<uint64_t>(*seed) + i;
    req.n = *n;
    auto id = (*engine)->Submit(std::move(req));
    if (!id.ok()) return CliFail(Annotate(id.status(), absl::StrCat("prompt ", i)));
    ids.push_back(*id);
  }
  auto results = (*engine)->RunToCompletion();
  if (!results.ok()) return CliFail(results.status());
  std::sort(results->begin(), results->end(), [](const auto& a, const auto& b) {
    return std::make_pair(a.request_id, a.sample_index) <
           std::make_pair(b.request_id, b.sample_index);
  });
  for (const GenerationResult& r : *results) {
    if (format == "ids") {
      std::cout << absl::StrJoin(r.token_ids, " ") << "\n";
    } else {
      std::cout << OneLine(r.text) << "\n";
    }
  }
  return 0;
}

namespace {

struct RandomSpec {
  int64_t layers = 4, hidden = 256, heads = 4, kv_heads = 2, intermediate = 1024, vocab = 8192;
};

absl::StatusOr<ModelConfig> RandomConfig(absl::string_view spec_text) {
  RandomSpec s;
  absl::string_view rest = spec_text.substr(std::string_view("random").size());
  if (!rest.empty()) {
    if (rest[0] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("--model ", spec_text, ": expected random[:key=value,...]"));
    }
    for (absl::string_view kv : absl::StrSplit(rest.substr(1), ',', absl::SkipEmpty())) {
      std::vector<std::string> parts = absl::StrSplit(kv, '=');
      int64_t v = 0;
      if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &v) || v <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--model ", spec_text, ": '", kv, "' is not key=positive-integer"));
      }
      const std::string& k = parts[0];
      int64_t* field = k == "layers"         ? &s.layers
                       : k == "hidden"       ? &s.hidden
                       : k == "heads"        ? &s.heads
                       : k == "kv_heads"     ? &s.kv_heads
                       : k == "intermediate" ? &s.intermediate
                       : k == "vocab"        ? &s.vocab
                                             : nullptr;
      if (field == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("--model ", spec_text, ": unknown key '", k,
                         "' (layers, hidden, heads, kv_heads, intermediate, vocab)"));
      }
      *field = v;
    }
  }
  const std::string json = absl::StrCat(
      R"({"model_type": "qwen2", "hidden_size": )", s.hidden, R"(, "intermediate_size": )",
      s.intermediate, R"(, "num_hidden_layers": )", s.layers, R"(, "num_attention_heads": )",
      s.heads, R"(, "num_key_value_heads": )", s.kv_heads, R"(, "vocab_size": )", s.vocab,
      R"(, "max_position_embeddings": 32768, "tie_word_embeddings": true, "rms_norm_eps": 1e-6})");
  return ModelConfig::FromJson(json, absl::StrCat("--model ", spec_text));
}

// A checkpoint directory, or a random Qwen2-shaped model ("random[:k=v,...]")
// drawn from `seed`; its parameters need no gradients.
absl::StatusOr<std::unique_ptr<CausalLM>> ModelFromSpec(const std::string& spec, uint64_t seed) {
  if (!absl::StartsWith(spec, "random")) return LoadModel(spec);
  ROLL_ASSIGN_OR_RETURN(ModelConfig config, RandomConfig(spec));
  ModelOptions o;
  o.requires_grad = false;
  return CausalLM::Random(config, seed, o);
}


struct GenTiming {
  double total_s = 0, prefill_s = 0, decode_s = 0;
};

// Greedy, EOS ignored: every sequence makes `new_tokens` tokens.
absl::StatusOr<GenTiming> TimeGeneration(const std::vector<CausalLM*>& slices, int64_t batch,
                                         int64_t prompt_len, int64_t new_tokens, uint64_t seed) {
  CausalLM* model = slices.front();
  EngineOptions eo;
  eo.max_batch = batch;
  eo.max_len = prompt_len + new_tokens;
  eo.max_prefill_tokens = batch * prompt_len;  // everyone is admitted in the first step
  eo.eos_token_ids = std::vector<int64_t>{};
  ROLL_ASSIGN_OR_RETURN(auto engine, GenerationEngine::Create(slices, eo));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor prompts = at::randint(model->config().vocab_size, {batch, prompt_len}, gen, at::kLong);
  for (int64_t b = 0; b < batch; ++b) {
    GenerationRequest r;
    const int64_t* p = prompts[b].data_ptr<int64_t>();
    r.prompt_ids.assign(p, p + prompt_len);
    r.params.temperature = 0;
    r.params.max_new_tokens = new_tokens;
    r.params.ignore_eos = true;
    ROLL_RETURN_IF_ERROR(engine->Submit(std::move(r)).status());
  }
  const auto t0 = Clock::now();
  int64_t produced = 0;
  ROLL_ASSIGN_OR_RETURN(auto first, engine->Step());
  produced += static_cast<int64_t>(first.size());
  const auto t1 = Clock::now();
  while (engine->HasPending()) {
    ROLL_ASSIGN_OR_RETURN(auto done, engine->Step());
    produced += static_cast<int64_t>(done.size());
  }
  const auto t2 = Clock::now();
  if (engine->stats().generated_tokens != batch * new_tokens || produced != batch) {
    return absl::InternalError(absl::StrCat("bench generate: expected ", batch * new_tokens,
                                            " tokens, the engine made ",
                                            engine->stats().generated_tokens));
  }
  return GenTiming{Seconds(t0, t2), Seconds(t0, t1), Seconds(t1, t2)};
}

// The model split into `tp` slices over an in-process Gloo group; the best
// of `repeats` timed runs after a warm-up, as for the unsplit model.
absl::StatusOr<GenTiming> TimeTensorParallel(const CausalLM& whole, int tp, int64_t batch,
                                             int64_t prompt_len, int64_t new_tokens, uint64_t seed,
                                             int64_t repeats) {
  if (tp < 2) return absl::InvalidArgumentError(absl::StrCat("--tp must be >= 2, got ", tp));
  ROLL_ASSIGN_OR_RETURN(auto store, StoreServer::Start("127.0.0.1", 0));
  CommunicatorOptions base;
  base.store_port = store->port();
  base.store_token = store->token();
  base.group_name = "bench_generate_tp";
  ROLL_ASSIGN_OR_RETURN(auto group, TensorParallelGroup::Create(whole, tp, base));
  const std::vector<CausalLM*> raw = group->slices();
  ROLL_RETURN_IF_ERROR(TimeGeneration(raw, batch, prompt_len, 4, seed + 1).status());
  GenTiming best;
  best.total_s = best.decode_s = best.prefill_s = 1e300;
  for (int64_t r = 0; r < repeats; ++r) {
    ROLL_ASSIGN_OR_RETURN(GenTiming t, TimeGeneration(raw, batch, prompt_len, new_tokens, seed + 2 + r));
    best.total_s = std::min(best.total_s, t.total_s);
    best.decode_s = std::min(best.decode_s, t.decode_s);
    best.prefill_s = std::min(best.prefill_s, t.prefill_s);
  }
  return best;
}

absl::StatusOr<nlohmann::json> RunBaseline(const std::string& python, const std::string& script,
                                           const std::string& dir, int64_t batch,
                                           int64_t prompt_len, int64_t new_tokens, int64_t threads,
                                           int64_t repeats, const std::string& blas_dir) {
  // The baseline loads the BLAS this process runs on (`blas_dir`), so that
  // both sides run their products on the same library and threads.
  const std::string env =
      blas_dir.empty() ? "" : absl::StrCat("LD_LIBRARY_PATH='", blas_dir, "'${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ");
  const std::string cmd = absl::StrCat(env, "'", python, "' '", script, "' --model '", dir, "' --batch ",
                                       batch, " --prompt-len ", prompt_len, " --new ", new_tokens,
                                       " --threads ", threads, " --repeats ", repeats);
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("cannot run: ", cmd));
  std::string out;
  char buf[4096];
  while (size_t got = fread(buf, 1, sizeof(buf), pipe)) out.append(buf, got);
  const int rc = pclose(pipe);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("baseline failed (status ", rc, "): ", cmd, "\n", out));
  }
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipWhitespace());
  if (lines.empty()) return absl::InternalError(absl::StrCat("baseline printed nothing: ", cmd));
  nlohmann::json j = nlohmann::json::parse(lines.back(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("tokens_per_s")) {
    return absl::InternalError(
        absl::StrCat("baseline's last line is not JSON with tokens_per_s: ", lines.back()));
  }
  return j;
}

// Seconds of the matrix products of one decode step at batch `batch`
// alone, with LibTorch's at::linear on the model's own weights (q, k, v, o,
// gate, up, down per layer, then the LM head; best of several rounds). What
// the library's GEMM gives for these shapes: a decode step made of LibTorch
// products cannot beat it.
double MeasureStepProductsSeconds(const CausalLM& model, int64_t batch) {
  c10::InferenceMode guard;
  const ModelConfig& c = model.config();
  const std::map<std::string, at::Tensor> named = model.NamedParameters();
  std::vector<at::Tensor> w;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    for (const char* n : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                          "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
      w.push_back(named.at(absl::StrCat(p, n, ".weight")));
    }
  }
  w.push_back(named.count("lm_head.weight") ? named.at("lm_head.weight") : named.at("model.embed_tokens.weight"));
  std::vector<at::Tensor> in;
  for (const at::Tensor& t : w) in.push_back(at::randn({batch, t.size(1)}, t.options()));
  return BestSecondsPerCall([&] {
    for (size_t i = 0; i < w.size(); ++i) (void)at::linear(in[i], w[i]);
  });
}

}  // namespace

// `roll logits --model DIR|random[:k=v,...] --prompt-ids "1 2 3[;4 5]" [--seed S]
// [--save DIR] [--threads N]`: the model's forward over each prompt, as one
// JSON line per prompt, {"ids": [...], "logits": [[V floats] x T]} in
// float32: what a reference implementation is compared against. --save
// writes the model (a random one too) in the Hugging Face layout first.
int LogitsCommand(const std::vector<std::string>& args) {
  auto flags = CliArgs::Parse(args, {"model", "prompt-ids", "seed", "save", "threads"}, {});
  if (!flags.ok()) return CliFail(flags.status());
  auto spec = flags->Required("model");
  if (!spec.ok()) return CliFail(spec.status());
  auto text = flags->Required("prompt-ids");
  if (!text.ok()) return CliFail(text.status());
  auto seed = flags->GetInt("seed", 0);
  if (!seed.ok()) return CliFail(seed.status());
  int64_t threads = 0;
  if (absl::Status s = SetThreads(*flags, &threads); !s.ok()) return CliFail(s);
  auto prompts = ParsePromptIds(*text);
  if (!prompts.ok()) return CliFail(prompts.status());
  auto loaded = ModelFromSpec(*spec, static_cast<uint64_t>(*seed));
  if (!loaded.ok()) return CliFail(loaded.status());
  std::unique_ptr<CausalLM> model = *std::move(loaded);
  if (flags->Has("save")) {
    if (absl::Status s = model->SavePretrained(flags->Get("save")); !s.ok()) return CliFail(s);
  }
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < prompts->size(); ++i) {
    // Forward names an id outside the vocabulary.
    auto logits = model->Forward(torch::tensor((*prompts)[i], torch::kLong).unsqueeze(0));
    if (!logits.ok()) return CliFail(Annotate(logits.status(), absl::StrCat("--prompt-ids prompt ", i)));
    at::Tensor l = logits->to(at::kFloat).contiguous()[0];
    nlohmann::json rows = nlohmann::json::array();
    for (int64_t t = 0; t < l.size(0); ++t) {
      const float* p = l[t].data_ptr<float>();
      rows.push_back(std::vector<float>(p, p + l.size(1)));
    }
    std::cout << nlohmann::json{{"ids", (*prompts)[i]}, {"logits", rows}}.dump() << "\n";
  }
  return 0;
}

int BenchGenerateCommand(const std::vector<std::string>& args) {
  auto flags = CliArgs::Parse(args,
                              {"model", "batch", "prompt-len", "new", "threads", "seed", "repeats",
                               "baseline-python", "python", "save-model", "tp"},
                              {"libtorch-decode"});
  if (!flags.ok()) return CliFail(flags.status());
  auto spec = flags->Required("model");
  if (!spec.ok()) return CliFail(spec.status());
  auto batch = flags->GetInt("batch", 64);
  auto prompt_len = flags->GetInt("prompt-len", 128);
  auto new_tokens = flags->GetInt("new", 128);
  auto seed = flags->GetInt("seed", 0);
  auto repeats = flags->GetInt("repeats", 3);
  for (const absl::Status& s : {batch.status(), prompt_len.status(), new_tokens.status(),
                                seed.status(), repeats.status()}) {
    if (!s.ok()) return CliFail(s);
  }
  if (*batch < 1 || *prompt_len < 1 || *new_tokens < 2 || *repeats < 1) {
    return CliFail(absl::InvalidArgumentError(
        "bench generate: need --batch >= 1, --prompt-len >= 1, --new >= 2, --repeats >= 1"));
  }
  int64_t threads = 0;
  if (absl::Status s = SetThreads(*flags, &threads); !s.ok()) return CliFail(s);

  // The model: a checkpoint, or a random Qwen2-shaped one ("random[:k=v,...]")
  // that is written out when the baseline or --save-model needs a directory.
  std::unique_ptr<CausalLM> model;
  std::string dir = *spec;
  std::string temp_dir;
  const bool random = absl::StartsWith(*spec, "random");
  auto loaded = ModelFromSpec(*spec, static_cast<uint64_t>(*seed));
  if (!loaded.ok()) return CliFail(loaded.status());
  model = *std::move(loaded);
  if (random) {
    if (flags->Has("save-model")) {
      dir = flags->Get("save-model");
    } else if (flags->Has("baseline-python")) {
      temp_dir =
          (fs::temp_directory_path() / absl::StrCat("roll-bench-generate-", getpid())).string();
      dir = temp_dir;
    }
    if (flags->Has("save-model") || flags->Has("baseline-python")) {
      if (absl::Status s = model->SavePretrained(dir); !s.ok()) return CliFail(s);
    }
  }
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      if (!dir.empty()) fs::remove_all(dir, ec);
    }
  } cleanup{temp_dir};

  // --libtorch-decode: every decode step through LibTorch ops, also at the
  // small batches the hand-written kernels take by default.
  const bool fast = !flags->Has("libtorch-decode");
  model->set_fast_decode(fast);
  const double gemm = MeasureGemmGflops();
  const int64_t fast_steps_before = models_internal::FastDecodeSteps();
  // Warm-up: builds the fused decode weights and touches the allocator.
  if (auto w = TimeGeneration({model.get()}, *batch, *prompt_len, 4, *seed + 1); !w.ok()) {
    return CliFail(w.status());
  }
  GenTiming best;
  best.total_s = 1e300;
  double best_decode = 1e300, best_prefill = 1e300;
  for (int64_t r = 0; r < *repeats; ++r) {
    auto t = TimeGeneration({model.get()}, *batch, *prompt_len, *new_tokens, *seed + 2 + r);
    if (!t.ok()) return CliFail(t.status());
    if (t->total_s < best.total_s) best = *t;
    best_decode = std::min(best_decode, t->decode_s);
    best_prefill = std::min(best_prefill, t->prefill_s);
  }
  const double products_s = MeasureStepProductsSeconds(*model, *batch);
  // FLOPs per token: 2 x the parameters that take part in a matrix product
  // (an untied input embedding is a lookup, not a product).
  const ModelConfig& c = model->config();
  const int64_t params = model->NumParameters();
  const int64_t matmul_params =
      c.tie_word_embeddings ? params : params - c.vocab_size * c.hidden_size;
  const double flops_per_token = 2.0 * static_cast<double>(matmul_params);
  const double tokens_per_s = static_cast<double>(*batch * *new_tokens) / best.total_s;
  const double decode_tokens_per_s = static_cast<double>(*batch * (*new_tokens - 1)) / best_decode;
  const double decode_gflops = decode_tokens_per_s * flops_per_token / 1e9;

  nlohmann::json j;
  j["bench"] = "generate";
  j["model"] = *spec;
  j["layers"] = c.num_hidden_layers;
  j["hidden"] = c.hidden_size;
  j["vocab"] = c.vocab_size;
  j["params"] = params;
  j["flops_per_token"] = flops_per_token;
  j["batch"] = *batch;
  j["prompt_len"] = *prompt_len;
  j["new_tokens"] = *new_tokens;
  j["threads"] = threads;
  j["repeats"] = *repeats;
  j["tokens_per_s"] = tokens_per_s;
  j["decode_tokens_per_s"] = decode_tokens_per_s;
  j["prefill_tokens_per_s"] = static_cast<double>(*batch * *prompt_len) / best_prefill;
  j["decode_gflops"] = decode_gflops;
  j["gemm_gflops"] = gemm;
  const BlasInfo blas = LoadedBlas();
  j["blas"] = blas.library;
  j["blas_threading"] = blas.threading;
  j["blas_threads"] = blas.threads;
  j["gemm_fraction"] = decode_gflops / gemm;
  j["gemm_fraction_overall"] = tokens_per_s * flops_per_token / 1e9 / gemm;
  // Whether the decode steps ran the hand-written path (asked for, the CPU
  // has AVX2/FMA and the model qualifies).
  j["fast_decode"] = models_internal::FastDecodeSteps() > fast_steps_before;
  // The library's own floor for these shapes (MeasureStepProductsSeconds)
  // and the fraction of it the decode steps reach.
  j["libtorch_products_tokens_per_s"] = static_cast<double>(*batch) / products_s;
  j["decode_vs_libtorch_products"] = decode_tokens_per_s * products_s / static_cast<double>(*batch);
  if (flags->Has("tp")) {
    // The same model split over --tp tensor-parallel slices in this
    // process (a Gloo group over loopback), timed the same way.
    auto tp = flags->GetInt("tp", 2);
    if (!tp.ok()) return CliFail(tp.status());
    auto split = TimeTensorParallel(*model, static_cast<int>(*tp), *batch, *prompt_len, *new_tokens,
                                    static_cast<uint64_t>(*seed), *repeats);
    if (!split.ok()) return CliFail(Annotate(split.status(), "bench generate --tp"));
    const double tp_decode = static_cast<double>(*batch * (*new_tokens - 1)) / split->decode_s;
    j["tp"] = *tp;
    j["tp_tokens_per_s"] = static_cast<double>(*batch * *new_tokens) / split->total_s;
    j["tp_decode_tokens_per_s"] = tp_decode;
    j["tp_decode_vs_unsplit"] = tp_decode / decode_tokens_per_s;
  }
  if (flags->Has("baseline-python")) {
    auto base = RunBaseline(flags->Get("python", "python3"), flags->Get("baseline-python"), dir,
                            *batch, *prompt_len, *new_tokens, threads, *repeats, blas.directory);
    if (!base.ok()) return CliFail(base.status());
    const double b = (*base)["tokens_per_s"].get<double>();
    j["baseline_tokens_per_s"] = b;
    j["speedup"] = tokens_per_s / b;
    if (base->contains("decode_tokens_per_s")) {
      const double bd = (*base)["decode_tokens_per_s"].get<double>();
      j["baseline_decode_tokens_per_s"] = bd;
      j["decode_speedup"] = decode_tokens_per_s / bd;
    }
    if (base->contains("prefill_tokens_per_s")) {
      j["baseline_prefill_tokens_per_s"] = (*base)["prefill_tokens_per_s"].get<double>();
    }
  }
  std::cout << j.dump() << std::endl;
  return 0;
}

}  // namespace roll
