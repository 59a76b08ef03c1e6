#include "models/tokenizer_text.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <algorithm>

namespace roll::tokenizer_internal {
namespace {

// Length of the well-formed sequence at s[i], or 0 if ill-formed; *consumed is
// the length of its maximal well-formed prefix (at least 1) in that case.
size_t ValidSequenceAt(std::string_view s, size_t i, size_t* consumed) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  *consumed = 1;
  if (b0 < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k < need; ++k) {
    if (i + k >= s.size()) return 0;
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < lo || b > hi) return 0;
    lo = 0x80;
    hi = 0xBF;
    *consumed = k + 1;
  }
  return need;
}

}  // namespace

char32_t NextCodePoint(std::string_view s, size_t* pos) {
  const auto b0 = static_cast<unsigned char>(s[*pos]);
  const size_t n = std::min(Utf8Length(b0), s.size() - *pos);
  char32_t cp = n == 1 ? b0 : (b0 & (0x7F >> n));
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[*pos + k]) & 0x3F);
  *pos += n;
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsValidUtf8(std::string_view s) {
  size_t consumed;
  for (size_t i = 0; i < s.size();) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = ValidSequenceAt(s, i, &consumed);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string ToValidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t consumed;
  for (size_t i = 0; i < s.size();) {
    const size_t n = ValidSequenceAt(s, i, &consumed);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      i += consumed;
    } else {
      out.append(s.data() + i, n);
      i += n;
    }
  }
  return out;
}

namespace {

struct ByteTables {
  std::array<std::string, 256> to_unicode;
  std::array<int, 512> to_byte;  // every mapped code point is below 324
};

const ByteTables& Tables() {
  static const ByteTables* tables = [] {
    auto* t = new ByteTables;
    t->to_byte.fill(-1);
    // Printable Latin-1 bytes stand for themselves; the others are shifted
    // past 255 in byte order, so every byte gets a visible character.
    int shifted = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const char32_t cp = printable ? b : 256 + shifted++;
      AppendUtf8(cp, &t->to_unicode[b]);
      t->to_byte[cp] = b;
    }
    return t;
  }();
  return *tables;
}

}  // namespace

const std::array<std::string, 256>& ByteToUnicode() { return Tables().to_unicode; }

int UnicodeToByte(char32_t cp) {
  return cp < Tables().to_byte.size() ? Tables().to_byte[cp] : -1;
}

absl::StatusOr<std::string> NormalizeNfc(std::string_view s) {
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
    return std::string(s);  // ASCII is always NFC
  }
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* nfc = unorm2_getNFCInstance(&err);
  if (U_FAILURE(err)) return absl::InternalError(absl::StrCat("ICU NFC unavailable: ", u_errorName(err)));
  int32_t len16 = 0;
  u_strFromUTF8(nullptr, 0, &len16, s.data(), static_cast<int32_t>(s.size()), &err);
  if (err != U_BUFFER_OVERFLOW_ERROR && U_FAILURE(err)) {
    return absl::InvalidArgumentError(absl::StrCat("NFC: bad UTF-8: ", u_errorName(err)));
  }
  err = U_ZERO_ERROR;
  std::u16string in(len16, u'\0');
  u_strFromUTF8(reinterpret_cast<UChar*>(in.data()), len16, nullptr, s.data(), static_cast<int32_t>(s.size()), &err);
  // NFC never grows text by more than 3x in UTF-16 units.
  std::u16string norm(in.size() * 3 + 16, u'\0');
  const int32_t n = unorm2_normalize(nfc, reinterpret_cast<const UChar*>(in.data()), len16,
                                     reinterpret_cast<UChar*>(norm.data()),
                                     static_cast<int32_t>(norm.size()), &err);
  if (U_FAILURE(err)) return absl::InternalError(absl::StrCat("NFC failed: ", u_errorName(err)));
  int32_t len8 = 0;
  u_strToUTF8(nullptr, 0, &len8, reinterpret_cast<const UChar*>(norm.data()), n, &err);
  err = U_ZERO_ERROR;
  std::string out(len8, '\0');
  u_strToUTF8(out.data(), len8, nullptr, reinterpret_cast<const UChar*>(norm.data()), n, &err);
  if (U_FAILURE(err)) return absl::InternalError(absl::StrCat("NFC failed: ", u_errorName(err)));
  return out;
}

absl::StatusOr<std::shared_ptr<const Regex>> Regex::Compile(const std::string& pattern) {
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error_code, message, sizeof(message));
    return absl::InvalidArgumentError(absl::StrCat("regex does not compile at offset ", error_offset,
                                                   ": ", reinterpret_cast<char*>(message)));
  }
  // JIT is an optimisation only: if it is unavailable the interpreter runs.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return std::shared_ptr<const Regex>(new Regex(code));
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::FindAll(std::string_view text, std::vector<std::pair<size_t, size_t>>* out) const {
  auto* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0;
  while (offset < text.size()) {
    int rc = pcre2_match(code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, nullptr);
    }
    if (rc < 0) break;  // no further match (or a resource limit): the rest is a gap
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    size_t begin = ov[0], end = ov[1];
    if (end == begin) {
      if (begin >= text.size()) break;
      // An empty match splits nothing; step over one code point.
      offset = begin + Utf8Length(static_cast<unsigned char>(text[begin]));
      continue;
    }
    out->emplace_back(begin, end);
    offset = end;
  }
  pcre2_match_data_free(md);
}

}  // namespace roll::tokenizer_internal
