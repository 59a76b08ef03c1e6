#include "roll/rewards/math_verifier.h"

#include <cctype>
#include <cstdint>
#include <regex>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"

namespace roll {
namespace {

// The content of the last `\boxed{...}` (or `\fbox{...}`), braces balanced.
std::optional<std::string> LastBoxed(const std::string& s) {
  size_t best = std::string::npos;
  size_t skip = 0;
  for (const char* cmd : {"\\boxed", "\\fbox"}) {
    size_t p = s.rfind(cmd);
    if (p != std::string::npos && (best == std::string::npos || p > best)) {
      best = p;
      skip = std::string(cmd).size();
    }
  }
  if (best == std::string::npos) return std::nullopt;
  size_t i = best + skip;
  while (i < s.size() && s[i] == ' ') ++i;
  if (i >= s.size()) return std::nullopt;
  if (s[i] != '{') {
    // "\boxed 5": up to the next space or `$`.
    size_t e = s.find_first_of(" $\n", i);
    return s.substr(i, e == std::string::npos ? std::string::npos : e - i);
  }
  int depth = 0;
  for (size_t j = i; j < s.size(); ++j) {
    if (s[j] == '{') ++depth;
    if (s[j] == '}' && --depth == 0) return s.substr(i + 1, j - i - 1);
  }
  return std::nullopt;  // unbalanced
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Exact rational from "12", "-0.50", ".5", "3/4", "1e3" (no exponent support:
// plain decimals only).
struct Rational {
  __int128 n = 0, d = 1;
};

std::optional<Rational> ParseDecimal(std::string s) {
  bool neg = false;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    neg = s[0] == '-';
    s = s.substr(1);
  }
  if (s.empty() || s.size() > 30) return std::nullopt;
  Rational r;
  bool dot = false, digit = false;
  for (char c : s) {
    if (c == '.') {
      if (dot) return std::nullopt;
      dot = true;
      continue;
    }
    if (!std::isdigit(static_cast<unsigned char>(c))) return std::nullopt;
    digit = true;
    r.n = r.n * 10 + (c - '0');
    if (dot) r.d *= 10;
  }
  if (!digit) return std::nullopt;
  if (neg) r.n = -r.n;
  return r;
}

std::optional<Rational> ParseNumber(const std::string& s) {
  const size_t slash = s.find('/');
  if (slash == std::string::npos) return ParseDecimal(s);
  auto a = ParseDecimal(s.substr(0, slash));
  auto b = ParseDecimal(s.substr(slash + 1));
  if (!a || !b || b->n == 0) return std::nullopt;
  return Rational{a->n * b->d, a->d * b->n};
}

bool Equal(const Rational& a, const Rational& b) { return a.n * b.d == b.n * a.d; }

// Replaces \frac{a}{b}, \dfrac{a}{b}, \tfrac{a}{b} and \dfrac12 by (a)/(b)
// without the parentheses when a and b are plain.
std::string Fractions(std::string s) {
  static const std::regex braced(R"(\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\})");
  static const std::regex bare(R"(\\[dt]?frac(\d)(\d))");
  s = std::regex_replace(s, braced, "$1/$2");
  s = std::regex_replace(s, bare, "$1/$2");
  return s;
}

}  // namespace

std::optional<std::string> ExtractFinalAnswer(const std::string& response,
                                              const MathVerifyOptions& options) {
  std::string text = response;
  if (size_t p = text.rfind("</think>"); p != std::string::npos) text = text.substr(p + 8);
  if (auto b = LastBoxed(text)) return *b;
  const std::string lower = Lower(text);
  size_t best = std::string::npos, len = 0;
  for (const char* marker : {"answer:", "the answer is", "####"}) {
    size_t p = lower.rfind(marker);
    if (p != std::string::npos && (best == std::string::npos || p > best)) {
      best = p;
      len = std::string(marker).size();
    }
  }
  if (best != std::string::npos) {
    std::string rest = text.substr(best + len);
    if (size_t nl = rest.find('\n'); nl != std::string::npos) rest = rest.substr(0, nl);
    // "The answer is: 7" and "answer:: 7" put a colon before the answer.
    rest = std::string(absl::StripAsciiWhitespace(rest));
    while (!rest.empty() && rest.front() == ':') {
      rest = std::string(absl::StripLeadingAsciiWhitespace(rest.substr(1)));
    }
    if (!rest.empty()) return rest;
  }
  if (!options.last_number_fallback) return std::nullopt;
  // Commas only as thousands separators, so "15, which" gives "15".
  static const std::regex number(R"(-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?|-?\.\d+)");
  std::optional<std::string> last;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), number); it != std::sregex_iterator(); ++it) {
    last = it->str();
  }
  return last;
}

std::string NormalizeMathAnswer(const std::string& answer) {
  std::string s = answer;
  static const std::regex text_cmd(R"(\\(?:text|mathrm|textbf|mbox)\{[^{}]*\})");
  s = std::regex_replace(s, text_cmd, "");
  s = absl::StrReplaceAll(s, {{"$", ""},
                              {"\\left", ""},
                              {"\\right", ""},
                              {"\\!", ""},
                              {"\\,", ""},
                              {"\\;", ""},
                              {"\\ ", ""},
                              {"^\\circ", ""},
                              {"^{\\circ}", ""},
                              {"\\%", ""},
                              {"%", ""},
                              {"\\displaystyle", ""}});
  s = Fractions(s);
  std::string out;
  for (char c : s) {
    if (!std::isspace(static_cast<unsigned char>(c))) out.push_back(c);
  }
  // Thousands separators: "1,000" but not "1,2" (a list).
  static const std::regex thousands(R"(^-?\d{1,3}(,\d{3})+(\.\d+)?$)");
  if (std::regex_match(out, thousands)) out = absl::StrReplaceAll(out, {{",", ""}});
  while (!out.empty() && out.back() == '.') out.pop_back();
  if (out.size() >= 2 && out.front() == '{' && out.back() == '}') out = out.substr(1, out.size() - 2);
  if (out.size() >= 2 && out.front() == '(' && out.back() == ')' && out.find(',') == std::string::npos) {
    out = out.substr(1, out.size() - 2);
  }
  return out;
}

MathVerifyResult VerifyMath(const std::string& response, const std::string& ground_truth,
                            const MathVerifyOptions& options) {
  MathVerifyResult r;
  r.extracted = ExtractFinalAnswer(response, options);
  r.normalized_truth = NormalizeMathAnswer(ground_truth);
  if (!r.extracted) {
    r.reason = "no final answer found";
    return r;
  }
  r.normalized_answer = NormalizeMathAnswer(*r.extracted);
  auto a = ParseNumber(r.normalized_answer);
  auto t = ParseNumber(r.normalized_truth);
  if (a && t) {
    r.correct = Equal(*a, *t);
  } else {
    r.correct = !r.normalized_answer.empty() && r.normalized_answer == r.normalized_truth;
  }
  r.reason = r.correct ? "correct"
                       : absl::StrCat("answer ", r.normalized_answer, " != ground truth ",
                                      r.normalized_truth);
  return r;
}

}  // namespace roll
