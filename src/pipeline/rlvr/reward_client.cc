#include "roll/pipeline/rlvr.h"

#include <ATen/ATen.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "roll/worker/batch_keys.h"

namespace roll {

absl::StatusOr<size_t> ClusterRewardClient::Route(const std::string& tag) const {
  std::optional<size_t> fallback;
  for (size_t i = 0; i < domains_.size(); ++i) {
    const auto& tags = domains_[i].tags;
    if (tags.empty()) {
      if (!fallback) fallback = i;
      continue;
    }
    if (std::find(tags.begin(), tags.end(), tag) != tags.end()) return i;
  }
  if (fallback) return *fallback;
  std::vector<std::string> names;
  for (const auto& d : domains_) names.push_back(absl::StrCat("rewards.", d.name));
  return absl::InvalidArgumentError(absl::StrCat(
      "no reward domain takes samples tagged '", tag, "' (tag_included of ",
      absl::StrJoin(names, ", "), "); add the tag to one of them"));
}

absl::Status ClusterRewardClient::Submit(std::vector<SampleResult> samples) {
  std::vector<std::vector<SampleResult>> per_domain(domains_.size());
  for (SampleResult& s : samples) {
    ROLL_ASSIGN_OR_RETURN(size_t d, Route(s.tag));
    per_domain[d].push_back(std::move(s));
  }
  for (size_t d = 0; d < domains_.size(); ++d) {
    if (per_domain[d].empty()) continue;
    std::vector<std::string> text, truth, tag;
    for (const SampleResult& s : per_domain[d]) {
      text.push_back(s.response_text);
      truth.push_back(s.ground_truth);
      tag.push_back(s.tag);
    }
    Batch b;
    b.SetColumn(keys::kResponseText, std::move(text));
    b.SetColumn(keys::kGroundTruth, std::move(truth));
    b.SetColumn(keys::kTag, std::move(tag));
    CallHandle h = domains_[d].cluster->Call(reward::kComputeRewards, b);
    inflight_.push_back(InFlight{d, std::move(b), std::move(h), std::move(per_domain[d])});
  }
  return absl::OkStatus();
}

absl::Status ClusterRewardClient::Recover(InFlight failed, const absl::Status& why) {
  const size_t d = failed.domain;
  if (!restart_ || !LostAWorker(*domains_[d].cluster)) return why;
  Cluster<RewardApi>* cluster = domains_[d].cluster;
  ROLL_RETURN_IF_ERROR(restart_(*cluster, why).status());
  // The failed request and every other one of this domain go to the
  // cluster again (a request on a replaced rank died with it).
  std::vector<InFlight> again{std::move(failed)};
  for (size_t i = 0; i < inflight_.size();) {
    if (inflight_[i].domain == d) {
      again.push_back(std::move(inflight_[i]));
      inflight_.erase(inflight_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  for (InFlight& f : again) {
    f.handle = cluster->Call(reward::kComputeRewards, f.request);
    inflight_.push_back(std::move(f));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SampleResult>> ClusterRewardClient::Poll(bool block) {
  std::vector<SampleResult> out;
  if (block && !inflight_.empty()) {
    bool any = std::any_of(inflight_.begin(), inflight_.end(),
                           [](const InFlight& f) { return f.handle.Done(); });
    // Its outcome, failure included, is handled below.
    if (!any) inflight_.front().handle.Wait().IgnoreError();
  }
  for (size_t i = 0; i < inflight_.size();) {
    if (!inflight_[i].handle.Done()) {
      ++i;
      continue;
    }
    InFlight f = std::move(inflight_[i]);
    inflight_.erase(inflight_.begin() + static_cast<std::ptrdiff_t>(i));
    absl::StatusOr<Batch> got = f.handle.Get();
    if (!got.ok()) {
      ROLL_RETURN_IF_ERROR(Recover(std::move(f), got.status()));
      i = 0;  // the retried requests were appended; rescan
      continue;
    }
    Batch reply = *std::move(got);
    ROLL_ASSIGN_OR_RETURN(at::Tensor scores, reply.Tensor(keys::kScores));
    if (scores.size(0) != static_cast<int64_t>(f.samples.size())) {
      return absl::InternalError(absl::StrCat("reward worker returned ", scores.size(0),
                                              " scores for ", f.samples.size(), " samples"));
    }
    scores = scores.to(at::kDouble).contiguous();
    const std::vector<std::string>* reasons = nullptr;
    if (auto c = reply.Column(keys::kRewardReason); c.ok()) reasons = *c;
    const std::vector<std::string>* extracted = nullptr;
    if (auto c = reply.Column(keys::kExtractedAnswer); c.ok()) extracted = *c;
    for (size_t j = 0; j < f.samples.size(); ++j) {
      f.samples[j].score = scores[static_cast<int64_t>(j)].item<double>();
      if (reasons) f.samples[j].reward_reason = (*reasons)[j];
      if (extracted) f.samples[j].extracted_answer = (*extracted)[j];
      out.push_back(std::move(f.samples[j]));
    }
  }
  return out;
}

}  // namespace roll
