#pragma once
// A small reflection layer for the config structs.
//
// Schema<T> is a table of fields of struct T. One table drives parsing
// (with type and range checks), unknown-key detection and "did you mean"
// suggestions, required-key checks, YAML dumping and the reference docs, so
// adding a key means adding one line to the table in config.cc.
//
// Schemas are built once and then only read; reading is thread-safe.

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <algorithm>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/config_tree.h"

namespace roll::config_internal {

struct ParseContext {
  Diagnostics* diag = nullptr;
  // Value origin of every key path that was set, for later cross-checks.
  std::map<std::string, Origin> origins;

  // Origin recorded for `path`, else `fallback`.
  Origin OriginOf(const std::string& path, const Origin& fallback) const {
    auto it = origins.find(path);
    return it == origins.end() ? fallback : it->second;
  }
};

// Allowed numeric interval; open ends are exclusive.
struct Range {
  std::optional<double> min, max;
  bool min_open = false, max_open = false;

  static Range AtLeast(double v) { return Range{v, std::nullopt, false, false}; }
  static Range Above(double v) { return Range{v, std::nullopt, true, false}; }
  bool Contains(double v) const;
  // ">= 0", "> 0", "(0, 1]", "" when unbounded.
  std::string Text() const;
};

std::string JoinPath(const std::string& prefix, const std::string& key);

// Leaf parsers: record an error naming `path` and return false on bad input.
bool ParseInt64(const ConfigNode& n, const std::string& path, ParseContext& ctx, int64_t* out);
bool ParseDouble(const ConfigNode& n, const std::string& path, ParseContext& ctx, double* out);
bool ParseBool(const ConfigNode& n, const std::string& path, ParseContext& ctx, bool* out);
bool ParseString(const ConfigNode& n, const std::string& path, ParseContext& ctx, std::string* out);
bool ParseStringList(const ConfigNode& n, const std::string& path, ParseContext& ctx,
                     std::vector<std::string>* out);
// A list of non-negative unique ints, or "list(range(a,b[,step]))".
bool ParseDeviceMapping(const ConfigNode& n, const std::string& path, ParseContext& ctx,
                        std::vector<int>* out);
bool CheckRange(double v, const Range& range, const ConfigNode& n, const std::string& path,
                ParseContext& ctx);

// Emitters that reload to the same value.
void EmitDouble(YAML::Emitter& e, double v);
void EmitString(YAML::Emitter& e, const std::string& s);
void EmitIntList(YAML::Emitter& e, const std::vector<int>& v);
void EmitStringList(YAML::Emitter& e, const std::vector<std::string>& v);

template <class T>
class Schema {
 public:
  struct Field {
    std::string name;
    std::string type;         // for docs: "integer", "section", ...
    std::string constraint;   // for docs: ">= 0", "one of: a, b"
    std::string default_text; // for docs: the default as YAML
    std::string doc;
    bool required = false;
    // Set for sections: the nested keys, for "belongs in section" hints.
    std::vector<std::string> nested_keys;
    std::function<void(const ConfigNode&, const std::string&, T*, ParseContext&)> parse;
    std::function<void(const T&, YAML::Emitter&)> emit;
    // Empty: always emitted.
    std::function<bool(const T&)> should_emit;
  };

  // Keys that are accepted besides the fields, handled by the caller.
  struct ExtraKeys {
    std::vector<std::string> names;
    std::function<void(const ConfigNode&, const std::string&)> parse;
  };

  template <class I>
  Schema& Integer(std::string name, I T::*m, std::string doc, Range range = {}) {
    static_assert(std::is_integral_v<I>);
    Field f = Leaf(std::move(name), "integer", range.Text(), std::move(doc));
    f.parse = [m, range](const ConfigNode& n, const std::string& path, T* obj, ParseContext& ctx) {
      int64_t v = 0;
      if (!ParseInt64(n, path, ctx, &v)) return;
      if (v < static_cast<int64_t>(std::numeric_limits<I>::min()) ||
          v > static_cast<int64_t>(std::numeric_limits<I>::max())) {
        ctx.diag->Error(n.origin, path, absl::StrCat("value ", v, " does not fit in ",
                                                     sizeof(I) * 8, "-bit integer"));
        return;
      }
      if (!CheckRange(static_cast<double>(v), range, n, path, ctx)) return;
      obj->*m = static_cast<I>(v);
    };
    f.emit = [m](const T& obj, YAML::Emitter& e) { e << static_cast<int64_t>(obj.*m); };
    return Add(std::move(f));
  }

  Schema& Double(std::string name, double T::*m, std::string doc, Range range = {}) {
    Field f = Leaf(std::move(name), "number", range.Text(), std::move(doc));
    f.parse = [m, range](const ConfigNode& n, const std::string& path, T* obj, ParseContext& ctx) {
      double v = 0;
      if (ParseDouble(n, path, ctx, &v) && CheckRange(v, range, n, path, ctx)) obj->*m = v;
    };
    f.emit = [m](const T& obj, YAML::Emitter& e) { EmitDouble(e, obj.*m); };
    return Add(std::move(f));
  }

  Schema& Bool(std::string name, bool T::*m, std::string doc) {
    Field f = Leaf(std::move(name), "boolean", "true, false", std::move(doc));
    f.parse = [m](const ConfigNode& n, const std::string& path, T* obj, ParseContext& ctx) {
      bool v = false;
      if (ParseBool(n, path, ctx, &v)) obj->*m = v;
    };
    f.emit = [m](const T& obj, YAML::Emitter& e) { e << (obj.*m ? "true" : "false"); };
    return Add(std::move(f));
  }

  // `false_is_empty`: YAML `false` reads as "" (ROLL's "no checkpoint").
  Schema& String(std::string name, std::string T::*m, std::string doc, bool required = false,
                 bool false_is_empty = false) {
    Field f = Leaf(std::move(name), "string", "", std::move(doc));
    f.required = required;
    f.parse = [m, false_is_empty](const ConfigNode& n, const std::string& path, T* obj,
                                  ParseContext& ctx) {
      std::string v;
      if (!ParseString(n, path, ctx, &v)) return;
      if (false_is_empty && v == "false") v.clear();
      obj->*m = std::move(v);
    };
    f.emit = [m](const T& obj, YAML::Emitter& e) { EmitString(e, obj.*m); };
    return Add(std::move(f));
  }

  // A string that must be given.
  Schema& RequiredString(std::string name, std::string T::*m, std::string doc) {
    return String(std::move(name), m, std::move(doc), /*required=*/true);
  }
  // A string for which YAML `false` reads as "".
  Schema& StringOrFalse(std::string name, std::string T::*m, std::string doc) {
    return String(std::move(name), m, std::move(doc), /*required=*/false, /*false_is_empty=*/true);
  }

  template <class E>
  Schema& Enum(std::string name, E T::*m, std::string doc,
               std::vector<std::pair<std::string, E>> values) {
    std::vector<std::string> names;
    for (const auto& [n, v] : values) names.push_back(n);
    std::string allowed = absl::StrJoin(names, ", ");
    Field f = Leaf(std::move(name), "enum", absl::StrCat("one of: ", allowed), std::move(doc));
    f.parse = [m, values, allowed](const ConfigNode& n, const std::string& path, T* obj,
                                   ParseContext& ctx) {
      if (n.IsScalar()) {
        for (const auto& [text, v] : values) {
          if (text == n.scalar) {
            obj->*m = v;
            return;
          }
        }
      }
      ctx.diag->Error(n.origin, path,
                      absl::StrCat("invalid value ", n.Describe(), ": expected one of: ", allowed));
    };
    // The first spelling of the value (an alias maps to the same value).
    f.emit = [m, values](const T& obj, YAML::Emitter& e) {
      for (const auto& [text, v] : values) {
        if (v == obj.*m) {
          e << text;
          return;
        }
      }
    };
    return Add(std::move(f));
  }

  Schema& StringList(std::string name, std::vector<std::string> T::*m, std::string doc) {
    Field f = Leaf(std::move(name), "list of strings", "", std::move(doc));
    f.parse = [m](const ConfigNode& n, const std::string& path, T* obj, ParseContext& ctx) {
      std::vector<std::string> v;
      if (ParseStringList(n, path, ctx, &v)) obj->*m = std::move(v);
    };
    f.emit = [m](const T& obj, YAML::Emitter& e) { EmitStringList(e, obj.*m); };
    return Add(std::move(f));
  }

  Schema& DeviceMapping(std::string name, std::vector<int> T::*m, std::string doc) {
    Field f = Leaf(std::move(name), "list of integers or \"list(range(a,b[,step]))\"",
                   "indices >= 0, unique", std::move(doc));
    f.parse = [m](const ConfigNode& n, const std::string& path, T* obj, ParseContext& ctx) {
      std::vector<int> v;
      if (ParseDeviceMapping(n, path, ctx, &v)) obj->*m = std::move(v);
    };
    f.emit = [m](const T& obj, YAML::Emitter& e) { EmitIntList(e, obj.*m); };
    return Add(std::move(f));
  }

  template <class U>
  Schema& Section(std::string name, U T::*m, std::string doc, const Schema<U>* sub,
                  std::function<bool(const T&)> should_emit = {}) {
    Field f;
    f.name = std::move(name);
    f.type = "section";
    f.doc = std::move(doc);
    f.nested_keys = sub->Names();
    f.parse = [m, sub](const ConfigNode& n, const std::string& path, T* obj, ParseContext& ctx) {
      sub->Parse(n, path, &(obj->*m), ctx);
    };
    f.emit = [m, sub](const T& obj, YAML::Emitter& e) { sub->Emit(obj.*m, e); };
    f.should_emit = std::move(should_emit);
    return Add(std::move(f));
  }

  // A map from free names to sections of schema `sub`; `on_entry` runs
  // before each entry is parsed (to set its name).
  template <class U, class OnEntry>
  Schema& SectionMap(std::string name, std::map<std::string, U> T::*m, const Schema<U>* sub,
                     std::string doc, OnEntry on_entry) {
    Field f;
    f.name = std::move(name);
    f.type = "map of name -> section";
    f.doc = std::move(doc);
    f.parse = [m, sub, on_entry](const ConfigNode& n, const std::string& path, T* obj,
                                 ParseContext& ctx) {
      if (n.IsNull()) return;
      if (!n.IsMap()) {
        ctx.diag->Error(n.origin, path, absl::StrCat("expected a map of name -> section, got ",
                                                     n.Describe()));
        return;
      }
      for (const ConfigNode& entry : n.children) {
        std::string entry_path = JoinPath(path, entry.key);
        ctx.origins[entry_path] = entry.key_origin;
        U* u = &(obj->*m)[entry.key];
        on_entry(entry_path, u);
        sub->Parse(entry, entry_path, u, ctx);
      }
    };
    f.emit = [m, sub](const T& obj, YAML::Emitter& e) {
      e << YAML::BeginMap;
      for (const auto& [key, u] : obj.*m) {
        e << YAML::Key << key << YAML::Value;
        sub->Emit(u, e);
      }
      e << YAML::EndMap;
    };
    f.should_emit = [m](const T& obj) { return !(obj.*m).empty(); };
    return Add(std::move(f));
  }

  // Copies every field of `base` (a schema of a base class of T).
  template <class B>
  Schema& Inherit(const Schema<B>& base) {
    static_assert(std::is_base_of_v<B, T>);
    for (const auto& bf : base.fields()) {
      Field f;
      f.name = bf.name;
      f.type = bf.type;
      f.constraint = bf.constraint;
      f.default_text = bf.default_text;
      f.doc = bf.doc;
      f.required = bf.required;
      f.nested_keys = bf.nested_keys;
      auto parse = bf.parse;
      auto emit = bf.emit;
      f.parse = [parse](const ConfigNode& n, const std::string& path, T* obj, ParseContext& ctx) {
        parse(n, path, static_cast<B*>(obj), ctx);
      };
      f.emit = [emit](const T& obj, YAML::Emitter& e) { emit(static_cast<const B&>(obj), e); };
      if (bf.should_emit) {
        auto should = bf.should_emit;
        f.should_emit = [should](const T& obj) { return should(static_cast<const B&>(obj)); };
      }
      fields_.push_back(std::move(f));
    }
    return *this;
  }

  const std::vector<Field>& fields() const { return fields_; }

  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const Field& f : fields_) names.push_back(f.name);
    return names;
  }

  // Parses the map `node` (null reads as empty) into `obj`.
  void Parse(const ConfigNode& node, const std::string& path, T* obj, ParseContext& ctx,
             const ExtraKeys* extra = nullptr) const {
    const Origin& section_origin = node.key_origin.line > 0 ? node.key_origin : node.origin;
    if (!node.IsMap() && !node.IsNull()) {
      ctx.diag->Error(node.origin, path,
                      absl::StrCat("expected a map (section), got ", node.Describe()));
      return;
    }
    for (const ConfigNode& child : node.children) {
      std::string child_path = JoinPath(path, child.key);
      const Field* f = FindField(child.key);
      if (f == nullptr) {
        if (extra && std::find(extra->names.begin(), extra->names.end(), child.key) !=
                         extra->names.end()) {
          extra->parse(child, child_path);
        } else {
          ctx.diag->Error(child.key_origin, child_path, UnknownKeyMessage(child.key, extra));
        }
        continue;
      }
      ctx.origins[child_path] = child.origin;
      if (child.failed) continue;
      if (f->required && (child.IsNull() || (child.IsScalar() && child.scalar.empty()))) {
        ctx.diag->Error(child.origin, child_path, "missing required value (it must not be empty)");
        continue;
      }
      f->parse(child, child_path, obj, ctx);
    }
    for (const Field& f : fields_) {
      if (f.required && node.Find(f.name) == nullptr) {
        ctx.diag->Error(section_origin, JoinPath(path, f.name), "missing required value");
      }
    }
  }

  // Emits `obj` as a block map with every field.
  void Emit(const T& obj, YAML::Emitter& e) const {
    e << YAML::BeginMap;
    EmitFields(obj, e);
    e << YAML::EndMap;
  }

  // The key/value pairs of Emit(), inside a map the caller opened.
  void EmitFields(const T& obj, YAML::Emitter& e) const {
    for (const Field& f : fields_) {
      if (f.should_emit && !f.should_emit(obj)) continue;
      e << YAML::Key << f.name << YAML::Value;
      f.emit(obj, e);
    }
  }

 private:
  Field Leaf(std::string name, std::string type, std::string constraint, std::string doc) {
    Field f;
    f.name = std::move(name);
    f.type = std::move(type);
    f.constraint = std::move(constraint);
    f.doc = std::move(doc);
    return f;
  }

  Schema& Add(Field f) {
    if (f.type != "section" && f.emit) {
      YAML::Emitter e;
      f.emit(T{}, e);
      f.default_text = e.c_str();
    }
    fields_.push_back(std::move(f));
    return *this;
  }

  const Field* FindField(const std::string& name) const {
    for (const Field& f : fields_) {
      if (f.name == name) return &f;
    }
    return nullptr;
  }

  std::string UnknownKeyMessage(const std::string& key, const ExtraKeys* extra) const {
    std::string msg = absl::StrCat("unknown key '", key, "'");
    // A key written one level too high: hint at the one section that has it.
    const Field* owner = nullptr;
    int owners = 0;
    for (const Field& f : fields_) {
      if (std::find(f.nested_keys.begin(), f.nested_keys.end(), key) != f.nested_keys.end()) {
        owner = &f;
        ++owners;
      }
    }
    if (owners == 1) return absl::StrCat(msg, " (did you mean '", owner->name, ".", key, "'?)");
    std::vector<std::string> candidates = Names();
    if (extra) candidates.insert(candidates.end(), extra->names.begin(), extra->names.end());
    std::string best = ClosestMatch(key, candidates);
    if (!best.empty()) absl::StrAppend(&msg, " (did you mean '", best, "'?)");
    return msg;
  }

  std::vector<Field> fields_;
};

}  // namespace roll::config_internal
