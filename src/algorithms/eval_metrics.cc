#include "roll/algorithms/eval_metrics.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace roll {

absl::StatusOr<double> PassAtK(int64_t n, int64_t c, int64_t k) {
  if (n < 1 || c < 0 || c > n || k < 1 || k > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("pass@k needs 0 <= c <= n and 1 <= k <= n; got n=", n, ", c=", c, ", k=", k));
  }
  if (n - c < k) return 1.0;  // every k-subset holds a correct sample
  // C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i)
  double fail = 1.0;
  for (int64_t i = n - c + 1; i <= n; ++i) fail *= 1.0 - static_cast<double>(k) / static_cast<double>(i);
  return 1.0 - fail;
}

absl::StatusOr<SupportChange> CompareSupport(const std::vector<bool>& a, const std::vector<bool>& b) {
  if (a.size() != b.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("support change: the models were scored on ", a.size(), " and ", b.size(), " prompts"));
  }
  SupportChange s;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] && b[i]) ++s.preserved;
    else if (a[i]) ++s.shrunk;
    else if (b[i]) ++s.expanded;
    else ++s.neither;
  }
  const double P = static_cast<double>(s.preserved), S = static_cast<double>(s.shrunk),
               E = static_cast<double>(s.expanded);
  s.srr = P + S > 0 ? P / (P + S) : 0.0;
  s.ndr = P + E > 0 ? E / (P + E) : 0.0;
  s.sds = s.srr + s.ndr > 0 ? 2 * s.srr * s.ndr / (s.srr + s.ndr) : 0.0;
  s.nscr = P + E + S > 0 ? (E - S) / (P + E + S) : 0.0;
  return s;
}

double AnswerEntropy(const std::vector<std::string>& answers) {
  if (answers.empty()) return 0.0;
  std::map<std::string, int64_t> counts;
  for (const std::string& a : answers) ++counts[a];
  const double n = static_cast<double>(answers.size());
  double h = 0;
  for (const auto& [answer, count] : counts) {
    const double p = static_cast<double>(count) / n;
    h -= p * std::log(p);
  }
  return h;
}

void CollapseDetector::Observe(int64_t step, double reward_accuracy) {
  if (collapse_step_ >= 0) return;
  window_.emplace_back(step, reward_accuracy);
  if (static_cast<int64_t>(window_.size()) > patience_) window_.erase(window_.begin());
  if (static_cast<int64_t>(window_.size()) < patience_) return;
  double sum = 0;
  for (const auto& [s, a] : window_) sum += a;
  if (sum / static_cast<double>(patience_) < threshold_) collapse_step_ = window_.front().first;
}

}  // namespace roll
