#pragma once
// The math rule verifier: extracts the final answer of a response and
// compares it with the ground truth by value.
//
// Extraction, in order: only the text after the last `</think>` counts when
// there is one; the last `\boxed{...}` / `\fbox{...}` (balanced braces); the
// text after the last "answer:" / "the answer is" / "####"; else (option,
// default on) the last number in the text.
// Normalization: `$`, `\left`, `\right`, `\!`, `\,`, `^\circ`, `\%`, `\text{...}`,
// thousands separators and a trailing period are removed;
// `\frac{a}{b}`, `\dfrac{a}{b}`, `\dfrac12` and `a/b` become fractions.
// Two answers that are both numbers (integers, decimals, fractions) are equal
// when they are equal as exact rationals; otherwise the normalized strings
// must match. Thread-safe (pure functions).

#include <optional>
#include <string>

namespace roll {

struct MathVerifyOptions {
  bool last_number_fallback = true;  // default true
};

struct MathVerifyResult {
  bool correct = false;
  std::optional<std::string> extracted;  // nullopt: no answer found
  std::string normalized_answer, normalized_truth;
  std::string reason;
};

std::optional<std::string> ExtractFinalAnswer(const std::string& response,
                                              const MathVerifyOptions& options = {});
std::string NormalizeMathAnswer(const std::string& answer);
MathVerifyResult VerifyMath(const std::string& response, const std::string& ground_truth,
                            const MathVerifyOptions& options = {});

}  // namespace roll
