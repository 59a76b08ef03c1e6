#include "common/config_tree.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace roll::config_internal {
namespace fs = std::filesystem;

std::string FormatOrigin(const Origin& origin) {
  if (origin.line <= 0) return origin.source;
  return absl::StrCat(origin.source, ":", origin.line, ":", origin.col);
}

ConfigNode* ConfigNode::Find(std::string_view k) {
  if (type != Type::kMap) return nullptr;
  for (ConfigNode& c : children) {
    if (c.key == k) return &c;
  }
  return nullptr;
}

const ConfigNode* ConfigNode::Find(std::string_view k) const {
  return const_cast<ConfigNode*>(this)->Find(k);
}

bool ConfigNode::Erase(std::string_view k) {
  if (type != Type::kMap) return false;
  auto it = std::find_if(children.begin(), children.end(),
                         [&](const ConfigNode& c) { return c.key == k; });
  if (it == children.end()) return false;
  children.erase(it);
  return true;
}

std::string ConfigNode::Describe() const {
  switch (type) {
    case Type::kNull:
      return "null";
    case Type::kMap:
      return "a map";
    case Type::kSequence:
      return "a list";
    case Type::kScalar:
      break;
  }
  return absl::StrCat("'", scalar, "'");
}

void Diagnostics::Error(const Origin& origin, const std::string& key_path,
                        const std::string& message) {
  std::string line = FormatOrigin(origin);
  if (!key_path.empty()) absl::StrAppend(&line, ": ", key_path);
  absl::StrAppend(&line, ": ", message);
  if (seen_.insert(line).second) lines_.push_back(std::move(line));
}

absl::Status Diagnostics::ToStatus() const {
  if (lines_.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(lines_, "\n"));
}

namespace {

Origin MarkOrigin(const YAML::Mark& mark, const std::string& source, const Origin& fallback) {
  if (mark.line < 0) return fallback;
  return Origin{source, mark.line + 1, mark.column + 1};
}

// `fixed` (overrides) gives every node the same origin instead of marks.
ConfigNode Convert(const YAML::Node& n, const std::string& source, const Origin& fallback,
                   const Origin* fixed, Diagnostics* diag) {
  ConfigNode out;
  out.origin = fixed ? *fixed : MarkOrigin(n.Mark(), source, fallback);
  // yaml-cpp marks an empty value at the next token; the key is clearer.
  if (n.IsNull() || !n.IsDefined()) {
    out.origin = fallback;
    return out;
  }
  if (n.IsScalar()) {
    out.type = ConfigNode::Type::kScalar;
    out.scalar = n.Scalar();
  } else if (n.IsSequence()) {
    out.type = ConfigNode::Type::kSequence;
    for (const YAML::Node& item : n) {
      ConfigNode child = Convert(item, source, out.origin, fixed, diag);
      child.key_origin = child.origin;
      out.children.push_back(std::move(child));
    }
  } else if (n.IsMap()) {
    out.type = ConfigNode::Type::kMap;
    for (auto it = n.begin(); it != n.end(); ++it) {
      Origin key_origin = fixed ? *fixed : MarkOrigin(it->first.Mark(), source, out.origin);
      if (!it->first.IsScalar()) {
        diag->Error(key_origin, "", "map keys must be plain strings");
        continue;
      }
      std::string key = it->first.Scalar();
      if (out.Find(key) != nullptr) {
        diag->Error(key_origin, key, "duplicate key");
        continue;
      }
      ConfigNode child = Convert(it->second, source, key_origin, fixed, diag);
      child.key = std::move(key);
      child.key_origin = key_origin;
      out.children.push_back(std::move(child));
    }
  }
  return out;
}

ConfigNode EmptyMap(const Origin& origin) {
  ConfigNode m;
  m.type = ConfigNode::Type::kMap;
  m.origin = origin;
  m.key_origin = origin;
  return m;
}

std::string Canonical(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(fs::path(path), ec);
  return ec ? path : p.string();
}

}  // namespace

ConfigNode ParseYamlText(std::string_view text, const std::string& source, Diagnostics* diag) {
  Origin top{source, 1, 1};
  try {
    YAML::Node n = YAML::Load(std::string(text));
    ConfigNode out = Convert(n, source, top, nullptr, diag);
    if (out.IsNull()) out = EmptyMap(top);
    return out;
  } catch (const YAML::Exception& e) {
    diag->Error(MarkOrigin(e.mark, source, top), "", absl::StrCat("YAML syntax error: ", e.msg));
  }
  return ConfigNode{};
}

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    return absl::NotFoundError(absl::StrCat("cannot read '", path, "': it is a directory"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read '", path, "': ", std::strerror(errno)));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

namespace {

// `stack` holds the canonical paths of the files being loaded.
ConfigNode LoadRecursive(std::string_view text, const std::string& source,
                         std::vector<std::string>* stack, Diagnostics* diag) {
  Origin top{source, 1, 1};
  ConfigNode root = ParseYamlText(text, source, diag);
  if (root.IsNull()) return EmptyMap(top);  // syntax error, already reported
  if (!root.IsMap()) {
    diag->Error(root.origin, "", absl::StrCat("expected a map of keys at the top level, got ",
                                              root.Describe()));
    return EmptyMap(top);
  }
  ConfigNode merged = EmptyMap(top);
  if (const ConfigNode* defaults = root.Find("defaults")) {
    std::vector<ConfigNode> items;
    if (defaults->IsSequence()) {
      items = defaults->children;
    } else if (defaults->IsScalar()) {
      items.push_back(*defaults);
    } else if (!defaults->IsNull()) {
      diag->Error(defaults->origin, "defaults",
                  absl::StrCat("expected a list of file paths, got ", defaults->Describe()));
    }
    fs::path dir = fs::path(source).parent_path();
    for (const ConfigNode& item : items) {
      if (!item.IsScalar()) {
        diag->Error(item.origin, "defaults",
                    absl::StrCat("expected a file path, got ", item.Describe()));
        continue;
      }
      fs::path p(item.scalar);
      if (p.is_relative()) p = dir / p;
      std::error_code ec;
      if (!fs::exists(p, ec) && p.extension() != ".yaml" && p.extension() != ".yml") {
        fs::path with_ext = p;
        with_ext += ".yaml";
        if (fs::exists(with_ext, ec)) p = with_ext;
      }
      std::string path = p.lexically_normal().string();
      std::string canonical = Canonical(path);
      auto cyc = std::find(stack->begin(), stack->end(), canonical);
      if (cyc != stack->end()) {
        std::vector<std::string> chain(cyc, stack->end());
        chain.push_back(canonical);
        diag->Error(item.origin, "defaults",
                    absl::StrCat("defaults cycle: ", absl::StrJoin(chain, " -> ")));
        continue;
      }
      absl::StatusOr<std::string> sub_text = ReadTextFile(path);
      if (!sub_text.ok()) {
        diag->Error(item.origin, "defaults", std::string(sub_text.status().message()));
        continue;
      }
      stack->push_back(canonical);
      ConfigNode sub = LoadRecursive(*sub_text, path, stack, diag);
      stack->pop_back();
      MergeInto(&merged, sub);
    }
    root.Erase("defaults");
  }
  MergeInto(&merged, root);
  return merged;
}

}  // namespace

ConfigNode LoadTreeWithDefaults(std::string_view text, const std::string& source,
                                Diagnostics* diag) {
  std::vector<std::string> stack = {Canonical(source)};
  return LoadRecursive(text, source, &stack, diag);
}

void MergeInto(ConfigNode* base, const ConfigNode& top) {
  if (!base->IsMap() || !top.IsMap()) {
    std::string key = base->key;
    *base = top;
    base->key = std::move(key);
    return;
  }
  base->origin = top.origin;
  base->key_origin = top.key_origin;
  for (const ConfigNode& child : top.children) {
    if (ConfigNode* b = base->Find(child.key)) {
      MergeInto(b, child);
    } else {
      base->children.push_back(child);
    }
  }
}

void ApplyOverride(ConfigNode* root, const std::string& override_text, Diagnostics* diag) {
  Origin o{absl::StrCat("override '", override_text, "'")};
  size_t eq = override_text.find('=');
  if (eq == std::string::npos) {
    diag->Error(o, "", "expected key.path=value");
    return;
  }
  std::string path(absl::StripAsciiWhitespace(override_text.substr(0, eq)));
  std::vector<std::string> parts = absl::StrSplit(path, '.');
  for (const std::string& part : parts) {
    if (part.empty()) {
      diag->Error(o, path, "expected key.path=value with non-empty keys");
      return;
    }
  }
  ConfigNode value;
  try {
    YAML::Node n = YAML::Load(override_text.substr(eq + 1));
    value = Convert(n, o.source, o, &o, diag);
  } catch (const YAML::Exception& e) {
    diag->Error(o, path, absl::StrCat("cannot parse the value as YAML: ", e.msg));
    return;
  }
  ConfigNode* cur = root;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    ConfigNode* child = cur->Find(parts[i]);
    if (child == nullptr) {
      ConfigNode m = EmptyMap(o);
      m.key = parts[i];
      cur->children.push_back(std::move(m));
      child = &cur->children.back();
    } else if (child->IsNull()) {
      std::string key = child->key;
      *child = EmptyMap(o);
      child->key = key;
    } else if (!child->IsMap()) {
      std::vector<std::string> prefix(parts.begin(), parts.begin() + i + 1);
      diag->Error(o, path,
                  absl::StrCat("cannot set a key inside '", absl::StrJoin(prefix, "."),
                               "': it is ", child->Describe(), ", not a section"));
      return;
    }
    cur = child;
  }
  value.key = parts.back();
  value.key_origin = o;
  if (ConfigNode* existing = cur->Find(parts.back())) {
    *existing = std::move(value);
  } else {
    cur->children.push_back(std::move(value));
  }
}

namespace {

// Resolves `${...}` references. Only scalar nodes are ever replaced, and a
// scalar has no children, so pointers to nodes being resolved stay valid.
class Interpolator {
 public:
  Interpolator(ConfigNode* root, Diagnostics* diag) : root_(root), diag_(diag) {}

  void ResolveAll() { ResolveSubtree("", root_); }

 private:
  enum class State { kInProgress, kDone };

  static std::string Join(const std::string& prefix, const std::string& part) {
    return prefix.empty() ? part : absl::StrCat(prefix, ".", part);
  }

  // Every function below returns false when the value could not be
  // resolved; the error was reported where it arose (one per cause), and
  // the dependent values are marked failed without more errors.
  bool ResolveSubtree(const std::string& path, ConfigNode* node) {
    if (node->IsScalar()) return ResolveScalar(path, node);
    bool ok = true;
    for (size_t i = 0; i < node->children.size(); ++i) {
      ConfigNode* c = &node->children[i];
      std::string child_path = Join(path, node->IsMap() ? c->key : std::to_string(i));
      ok = ResolveSubtree(child_path, c) && ok;
    }
    return ok;
  }

  // The node at `path`, resolving whole-value references met on the way so
  // `${a.x}` works when `a: ${b}`. Null with *failed unset: no such key.
  ConfigNode* Lookup(const std::string& path, bool* failed) {
    ConfigNode* cur = root_;
    std::string prefix;
    for (const std::string& part : std::vector<std::string>(absl::StrSplit(path, '.'))) {
      prefix = Join(prefix, part);
      ConfigNode* next = nullptr;
      if (cur->IsMap()) {
        next = cur->Find(part);
      } else if (cur->IsSequence()) {
        size_t index = 0;
        if (absl::SimpleAtoi(part, &index) && index < cur->children.size()) {
          next = &cur->children[index];
        }
      }
      if (next == nullptr) return nullptr;
      if (next->IsScalar() && !ResolveScalar(prefix, next)) {
        *failed = true;
        return nullptr;
      }
      cur = next;
    }
    return cur;
  }

  bool ResolveScalar(const std::string& path, ConfigNode* node) {
    auto st = state_.find(path);
    if (st != state_.end()) {
      if (st->second == State::kDone) return !node->failed;
      auto from = std::find(stack_.begin(), stack_.end(), path);
      std::vector<std::string> chain(from, stack_.end());
      chain.push_back(path);
      diag_->Error(node->origin, path,
                   absl::StrCat("interpolation cycle: ", absl::StrJoin(chain, " -> ")));
      node->failed = true;
      return false;
    }
    if (!absl::StrContains(node->scalar, "${")) {
      state_[path] = State::kDone;
      return true;
    }
    state_[path] = State::kInProgress;
    stack_.push_back(path);
    bool ok = Substitute(path, node);
    stack_.pop_back();
    state_[path] = State::kDone;
    if (!ok) node->failed = true;
    return ok;
  }

  bool Substitute(const std::string& path, ConfigNode* node) {
    const std::string text = node->scalar;
    std::string out;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t start = text.find("${", pos);
      if (start == std::string::npos) {
        out.append(text, pos, std::string::npos);
        break;
      }
      out.append(text, pos, start - pos);
      size_t end = text.find('}', start + 2);
      if (end == std::string::npos) {
        diag_->Error(node->origin, path,
                     absl::StrCat("unterminated interpolation in '", text, "'"));
        return false;
      }
      std::string ref(absl::StripAsciiWhitespace(text.substr(start + 2, end - start - 2)));
      bool failed = false;
      ConfigNode* target = ref.empty() ? nullptr : Lookup(ref, &failed);
      if (failed) return false;
      if (target == nullptr) {
        diag_->Error(node->origin, path,
                     absl::StrCat("interpolation '${", ref, "}' refers to a key that does not exist"));
        return false;
      }
      if (!ResolveSubtree(ref, target)) return false;
      bool whole = start == 0 && end == text.size() - 1;
      if (whole) {
        ConfigNode copy = *target;
        copy.key = node->key;
        copy.key_origin = node->key_origin;
        copy.origin = node->origin;
        *node = std::move(copy);
        return true;
      }
      if (!target->IsScalar()) {
        diag_->Error(node->origin, path,
                     absl::StrCat("interpolation '${", ref, "}' is ", target->Describe(),
                                  " and cannot be embedded in a string"));
        return false;
      }
      out += target->scalar;
      pos = end + 1;
    }
    node->scalar = std::move(out);
    return true;
  }

  ConfigNode* root_;
  Diagnostics* diag_;
  std::map<std::string, State> state_;
  std::vector<std::string> stack_;
};

}  // namespace

void ResolveInterpolations(ConfigNode* root, Diagnostics* diag) {
  Interpolator(root, diag).ResolveAll();
}

int EditDistance(std::string_view a, std::string_view b) {
  std::vector<int> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = static_cast<int>(j);
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = static_cast<int>(i);
    for (size_t j = 1; j <= b.size(); ++j) {
      int subst = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, subst});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  int best_distance = 0;
  for (const std::string& c : candidates) {
    int d = EditDistance(word, c);
    if (best.empty() || d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  int limit = std::max<int>(2, static_cast<int>(word.size()) / 3);
  if (best.empty() || best_distance > limit || best_distance >= static_cast<int>(word.size())) {
    return "";
  }
  return best;
}

}  // namespace roll::config_internal
