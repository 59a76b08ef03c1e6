// Prompt sets and the resumable prompt iterator of the RLVR pipeline.

#include <algorithm>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "roll/pipeline/rlvr.h"
#include "nlohmann/json.hpp"
#include "roll/data/dataset.h"
#include "roll/models/chat_template.h"
#include "roll/data/tasks.h"

namespace roll {
namespace {

absl::StatusOr<PromptItem> ToPrompt(const PipelineConfig& cfg, const Sample& s) {
  PromptItem p;
  p.id = s.id;
  const bool chatml = cfg.data.chat_template == ChatTemplate::kChatml;
  if (!s.messages.empty() || chatml) {
    std::vector<ChatMessage> messages;
    for (const DataMessage& m : s.messages) messages.push_back({m.role, m.content});
    if (messages.empty()) {
      messages.push_back({"user", absl::StrReplaceAll(cfg.data.prompt_template, {{"{prompt}", s.prompt}})});
    }
    if (!chatml) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data: record '", s.id, "' has \"messages\"; set data.chat_template: chatml to render them"));
    }
    ChatTemplateOptions o;
    o.add_generation_prompt = true;
    auto text = ApplyChatMlTemplate(messages, o);
    if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("data: record '", s.id, "': ", text.status().message()));
    p.prompt = *text;
  } else {
    p.prompt = absl::StrReplaceAll(cfg.data.prompt_template, {{"{prompt}", s.prompt}});
  }
  p.ground_truth = s.ground_truth;
  p.solution = s.solution;
  p.tag = s.tag.empty() ? cfg.data.default_tag : s.tag;
  return p;
}

class ShuffledIterator : public PromptIterator {
 public:
  ShuffledIterator(std::vector<PromptItem> items, int64_t seed)
      : items_(std::move(items)), seed_(seed) {
    Reshuffle();
  }

  absl::StatusOr<PromptItem> Next() override {
    if (index_ >= static_cast<int64_t>(order_.size())) {
      ++epoch_;
      index_ = 0;
      Reshuffle();
    }
    return items_[order_[index_++]];
  }

  std::string PositionJson() const override {
    nlohmann::json j;
    j["epoch"] = epoch_;
    j["index"] = index_;
    j["seed"] = seed_;
    j["size"] = items_.size();
    return j.dump();
  }

  absl::Status RestorePositionJson(const std::string& text) override {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
      const int64_t size = j.at("size").get<int64_t>();
      if (size != static_cast<int64_t>(items_.size())) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data position: the checkpoint was taken over ", size, " training prompts, this run has ",
            items_.size()));
      }
      epoch_ = j.at("epoch").get<int64_t>();
      index_ = j.at("index").get<int64_t>();
      seed_ = j.at("seed").get<int64_t>();
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("data position: ", e.what()));
    }
    Reshuffle();
    return absl::OkStatus();
  }

 private:
  void Reshuffle() {
    order_.resize(items_.size());
    std::iota(order_.begin(), order_.end(), 0);
    std::mt19937_64 rng(static_cast<uint64_t>(seed_) * 1000003ull + static_cast<uint64_t>(epoch_));
    std::shuffle(order_.begin(), order_.end(), rng);
  }

  std::vector<PromptItem> items_;
  std::vector<size_t> order_;
  int64_t seed_;
  int64_t epoch_ = 0;
  int64_t index_ = 0;
};

}  // namespace

absl::StatusOr<PromptSets> LoadPromptSets(const PipelineConfig& cfg) {
  const DataArgs& d = cfg.data;
  std::vector<Sample> train, val;
  if (!d.train_files.empty()) {
    for (const std::string& f : d.train_files) {
      ROLL_ASSIGN_OR_RETURN(std::vector<Sample> part, LoadJsonl(f));
      train.insert(train.end(), part.begin(), part.end());
    }
    if (!d.val_files.empty()) {
      for (const std::string& f : d.val_files) {
        ROLL_ASSIGN_OR_RETURN(std::vector<Sample> part, LoadJsonl(f));
        val.insert(val.end(), part.begin(), part.end());
      }
    } else {
      const size_t keep = std::min<size_t>(train.size() / 2, static_cast<size_t>(d.num_val));
      val.assign(train.end() - keep, train.end());
      train.resize(train.size() - keep);
    }
  } else {
    ROLL_ASSIGN_OR_RETURN(TaskSplit split,
                          GenerateTaskSplit(d.task, d.num_train, d.num_val, cfg.seed, d.task_options));
    train = std::move(split.train);
    val = std::move(split.val);
  }
  if (train.empty()) return absl::InvalidArgumentError("data: no training prompts");
  if (val.empty()) return absl::InvalidArgumentError("data: no validation prompts");
  PromptSets out;
  for (const Sample& s : train) {
    ROLL_ASSIGN_OR_RETURN(PromptItem p, ToPrompt(cfg, s));
    out.train.push_back(std::move(p));
  }
  for (const Sample& s : val) {
    ROLL_ASSIGN_OR_RETURN(PromptItem p, ToPrompt(cfg, s));
    out.val.push_back(std::move(p));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<PromptIterator>> MakePromptIterator(std::vector<PromptItem> items,
                                                                   int64_t seed) {
  if (items.empty()) return absl::InvalidArgumentError("no prompts to iterate");
  return std::unique_ptr<PromptIterator>(new ShuffledIterator(std::move(items), seed));
}

}  // namespace roll
