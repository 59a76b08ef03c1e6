#include "common/config_schema.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace roll::config_internal {
namespace {

// Shortest "%g" text that reads back as exactly `v`.
std::string FormatNumber(double v) {
  char buf[64];
  // Whole numbers read better as "600" than as "6e+02".
  if (v == std::floor(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof(buf), "%.0f", v);
    return buf;
  }
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof(buf), "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string ItemPath(const std::string& path, size_t i) { return absl::StrCat(path, "[", i, "]"); }

}  // namespace

std::string JoinPath(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : absl::StrCat(prefix, ".", key);
}

bool Range::Contains(double v) const {
  if (min && (min_open ? v <= *min : v < *min)) return false;
  if (max && (max_open ? v >= *max : v > *max)) return false;
  return true;
}

std::string Range::Text() const {
  if (min && max) {
    return absl::StrCat(min_open ? "(" : "[", FormatNumber(*min), ", ", FormatNumber(*max),
                        max_open ? ")" : "]");
  }
  if (min) return absl::StrCat(min_open ? "> " : ">= ", FormatNumber(*min));
  if (max) return absl::StrCat(max_open ? "< " : "<= ", FormatNumber(*max));
  return "";
}

bool ParseInt64(const ConfigNode& n, const std::string& path, ParseContext& ctx, int64_t* out) {
  if (n.IsScalar() && absl::SimpleAtoi(absl::StripAsciiWhitespace(n.scalar), out)) return true;
  ctx.diag->Error(n.origin, path, absl::StrCat("expected integer, got ", n.Describe()));
  return false;
}

bool ParseDouble(const ConfigNode& n, const std::string& path, ParseContext& ctx, double* out) {
  if (n.IsScalar() && absl::SimpleAtod(absl::StripAsciiWhitespace(n.scalar), out) &&
      std::isfinite(*out)) {
    return true;
  }
  ctx.diag->Error(n.origin, path, absl::StrCat("expected number, got ", n.Describe()));
  return false;
}

bool ParseBool(const ConfigNode& n, const std::string& path, ParseContext& ctx, bool* out) {
  if (n.IsScalar()) {
    std::string v = absl::AsciiStrToLower(absl::StripAsciiWhitespace(n.scalar));
    if (v == "true" || v == "yes" || v == "on") {
      *out = true;
      return true;
    }
    if (v == "false" || v == "no" || v == "off") {
      *out = false;
      return true;
    }
  }
  ctx.diag->Error(n.origin, path, absl::StrCat("expected boolean (true or false), got ",
                                               n.Describe()));
  return false;
}

bool ParseString(const ConfigNode& n, const std::string& path, ParseContext& ctx,
                 std::string* out) {
  if (n.IsNull()) {
    out->clear();
    return true;
  }
  if (n.IsScalar()) {
    *out = n.scalar;
    return true;
  }
  ctx.diag->Error(n.origin, path, absl::StrCat("expected string, got ", n.Describe()));
  return false;
}

bool ParseStringList(const ConfigNode& n, const std::string& path, ParseContext& ctx,
                     std::vector<std::string>* out) {
  out->clear();
  if (n.IsNull()) return true;
  if (!n.IsSequence()) {
    ctx.diag->Error(n.origin, path, absl::StrCat("expected a list of strings, got ", n.Describe()));
    return false;
  }
  bool ok = true;
  for (size_t i = 0; i < n.children.size(); ++i) {
    const ConfigNode& item = n.children[i];
    if (!item.IsScalar()) {
      ctx.diag->Error(item.origin, ItemPath(path, i),
                      absl::StrCat("expected string, got ", item.Describe()));
      ok = false;
      continue;
    }
    out->push_back(item.scalar);
  }
  return ok;
}

namespace {

// "list(range(a,b))", "list(range(a,b,step))" or "list(range(n))".
bool ParseRangeForm(const std::string& text, std::vector<int>* out, std::string* why) {
  std::string s;
  for (char c : text) {
    if (!absl::ascii_isspace(static_cast<unsigned char>(c))) s.push_back(c);
  }
  absl::string_view body = s;
  if (!absl::ConsumePrefix(&body, "list(range(") || !absl::ConsumeSuffix(&body, "))")) {
    *why = "expected a list of integers or \"list(range(a,b[,step]))\"";
    return false;
  }
  std::vector<std::string> args = absl::StrSplit(body, ',');
  std::vector<int64_t> nums;
  for (const std::string& a : args) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(a, &v) || v < -1000000 || v > 1000000) {
      *why = absl::StrCat("range argument '", a, "' is not a small integer");
      return false;
    }
    nums.push_back(v);
  }
  if (nums.empty() || nums.size() > 3) {
    *why = "range() takes 1 to 3 arguments";
    return false;
  }
  int64_t start = nums.size() == 1 ? 0 : nums[0];
  int64_t stop = nums.size() == 1 ? nums[0] : nums[1];
  int64_t step = nums.size() == 3 ? nums[2] : 1;
  if (step == 0) {
    *why = "range() step must not be 0";
    return false;
  }
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    out->push_back(static_cast<int>(i));
  }
  if (out->empty()) {
    *why = absl::StrCat("range(", start, ", ", stop, ", ", step, ") is empty");
    return false;
  }
  return true;
}

}  // namespace

bool ParseDeviceMapping(const ConfigNode& n, const std::string& path, ParseContext& ctx,
                        std::vector<int>* out) {
  out->clear();
  bool ok = true;
  if (n.IsNull()) return true;
  if (n.IsScalar()) {
    std::string why;
    if (!ParseRangeForm(n.scalar, out, &why)) {
      ctx.diag->Error(n.origin, path, absl::StrCat(why, ", got ", n.Describe()));
      return false;
    }
  } else if (n.IsSequence()) {
    for (size_t i = 0; i < n.children.size(); ++i) {
      int64_t v = 0;
      if (!ParseInt64(n.children[i], ItemPath(path, i), ctx, &v)) {
        ok = false;
        continue;
      }
      if (v > std::numeric_limits<int>::max() || v < std::numeric_limits<int>::min()) {
        ctx.diag->Error(n.children[i].origin, ItemPath(path, i), "device index is too large");
        ok = false;
        continue;
      }
      out->push_back(static_cast<int>(v));
    }
  } else {
    ctx.diag->Error(n.origin, path,
                    absl::StrCat("expected a list of integers or \"list(range(a,b[,step]))\", got ",
                                 n.Describe()));
    return false;
  }
  std::set<int> seen;
  for (size_t i = 0; i < out->size(); ++i) {
    int d = (*out)[i];
    if (d < 0) {
      ctx.diag->Error(n.origin, path, absl::StrCat("device index ", d, " must be >= 0"));
      ok = false;
    } else if (!seen.insert(d).second) {
      ctx.diag->Error(n.origin, path,
                      absl::StrCat("device ", d, " is listed more than once; a cluster uses each "
                                   "device once"));
      ok = false;
    }
  }
  return ok;
}

bool CheckRange(double v, const Range& range, const ConfigNode& n, const std::string& path,
                ParseContext& ctx) {
  if (range.Contains(v)) return true;
  ctx.diag->Error(n.origin, path, absl::StrCat("value ", FormatNumber(v),
                                               " is out of range: must be ", range.Text()));
  return false;
}

void EmitDouble(YAML::Emitter& e, double v) {
  std::string s = FormatNumber(v);
  if (s.find_first_of(".eni") == std::string::npos) s += ".0";
  e << s;
}

void EmitString(YAML::Emitter& e, const std::string& s) {
  // Plain scalars that YAML reads as null would not reload as this string.
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") {
    e << YAML::DoubleQuoted << s;
  } else {
    e << s;
  }
}

void EmitIntList(YAML::Emitter& e, const std::vector<int>& v) {
  e << YAML::Flow << YAML::BeginSeq;
  for (int x : v) e << x;
  e << YAML::EndSeq;
}

void EmitStringList(YAML::Emitter& e, const std::vector<std::string>& v) {
  e << YAML::Flow << YAML::BeginSeq;
  for (const std::string& s : v) EmitString(e, s);
  e << YAML::EndSeq;
}

}  // namespace roll::config_internal
