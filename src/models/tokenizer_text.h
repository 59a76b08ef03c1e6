#pragma once
// Text helpers private to the tokenizer: UTF-8 handling, the GPT-2
// byte-to-unicode table, NFC (ICU) and a PCRE2 regex wrapper. Everything here
// is stateless or immutable after construction, so safe to share across
// threads.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "roll/common/status.h"

namespace roll::tokenizer_internal {

// Reads one code point at `*pos` of valid UTF-8 and advances `*pos`.
char32_t NextCodePoint(std::string_view s, size_t* pos);
void AppendUtf8(char32_t cp, std::string* out);
// Byte length of the UTF-8 sequence starting with `lead` (1 for stray bytes).
inline size_t Utf8Length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

// True if `s` is well-formed UTF-8.
bool IsValidUtf8(std::string_view s);
// `s` with each maximal ill-formed subsequence replaced by U+FFFD (the
// Unicode "maximal subpart" practice, which Rust's from_utf8_lossy follows).
std::string ToValidUtf8(std::string_view s);

// GPT-2's reversible map from bytes to printable code points, as UTF-8.
const std::array<std::string, 256>& ByteToUnicode();
// The byte a code point stands for, or -1 if it is not in the map.
int UnicodeToByte(char32_t cp);

// Unicode NFC of valid UTF-8 text.
absl::StatusOr<std::string> NormalizeNfc(std::string_view s);

// A compiled PCRE2 pattern in UTF + UCP mode (so \s, \p{L}, case folding are
// Unicode-aware, as in the Oniguruma engine Hugging Face uses).
class Regex {
 public:
  static absl::StatusOr<std::shared_ptr<const Regex>> Compile(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends [begin, end) byte ranges of successive non-overlapping matches in
  // valid UTF-8 `text`.
  void FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* out) const;

 private:
  explicit Regex(void* code) : code_(code) {}
  void* code_;  // pcre2_code_8*, owned
};

// The pre-tokenizer regex of GPT-2 (ByteLevel with use_regex).
inline constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace roll::tokenizer_internal
