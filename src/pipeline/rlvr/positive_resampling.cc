// ScaleRL's No-Positive-Resampling: prompts the policy already solves
// leave the training set.

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "roll/pipeline/rlvr.h"

namespace roll {

void PositiveResampling::Observe(const std::string& id, int64_t correct, int64_t samples) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& [c, n] = history_[id];
  c += correct;
  n += samples;
  if (n > 0 && static_cast<double>(c) >= threshold_ * static_cast<double>(n)) retired_.insert(id);
}

bool PositiveResampling::Retired(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return retired_.count(id) > 0;
}

int64_t PositiveResampling::retired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(retired_.size());
}

absl::StatusOr<PromptItem> PositiveResampling::Next(PromptIterator* it, int64_t limit) {
  for (int64_t skipped = 0;; ++skipped) {
    if (skipped >= limit) {
      return absl::FailedPreconditionError(absl::StrCat(
          "No-Positive-Resampling: every training prompt reached pass rate ", threshold_,
          " (positive_pass_rate); none is left to train on"));
    }
    ROLL_ASSIGN_OR_RETURN(PromptItem p, it->Next());
    if (!Retired(p.id)) return p;
  }
}

std::string PositiveResampling::StateJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json j;
  j["threshold"] = threshold_;
  j["history"] = nlohmann::json::object();
  for (const auto& [id, cn] : history_) j["history"][id] = {cn.first, cn.second};
  return j.dump();
}

absl::Status PositiveResampling::RestoreJson(const std::string& json) {
  std::lock_guard<std::mutex> lock(mu_);
  try {
    const nlohmann::json j = nlohmann::json::parse(json);
    history_.clear();
    retired_.clear();
    for (const auto& [id, cn] : j.at("history").items()) {
      const int64_t c = cn.at(0).get<int64_t>(), n = cn.at(1).get<int64_t>();
      if (c < 0 || n < c) return absl::InvalidArgumentError(absl::StrCat("prompt '", id, "': ", c, " of ", n));
      history_[id] = {c, n};
      if (n > 0 && static_cast<double>(c) >= threshold_ * static_cast<double>(n)) retired_.insert(id);
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
  return absl::OkStatus();
}

}  // namespace roll
