#pragma once
// The untyped configuration tree the loader works on before the typed parse.
//
// yaml-cpp nodes lose their file once trees from several files are merged,
// so the loader converts every file into ConfigNode, which carries the
// origin (file, line, column) of each key and value through merging,
// overrides and interpolation. Errors are gathered in Diagnostics so that a
// single load reports every problem. Not thread-safe; values only.

#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "roll/common/status.h"

namespace roll::config_internal {

// Where a key or value was written. line/col are 1-based; 0 means unknown
// (then only `source` is printed, e.g. for command-line overrides).
struct Origin {
  std::string source;
  int line = 0;
  int col = 0;
};

// "file.yaml:3:5" or "override 'a.b=c'".
std::string FormatOrigin(const Origin& origin);

struct ConfigNode {
  enum class Type { kNull, kScalar, kSequence, kMap };

  Type type = Type::kNull;
  std::string scalar;
  // Map entries (in file order, `key` set) or sequence items.
  std::vector<ConfigNode> children;
  // The key of this node inside its parent map.
  std::string key;
  Origin origin;      // of the value
  Origin key_origin;  // of the key; equals origin for sequence items
  // An interpolation in this value failed (already reported); the typed
  // parse skips it instead of reporting follow-on errors.
  bool failed = false;

  bool IsMap() const { return type == Type::kMap; }
  bool IsScalar() const { return type == Type::kScalar; }
  bool IsSequence() const { return type == Type::kSequence; }
  bool IsNull() const { return type == Type::kNull; }

  ConfigNode* Find(std::string_view k);
  const ConfigNode* Find(std::string_view k) const;
  // Removes the entry `k` of a map; true when one was removed.
  bool Erase(std::string_view k);
  // "a map", "a list", "null", "'text'" for messages.
  std::string Describe() const;
};

// Every error of one load, each formatted `origin: key.path: message`.
class Diagnostics {
 public:
  void Error(const Origin& origin, const std::string& key_path, const std::string& message);
  bool empty() const { return lines_.empty(); }
  size_t size() const { return lines_.size(); }
  // InvalidArgument with one error per line, or OK.
  absl::Status ToStatus() const;

 private:
  std::vector<std::string> lines_;
  std::set<std::string> seen_;  // merged bases can repeat an error
};

// Parses YAML text into a tree. Syntax errors are recorded with yaml-cpp's
// line; the return is then a null node.
ConfigNode ParseYamlText(std::string_view text, const std::string& source, Diagnostics* diag);

// Parses `text` (the content of file `source`), follows its `defaults:`
// list recursively (paths relative to the including file) and returns the
// merged tree without the `defaults` key. Cycles are reported.
ConfigNode LoadTreeWithDefaults(std::string_view text, const std::string& source,
                                Diagnostics* diag);

// Reads a whole file; NotFound naming the file when it cannot be read.
absl::StatusOr<std::string> ReadTextFile(const std::string& path);

// Deep-merges `top` into `base`: maps merge key by key, anything else is
// replaced by `top`.
void MergeInto(ConfigNode* base, const ConfigNode& top);

// Applies "a.b.c=value" to `root`, creating intermediate maps.
void ApplyOverride(ConfigNode* root, const std::string& override_text, Diagnostics* diag);

// Replaces every `${a.b}` (whole value or embedded in a string) with the
// value at that path of `root`, resolving chains and reporting cycles.
void ResolveInterpolations(ConfigNode* root, Diagnostics* diag);

// Edit distance used for "did you mean" suggestions.
int EditDistance(std::string_view a, std::string_view b);
// The candidate closest to `word`, or "" when none is close enough.
std::string ClosestMatch(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace roll::config_internal
