#include "roll/pipeline/generation_client.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "roll/worker/batch_keys.h"

namespace roll {

GenParams RolloutGenParams(const PipelineConfig& config) {
  const GeneratingArgs& g = config.actor_infer.generating_args;
  GenParams p;
  p.n = config.num_return_sequences_in_group;
  p.temperature = g.do_sample ? g.temperature : 0.0;
  p.top_p = g.top_p;
  p.top_k = g.top_k;
  p.max_new_tokens = std::min(g.max_new_tokens, config.response_length);
  return p;
}

absl::Status ClusterGenerationClient::Submit(const std::vector<std::vector<GenRequest>>& per_worker,
                                             const GenParams& params) {
  for (size_t w = 0; w < per_worker.size(); ++w) {
    for (const GenRequest& r : per_worker[w]) pending_[r.key] = Pending{r, params, static_cast<int>(w), {}, false};
  }
  return Handle(WaitOutcome(StartSubmit(per_worker, params), *infer_));
}

absl::Status ClusterGenerationClient::Handle(const CallOutcome& outcome) {
  if (outcome.status.ok() || !outcome.only_dead) return outcome.status;
  return Recover(outcome.status);
}

absl::Status ClusterGenerationClient::Recover(absl::Status why) {
  std::set<std::string> owed;  // requests a replaced rank has not accepted yet
  bool aborts_owed = false;
  while (true) {
    if (!restart_ || !LostAWorker(*infer_)) return why;
    ROLL_ASSIGN_OR_RETURN(const std::vector<int> replaced, restart_(*infer_, why));
    const std::set<int> fresh(replaced.begin(), replaced.end());
    for (const auto& [key, p] : pending_) {
      if (!fresh.count(p.worker % infer_->world_size())) continue;
      owed.insert(key);
      aborts_owed = aborts_owed || p.aborted;
    }
    CallOutcome o = ResubmitOwed(&owed);
    if (o.status.ok() && aborts_owed) {
      // Abort again what was aborted before: idempotent on every rank.
      std::vector<std::string> aborted;
      for (const auto& [key, p] : pending_) {
        if (p.aborted) aborted.push_back(key);
      }
      Batch b;
      b.SetColumn(keys::kRequestKey, aborted);
      o = WaitOutcome(infer_->Call(actor::kAbort, b), *infer_);
      if (o.status.ok()) aborts_owed = false;
    }
    if (o.status.ok()) return absl::OkStatus();
    if (!o.only_dead) return o.status;
    why = o.status;  // another rank died meanwhile: replace it too, then go on
  }
}

CallOutcome ClusterGenerationClient::ResubmitOwed(std::set<std::string>* owed) {
  const int world = infer_->world_size();
  while (!owed->empty()) {
    // One submit per distinct sampling setting; each request to its rank.
    const GenParams params = pending_.at(*owed->begin()).params;
    std::vector<std::vector<GenRequest>> per_worker(world);
    std::vector<std::vector<std::string>> keys(world);
    for (const std::string& key : *owed) {
      const Pending& p = pending_.at(key);
      if (!(p.params == params)) continue;
      per_worker[p.worker % world].push_back(p.request);
      keys[p.worker % world].push_back(key);
    }
    CallOutcome o = WaitOutcome(StartSubmit(per_worker, params), *infer_);
    for (size_t w = 0; w < o.ok.size(); ++w) {
      if (!o.ok[w]) continue;
      for (const std::string& key : keys[w]) owed->erase(key);
    }
    if (!o.status.ok()) return o;
  }
  return CallOutcome();
}

namespace {

// Token-in requests: their ids [N, P] (padded with 0) and lengths [N] (0:
// the row's text prompt is used). Left out when no request has ids.
void SetTokenPrompts(const std::vector<GenRequest>& reqs, Batch* b) {
  int64_t max_p = 0;
  for (const GenRequest& r : reqs) max_p = std::max<int64_t>(max_p, static_cast<int64_t>(r.prompt_ids.size()));
  if (max_p == 0) return;
  const int64_t n = static_cast<int64_t>(reqs.size());
  at::Tensor ids = at::zeros({n, max_p}, at::kLong), len = at::zeros({n}, at::kLong);
  int64_t* pi = ids.data_ptr<int64_t>();
  int64_t* pl = len.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<int64_t>& p = reqs[i].prompt_ids;
    std::copy(p.begin(), p.end(), pi + i * max_p);
    pl[i] = static_cast<int64_t>(p.size());
  }
  b->SetTensor(keys::kPromptTokenIds, ids);
  b->SetTensor(keys::kPromptTokenLen, len);
}

}  // namespace

CallHandle ClusterGenerationClient::StartSubmit(const std::vector<std::vector<GenRequest>>& per_worker,
                                                const GenParams& params) {
  std::vector<Batch> inputs(per_worker.size());
  for (size_t w = 0; w < per_worker.size(); ++w) {
    const auto& reqs = per_worker[w];
    if (reqs.empty()) continue;
    std::vector<std::string> keys, prompts;
    at::Tensor seeds = at::empty({static_cast<int64_t>(reqs.size())}, at::kLong);
    for (size_t i = 0; i < reqs.size(); ++i) {
      keys.push_back(reqs[i].key);
      prompts.push_back(reqs[i].prompt);
      seeds[static_cast<int64_t>(i)] = static_cast<int64_t>(reqs[i].seed);
    }
    Batch& b = inputs[w];
    b.SetColumn(keys::kRequestKey, std::move(keys));
    b.SetColumn(keys::kPrompt, std::move(prompts));
    b.SetTensor(keys::kSeed, seeds);
    SetTokenPrompts(reqs, &b);
    b.SetMeta(keys::kN, absl::StrCat(params.n));
    b.SetMeta(keys::kTemperature, absl::StrCat(params.temperature));
    b.SetMeta(keys::kTopP, absl::StrCat(params.top_p));
    b.SetMeta(keys::kTopK, absl::StrCat(params.top_k));
    b.SetMeta(keys::kMaxNewTokens, absl::StrCat(params.max_new_tokens));
    if (!params.interrupt_text.empty()) {
      b.SetMeta(keys::kInterruptText, params.interrupt_text);
      b.SetMeta(keys::kInterruptMin, absl::StrCat(params.interrupt_min));
      b.SetMeta(keys::kInterruptMax, absl::StrCat(params.interrupt_max));
      b.SetMeta(keys::kAnswerBudget, absl::StrCat(params.answer_budget));
    }
  }
  return infer_->CallEach(actor::kSubmit, std::move(inputs));
}

absl::StatusOr<std::vector<SampleResult>> ClusterGenerationClient::Poll(absl::Duration wait) {
  std::vector<Batch> inputs(infer_->world_size());
  for (Batch& b : inputs) b.SetMeta(keys::kWaitMs, absl::StrCat(absl::ToInt64Milliseconds(wait)));
  CallHandle call = infer_->CallEach(actor::kPoll, std::move(inputs));
  // The samples of the ranks that answered are handed out even when another
  // rank died (they left those ranks' engines); the dead rank's requests are
  // retried.
  const CallOutcome outcome = WaitOutcome(call, *infer_);
  std::vector<Batch> replies = call.EachReply();
  std::vector<SampleResult> out;
  for (size_t k = 0; k < replies.size() && k < outcome.ok.size(); ++k) {
    const Batch& r = replies[k];
    if (!outcome.ok[k] || r.empty()) continue;
    ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* keys, r.Column(keys::kRequestKey));
    ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* reasons, r.Column(keys::kFinishReason));
    ROLL_ASSIGN_OR_RETURN(const std::vector<std::string>* texts, r.Column(keys::kResponseText));
    ROLL_ASSIGN_OR_RETURN(at::Tensor pids, r.Tensor(keys::kPromptIds));
    ROLL_ASSIGN_OR_RETURN(at::Tensor plen, r.Tensor(keys::kPromptLen));
    ROLL_ASSIGN_OR_RETURN(at::Tensor rids, r.Tensor(keys::kResponseIds));
    ROLL_ASSIGN_OR_RETURN(at::Tensor rlen, r.Tensor(keys::kResponseLen));
    ROLL_ASSIGN_OR_RETURN(at::Tensor lps, r.Tensor(keys::kResponseLogprobs));
    ROLL_ASSIGN_OR_RETURN(at::Tensor ents, r.Tensor(keys::kResponseEntropy));
    ROLL_ASSIGN_OR_RETURN(at::Tensor certs, r.Tensor(keys::kResponseSelfCertainty));
    ROLL_ASSIGN_OR_RETURN(at::Tensor sidx, r.Tensor(keys::kSampleIndex));
    ROLL_ASSIGN_OR_RETURN(at::Tensor ver, r.Tensor(keys::kWeightVersion));
    ROLL_ASSIGN_OR_RETURN(at::Tensor cached, r.Tensor(keys::kCachedTokens));
    ROLL_ASSIGN_OR_RETURN(at::Tensor tver, r.Tensor(keys::kResponseVersions));
    tver = tver.contiguous().to(at::kLong);
    // Only when some sample of the reply was interrupted.
    at::Tensor forced;
    if (r.HasTensor(keys::kResponseForced)) forced = r.Tensor(keys::kResponseForced)->contiguous().to(at::kLong);
    pids = pids.contiguous();
    rids = rids.contiguous();
    lps = lps.contiguous().to(at::kFloat);
    ents = ents.contiguous().to(at::kFloat);
    certs = certs.contiguous().to(at::kFloat);
    for (int64_t i = 0; i < r.size(); ++i) {
      auto it = pending_.find((*keys)[i]);
      const int64_t index = sidx[i].item<int64_t>();
      // Not ours, or handed out before a restart retried its request.
      if (it == pending_.end() || !it->second.returned.insert(index).second) continue;
      const bool interrupting = !it->second.params.interrupt_text.empty();
      if (static_cast<int64_t>(it->second.returned.size()) >= it->second.params.n) pending_.erase(it);
      SampleResult s;
      s.request_key = (*keys)[i];
      s.finish_reason = (*reasons)[i];
      s.response_text = (*texts)[i];
      s.sample_index = sidx[i].item<int64_t>();
      s.weight_version = ver[i].item<int64_t>();
      s.cached_prompt_tokens = cached[i].item<int64_t>();
      const int64_t pl = plen[i].item<int64_t>(), rl = rlen[i].item<int64_t>();
      const int64_t* pp = pids[i].data_ptr<int64_t>();
      const int64_t* rp = rids[i].data_ptr<int64_t>();
      const float* lp = lps[i].data_ptr<float>();
      s.prompt_ids.assign(pp, pp + pl);
      s.response_ids.assign(rp, rp + rl);
      s.logprobs.assign(lp, lp + rl);
      const float* ep = ents[i].data_ptr<float>();
      const float* cp = certs[i].data_ptr<float>();
      s.entropies.assign(ep, ep + rl);
      s.self_certainties.assign(cp, cp + rl);
      const int64_t* vp = tver[i].data_ptr<int64_t>();
      s.token_versions.assign(vp, vp + rl);
      if (interrupting && forced.defined()) {
        const int64_t* fp = forced[i].data_ptr<int64_t>();
        s.forced.assign(fp, fp + rl);
      }
      out.push_back(std::move(s));
    }
  }
  ROLL_RETURN_IF_ERROR(Handle(outcome));
  return out;
}

absl::Status ClusterGenerationClient::Abort(const std::vector<std::string>& keys) {
  for (const std::string& k : keys) {
    if (auto it = pending_.find(k); it != pending_.end()) it->second.aborted = true;
  }
  Batch b;
  b.SetColumn(keys::kRequestKey, keys);
  return Handle(WaitOutcome(infer_->Call(actor::kAbort, b), *infer_));
}

}  // namespace roll
