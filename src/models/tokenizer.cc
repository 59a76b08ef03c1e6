#include "roll/models/tokenizer.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <queue>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_map.h"
#include "models/tokenizer_text.h"

namespace roll {
namespace {

namespace ti = tokenizer_internal;
using Json = nlohmann::json;

// Words longer than this are encoded without touching the cache: they are
// rare, and caching them would let one long input evict the common words.
constexpr size_t kMaxCachedWordBytes = 128;
constexpr size_t kMaxCacheEntries = 1 << 16;
// Ids above this are refused so a corrupt file cannot make us allocate an
// enormous id table.
constexpr int64_t kMaxTokenId = (int64_t{1} << 26) - 1;

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
};

struct PreTokenizerStep {
  std::shared_ptr<const ti::Regex> regex;  // null: the step does not split
  bool remove_matches = false;             // Split with behavior "Removed"
  bool byte_level = false;
  bool add_prefix_space = false;           // ByteLevel only
};

// One element of a TemplateProcessing "single" template: the input sequence,
// or the ids of a special token.
struct TemplateItem {
  bool is_sequence = false;
  std::vector<int32_t> ids;
};

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

bool IsAsciiSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Every load error names the source and the JSON field it is about.
absl::Status BadField(absl::string_view source, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("tokenizer '", source, "': field '", field, "': ", what));
}
absl::Status Unsupported(absl::string_view source, absl::string_view field, absl::string_view what) {
  return absl::UnimplementedError(
      absl::StrCat("tokenizer '", source, "': field '", field, "': ", what));
}

absl::StatusOr<bool> OptionalBool(const Json& obj, const char* key, bool dflt, absl::string_view source,
                                  const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) return BadField(source, absl::StrCat(path, ".", key), "must be a boolean");
  return it->get<bool>();
}

std::string TypeOf(const Json& node) {
  auto it = node.find("type");
  return it != node.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// Escapes a literal for PCRE2 (Split patterns given as {"String": ...}).
std::string QuoteRegex(std::string_view literal) {
  std::string out;
  for (char c : literal) {
    if (std::strchr("\\^$.|?*+()[]{}", c) != nullptr) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("tokenizer file '", path, "' cannot be opened"));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("tokenizer file '", path, "' cannot be read"));
  return ss.str();
}

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  std::string json_text;

  bool nfc = false;
  std::vector<PreTokenizerStep> pre_tokenizer;
  bool byte_level = false;  // some pre-tokenizer step maps bytes to symbols

  absl::flat_hash_map<std::string, int32_t> vocab;  // model.vocab
  absl::flat_hash_map<std::string, int32_t> added_to_id;
  std::vector<std::string> id_to_token;
  std::vector<uint8_t> id_flags;  // kPresent | kSpecial
  static constexpr uint8_t kPresent = 1, kSpecial = 2;

  // (left id, right id) -> (rank, merged id).
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> merges;
  bool ignore_merges = false;
  std::optional<int32_t> unk_id;

  std::vector<AddedToken> added;
  std::array<std::vector<int>, 256> added_by_first_byte;  // longest first

  std::vector<TemplateItem> single_template;  // empty: add nothing
  bool decode_byte_level = false;
  bool decode_join_with_space = false;

  mutable std::mutex cache_mu;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache;

  absl::Status Parse(const Json& root);
  absl::Status ParseNormalizer(const Json& node, const std::string& path);
  absl::Status ParsePreTokenizer(const Json& node, const std::string& path);
  absl::Status ParseModel(const Json& node);
  absl::Status ParseAddedTokens(const Json& node);
  absl::Status ParsePostProcessor(const Json& node, const std::string& path);
  absl::Status ParseDecoder(const Json& node, const std::string& path);
  absl::Status AddId(int32_t id, const std::string& token, const std::string& field);

  void EncodeText(std::string_view text, std::vector<int32_t>* out) const;
  void EncodeSegment(std::string_view text, std::vector<int32_t>* out) const;
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;
  void Bpe(std::string_view symbols, std::vector<int32_t>* out) const;
};

absl::Status Tokenizer::Impl::ParseNormalizer(const Json& node, const std::string& path) {
  if (node.is_null()) return absl::OkStatus();
  if (!node.is_object()) return BadField(source, path, "must be an object or null");
  const std::string type = TypeOf(node);
  if (type == "NFC") {
    nfc = true;
    return absl::OkStatus();
  }
  if (type == "Sequence") {
    auto it = node.find("normalizers");
    if (it == node.end() || !it->is_array()) return BadField(source, path + ".normalizers", "must be an array");
    for (size_t i = 0; i < it->size(); ++i) {
      ROLL_RETURN_IF_ERROR(ParseNormalizer((*it)[i], absl::StrCat(path, ".normalizers[", i, "]")));
    }
    return absl::OkStatus();
  }
  return Unsupported(source, path + ".type",
                     absl::StrCat("normalizer '", type, "' is not supported (supported: NFC, Sequence)"));
}

absl::Status Tokenizer::Impl::ParsePreTokenizer(const Json& node, const std::string& path) {
  if (node.is_null()) return absl::OkStatus();
  if (!node.is_object()) return BadField(source, path, "must be an object or null");
  const std::string type = TypeOf(node);
  if (type == "Sequence") {
    auto it = node.find("pretokenizers");
    if (it == node.end() || !it->is_array()) return BadField(source, path + ".pretokenizers", "must be an array");
    for (size_t i = 0; i < it->size(); ++i) {
      ROLL_RETURN_IF_ERROR(ParsePreTokenizer((*it)[i], absl::StrCat(path, ".pretokenizers[", i, "]")));
    }
    return absl::OkStatus();
  }
  PreTokenizerStep step;
  if (type == "ByteLevel") {
    step.byte_level = true;
    // Hugging Face's defaults for absent keys: both true.
    ROLL_ASSIGN_OR_RETURN(step.add_prefix_space, OptionalBool(node, "add_prefix_space", true, source, path));
    ROLL_ASSIGN_OR_RETURN(const bool use_regex, OptionalBool(node, "use_regex", true, source, path));
    if (use_regex) {
      auto re = ti::Regex::Compile(ti::kGpt2Pattern);
      if (!re.ok()) return re.status();
      step.regex = *re;
    }
    byte_level = true;
  } else if (type == "Split") {
    auto pat = node.find("pattern");
    if (pat == node.end() || !pat->is_object()) return BadField(source, path + ".pattern", "must be an object");
    std::string regex;
    if (auto r = pat->find("Regex"); r != pat->end() && r->is_string()) {
      regex = r->get<std::string>();
    } else if (auto s = pat->find("String"); s != pat->end() && s->is_string()) {
      regex = QuoteRegex(s->get<std::string>());
    } else {
      return BadField(source, path + ".pattern", "needs a string \"Regex\" or \"String\"");
    }
    auto re = ti::Regex::Compile(regex);
    if (!re.ok()) return BadField(source, path + ".pattern.Regex", re.status().message());
    step.regex = *re;
    auto beh = node.find("behavior");
    const std::string behavior = beh != node.end() && beh->is_string() ? beh->get<std::string>() : "";
    if (behavior == "Removed") {
      step.remove_matches = true;
    } else if (behavior != "Isolated") {
      return Unsupported(source, path + ".behavior",
                         absl::StrCat("Split behavior '", behavior, "' is not supported (Isolated, Removed)"));
    }
    ROLL_ASSIGN_OR_RETURN(const bool invert, OptionalBool(node, "invert", false, source, path));
    if (invert) return Unsupported(source, path + ".invert", "inverted Split is not supported");
  } else {
    return Unsupported(source, path + ".type",
                       absl::StrCat("pre-tokenizer '", type, "' is not supported (ByteLevel, Split, Sequence)"));
  }
  pre_tokenizer.push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::AddId(int32_t id, const std::string& token, const std::string& field) {
  if (id < 0 || id > kMaxTokenId) {
    return BadField(source, field, absl::StrCat("id ", id, " is out of range [0, ", kMaxTokenId, "]"));
  }
  if (static_cast<size_t>(id) >= id_to_token.size()) {
    id_to_token.resize(id + 1);
    id_flags.resize(id + 1, 0);
  }
  id_to_token[id] = token;
  id_flags[id] |= kPresent;
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::ParseModel(const Json& node) {
  if (!node.is_object()) return BadField(source, "model", "must be an object");
  const std::string type = TypeOf(node);
  if (type != "BPE" && !(type.empty() && node.contains("merges"))) {
    return Unsupported(source, "model.type",
                       absl::StrCat("model type '", type, "' is not supported (only BPE)"));
  }
  if (auto d = node.find("dropout"); d != node.end() && !d->is_null()) {
    if (!d->is_number()) return BadField(source, "model.dropout", "must be a number or null");
    if (d->get<double>() != 0.0) return Unsupported(source, "model.dropout", "BPE dropout is not supported");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto it = node.find(key);
    if (it != node.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty())) {
      return Unsupported(source, absl::StrCat("model.", key), "subword prefixes/suffixes are not supported");
    }
  }
  ROLL_ASSIGN_OR_RETURN(const bool byte_fallback, OptionalBool(node, "byte_fallback", false, source, "model"));
  if (byte_fallback) return Unsupported(source, "model.byte_fallback", "byte_fallback is not supported");
  ROLL_ASSIGN_OR_RETURN(ignore_merges, OptionalBool(node, "ignore_merges", false, source, "model"));

  auto v = node.find("vocab");
  if (v == node.end() || !v->is_object()) return BadField(source, "model.vocab", "must be an object of token -> id");
  vocab.reserve(v->size());
  for (auto it = v->begin(); it != v->end(); ++it) {
    const std::string field = absl::StrCat("model.vocab[\"", it.key(), "\"]");
    if (!it.value().is_number_integer()) return BadField(source, field, "id must be an integer");
    const int64_t id = it.value().get<int64_t>();
    if (id < 0 || id > kMaxTokenId) return BadField(source, field, absl::StrCat("id ", id, " is out of range"));
    vocab.emplace(it.key(), static_cast<int32_t>(id));
    ROLL_RETURN_IF_ERROR(AddId(static_cast<int32_t>(id), it.key(), field));
  }

  if (auto u = node.find("unk_token"); u != node.end() && !u->is_null()) {
    if (!u->is_string()) return BadField(source, "model.unk_token", "must be a string or null");
    auto it = vocab.find(u->get<std::string>());
    if (it == vocab.end()) {
      return BadField(source, "model.unk_token", absl::StrCat("'", u->get<std::string>(), "' is not in model.vocab"));
    }
    unk_id = it->second;
  }

  auto m = node.find("merges");
  if (m == node.end() || m->is_null()) return absl::OkStatus();
  if (!m->is_array()) return BadField(source, "model.merges", "must be an array");
  merges.reserve(m->size());
  for (size_t i = 0; i < m->size(); ++i) {
    const Json& e = (*m)[i];
    const std::string field = absl::StrCat("model.merges[", i, "]");
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == s.size() || s.find(' ', sp + 1) != std::string::npos) {
        return BadField(source, field, absl::StrCat("'", s, "' is not of the form \"left right\""));
      }
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      return BadField(source, field, "must be a \"left right\" string or a [left, right] pair");
    }
    auto ia = vocab.find(a), ib = vocab.find(b), iab = vocab.find(a + b);
    if (ia == vocab.end()) return BadField(source, field, absl::StrCat("token '", a, "' is not in model.vocab"));
    if (ib == vocab.end()) return BadField(source, field, absl::StrCat("token '", b, "' is not in model.vocab"));
    if (iab == vocab.end()) {
      return BadField(source, field, absl::StrCat("merged token '", a, b, "' is not in model.vocab"));
    }
    // The first (lowest-rank) occurrence of a pair wins, as in Hugging Face.
    merges.try_emplace(PairKey(ia->second, ib->second), static_cast<int32_t>(i), iab->second);
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::ParseAddedTokens(const Json& node) {
  if (node.is_null()) return absl::OkStatus();
  if (!node.is_array()) return BadField(source, "added_tokens", "must be an array");
  for (size_t i = 0; i < node.size(); ++i) {
    const Json& e = node[i];
    const std::string path = absl::StrCat("added_tokens[", i, "]");
    if (!e.is_object()) return BadField(source, path, "must be an object");
    auto id = e.find("id");
    if (id == e.end() || !id->is_number_integer()) return BadField(source, path + ".id", "must be an integer");
    auto content = e.find("content");
    if (content == e.end() || !content->is_string() || content->get<std::string>().empty()) {
      return BadField(source, path + ".content", "must be a non-empty string");
    }
    AddedToken t;
    t.content = content->get<std::string>();
    const int64_t id64 = id->get<int64_t>();
    if (id64 < 0 || id64 > kMaxTokenId) return BadField(source, path + ".id", absl::StrCat("id ", id64, " is out of range"));
    t.id = static_cast<int32_t>(id64);
    ROLL_ASSIGN_OR_RETURN(t.special, OptionalBool(e, "special", false, source, path));
    ROLL_ASSIGN_OR_RETURN(t.lstrip, OptionalBool(e, "lstrip", false, source, path));
    ROLL_ASSIGN_OR_RETURN(t.rstrip, OptionalBool(e, "rstrip", false, source, path));
    ROLL_RETURN_IF_ERROR(AddId(t.id, t.content, path + ".id"));
    if (t.special) id_flags[t.id] |= kSpecial;
    added_to_id[t.content] = t.id;
    added.push_back(std::move(t));
  }
  std::vector<int> order(added.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int x, int y) { return added[x].content.size() > added[y].content.size(); });
  for (int k : order) added_by_first_byte[static_cast<unsigned char>(added[k].content[0])].push_back(k);
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::ParsePostProcessor(const Json& node, const std::string& path) {
  if (node.is_null()) return absl::OkStatus();
  if (!node.is_object()) return BadField(source, path, "must be an object or null");
  const std::string type = TypeOf(node);
  if (type == "ByteLevel") return absl::OkStatus();  // only adjusts offsets
  if (type == "Sequence") {
    auto it = node.find("processors");
    if (it == node.end() || !it->is_array()) return BadField(source, path + ".processors", "must be an array");
    for (size_t i = 0; i < it->size(); ++i) {
      ROLL_RETURN_IF_ERROR(ParsePostProcessor((*it)[i], absl::StrCat(path, ".processors[", i, "]")));
    }
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") {
    return Unsupported(source, path + ".type",
                       absl::StrCat("post-processor '", type,
                                    "' is not supported (ByteLevel, TemplateProcessing, Sequence)"));
  }
  if (!single_template.empty()) return Unsupported(source, path, "more than one TemplateProcessing");
  auto single = node.find("single");
  if (single == node.end() || !single->is_array()) return BadField(source, path + ".single", "must be an array");
  const Json* specials = nullptr;
  if (auto s = node.find("special_tokens"); s != node.end() && s->is_object()) specials = &*s;
  bool saw_sequence = false;
  for (size_t i = 0; i < single->size(); ++i) {
    const Json& e = (*single)[i];
    const std::string field = absl::StrCat(path, ".single[", i, "]");
    TemplateItem item;
    if (auto seq = e.find("Sequence"); e.is_object() && seq != e.end()) {
      item.is_sequence = true;
      saw_sequence = true;
    } else if (auto sp = e.find("SpecialToken"); e.is_object() && sp != e.end() && sp->is_object() &&
                                                  sp->contains("id") && (*sp)["id"].is_string()) {
      const std::string name = (*sp)["id"].get<std::string>();
      const Json* entry = nullptr;
      if (specials != nullptr) {
        if (auto it = specials->find(name); it != specials->end()) entry = &*it;
      }
      if (entry != nullptr && entry->contains("ids") && (*entry)["ids"].is_array()) {
        for (const Json& id : (*entry)["ids"]) {
          if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
              static_cast<size_t>(id.get<int64_t>()) >= id_to_token.size() ||
              !(id_flags[id.get<int64_t>()] & kPresent)) {
            return BadField(source, absl::StrCat(path, ".special_tokens[\"", name, "\"].ids"),
                            "must list ids of existing tokens");
          }
          item.ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
        }
      } else if (auto it = added_to_id.find(name); it != added_to_id.end()) {
        item.ids.push_back(it->second);
      } else if (auto jt = vocab.find(name); jt != vocab.end()) {
        item.ids.push_back(jt->second);
      } else {
        return BadField(source, field, absl::StrCat("special token '", name, "' is not defined"));
      }
    } else {
      return BadField(source, field, "must be {\"Sequence\": ...} or {\"SpecialToken\": {\"id\": ...}}");
    }
    single_template.push_back(std::move(item));
  }
  if (!saw_sequence) return BadField(source, path + ".single", "has no Sequence item");
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::ParseDecoder(const Json& node, const std::string& path) {
  if (node.is_null()) {
    decode_join_with_space = true;
    return absl::OkStatus();
  }
  if (!node.is_object()) return BadField(source, path, "must be an object or null");
  const std::string type = TypeOf(node);
  if (type == "ByteLevel") {
    decode_byte_level = true;
  } else if (type == "Fuse") {
    // Concatenation is what every supported decoder does already.
  } else if (type == "Sequence") {
    auto it = node.find("decoders");
    if (it == node.end() || !it->is_array()) return BadField(source, path + ".decoders", "must be an array");
    for (size_t i = 0; i < it->size(); ++i) {
      ROLL_RETURN_IF_ERROR(ParseDecoder((*it)[i], absl::StrCat(path, ".decoders[", i, "]")));
    }
  } else {
    return Unsupported(source, path + ".type",
                       absl::StrCat("decoder '", type, "' is not supported (ByteLevel, Fuse, Sequence)"));
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::Impl::Parse(const Json& root) {
  if (!root.is_object()) return BadField(source, "(root)", "must be a JSON object");
  auto get = [&](const char* key) -> const Json& {
    static const Json kNull;
    auto it = root.find(key);
    return it == root.end() ? kNull : *it;
  };
  if (!root.contains("model")) return BadField(source, "model", "is missing");
  ROLL_RETURN_IF_ERROR(ParseModel(get("model")));
  ROLL_RETURN_IF_ERROR(ParseAddedTokens(get("added_tokens")));
  ROLL_RETURN_IF_ERROR(ParseNormalizer(get("normalizer"), "normalizer"));
  ROLL_RETURN_IF_ERROR(ParsePreTokenizer(get("pre_tokenizer"), "pre_tokenizer"));
  ROLL_RETURN_IF_ERROR(ParsePostProcessor(get("post_processor"), "post_processor"));
  ROLL_RETURN_IF_ERROR(ParseDecoder(get("decoder"), "decoder"));
  if (id_to_token.empty()) return BadField(source, "model.vocab", "has no tokens");
  return absl::OkStatus();
}

void Tokenizer::Impl::EncodeText(std::string_view text, std::vector<int32_t>* out) const {
  size_t segment_start = 0;
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    const auto& candidates = added_by_first_byte[static_cast<unsigned char>(text[i])];
    const AddedToken* hit = nullptr;
    for (int k : candidates) {
      const std::string& c = added[k].content;
      if (text.compare(i, c.size(), c) == 0) {
        hit = &added[k];
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    size_t begin = i, end = i + hit->content.size();
    if (hit->lstrip) {
      while (begin > segment_start && IsAsciiSpace(text[begin - 1])) --begin;
    }
    if (hit->rstrip) {
      while (end < n && IsAsciiSpace(text[end])) ++end;
    }
    EncodeSegment(text.substr(segment_start, begin - segment_start), out);
    out->push_back(hit->id);
    segment_start = i = end;
  }
  EncodeSegment(text.substr(segment_start), out);
}

void Tokenizer::Impl::EncodeSegment(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  std::string normalized;
  if (nfc) {
    // Input is valid UTF-8 here, so NFC cannot fail short of ICU itself
    // breaking; then the text goes on unnormalised.
    auto r = ti::NormalizeNfc(text);
    if (r.ok()) {
      normalized = std::move(*r);
      text = normalized;
    }
  }
  if (pre_tokenizer.empty()) {
    EncodeWord(text, out);
    return;
  }
  std::vector<std::string> pieces{std::string(text)};
  std::vector<std::string> next;
  std::vector<std::pair<size_t, size_t>> matches;
  for (const PreTokenizerStep& step : pre_tokenizer) {
    next.clear();
    for (std::string& piece : pieces) {
      if (step.add_prefix_space && (piece.empty() || piece[0] != ' ')) piece.insert(0, 1, ' ');
      if (step.regex == nullptr) {
        next.push_back(std::move(piece));
        continue;
      }
      matches.clear();
      step.regex->FindAll(piece, &matches);
      size_t cursor = 0;
      for (const auto& [b, e] : matches) {
        if (b > cursor) next.emplace_back(piece, cursor, b - cursor);
        if (!step.remove_matches) next.emplace_back(piece, b, e - b);
        cursor = e;
      }
      if (cursor < piece.size()) next.emplace_back(piece, cursor, piece.size() - cursor);
    }
    pieces.swap(next);
  }
  for (const std::string& piece : pieces) {
    if (!piece.empty()) EncodeWord(piece, out);
  }
}

void Tokenizer::Impl::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  std::string mapped;
  if (byte_level) {
    const auto& table = ti::ByteToUnicode();
    mapped.reserve(word.size() * 2);
    for (unsigned char b : word) mapped += table[b];
    word = mapped;
  }
  if (ignore_merges) {
    if (auto it = vocab.find(Sv(word)); it != vocab.end()) {
      out->push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedWordBytes;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mu);
    if (auto it = cache.find(Sv(word)); it != cache.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out->size();
  Bpe(word, out);
  if (cacheable) {
    std::vector<int32_t> ids(out->begin() + start, out->end());
    std::lock_guard<std::mutex> lock(cache_mu);
    if (cache.size() >= kMaxCacheEntries) cache.clear();
    cache.emplace(std::string(word), std::move(ids));
  }
}

void Tokenizer::Impl::Bpe(std::string_view word, std::vector<int32_t>* out) const {
  struct Symbol {
    int32_t id;  // -1 once merged into its left neighbour
    int prev;
    int next;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (size_t pos = 0; pos < word.size();) {
    const size_t begin = pos;
    ti::NextCodePoint(word, &pos);
    auto it = vocab.find(Sv(word.substr(begin, pos - begin)));
    // A character outside the vocab becomes unk_token, or is dropped when
    // there is none, as Hugging Face's BPE does.
    if (it != vocab.end()) {
      symbols.push_back({it->second, 0, 0});
    } else if (unk_id) {
      symbols.push_back({*unk_id, 0, 0});
    }
  }
  const int n = static_cast<int>(symbols.size());
  for (int i = 0; i < n; ++i) {
    symbols[i].prev = i - 1;
    symbols[i].next = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int32_t rank;
    int left;
    int right;
    int32_t merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto consider = [&](int left) {
    const int right = symbols[left].next;
    if (right < 0) return;
    auto it = merges.find(PairKey(symbols[left].id, symbols[right].id));
    if (it != merges.end()) queue.push({it->second.first, left, right, it->second.second});
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& l = symbols[c.left];
    if (l.id < 0 || l.next != c.right || symbols[c.right].id < 0) continue;
    // Either side may have changed since this candidate was queued.
    auto it = merges.find(PairKey(l.id, symbols[c.right].id));
    if (it == merges.end() || it->second.first != c.rank) continue;
    l.id = c.merged;
    l.next = symbols[c.right].next;
    if (l.next >= 0) symbols[l.next].prev = c.left;
    symbols[c.right].id = -1;
    if (l.prev >= 0) consider(l.prev);
    consider(c.left);
  }
  for (int i = n > 0 ? 0 : -1; i >= 0; i = symbols[i].next) out->push_back(symbols[i].id);
}

absl::StatusOr<Tokenizer> Tokenizer::FromJson(std::string_view json, std::string_view source) {
  Json root;
  try {
    root = Json::parse(json.begin(), json.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer '", Sv(source), "': invalid JSON: ", e.what()));
  }
  auto impl = std::make_shared<Impl>();
  impl->source = std::string(source);
  try {
    ROLL_RETURN_IF_ERROR(impl->Parse(root));
  } catch (const Json::exception& e) {
    // Parse checks types before reading them; this is a last line of defence.
    return absl::InvalidArgumentError(absl::StrCat("tokenizer '", Sv(source), "': ", e.what()));
  }
  impl->json_text = std::string(json);

  Tokenizer tok(impl);
  for (const TemplateItem& item : impl->single_template) {
    if (item.is_sequence) break;
    if (!item.ids.empty()) tok.bos_id_ = item.ids.front();
    break;
  }
  // Only added tokens count: a plain vocab entry spelled "<s>" (Qwen has
  // one) is ordinary text, not a role marker.
  auto first_known = [&](std::initializer_list<const char*> names) -> std::optional<int32_t> {
    for (const char* name : names) {
      if (auto it = impl->added_to_id.find(name); it != impl->added_to_id.end()) return it->second;
    }
    return std::nullopt;
  };
  if (!tok.bos_id_) tok.bos_id_ = first_known({"<|begin_of_text|>", "<s>", "<bos>"});
  tok.eos_id_ = first_known({"<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>"});
  tok.pad_id_ = first_known({"<pad>", "<|pad|>", "[PAD]"});
  return tok;
}

absl::StatusOr<Tokenizer> Tokenizer::FromFile(const std::string& path) {
  ROLL_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  ROLL_ASSIGN_OR_RETURN(Tokenizer tok, FromJson(text, path));
  const std::filesystem::path config = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::exists(config, ec)) {
    ROLL_ASSIGN_OR_RETURN(std::string config_text, ReadFile(config.string()));
    ROLL_RETURN_IF_ERROR(tok.ApplyTokenizerConfig(config_text, config.string()));
  }
  return tok;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::string repaired;
  if (!tokenizer_internal::IsValidUtf8(text)) {
    repaired = tokenizer_internal::ToValidUtf8(text);
    text = repaired;
  }
  std::vector<int32_t> body;
  body.reserve(text.size() / 3 + 4);
  impl_->EncodeText(text, &body);
  if (!add_special_tokens || impl_->single_template.empty()) return body;
  std::vector<int32_t> out;
  out.reserve(body.size() + impl_->single_template.size());
  for (const TemplateItem& item : impl_->single_template) {
    if (item.is_sequence) {
      out.insert(out.end(), body.begin(), body.end());
    } else {
      out.insert(out.end(), item.ids.begin(), item.ids.end());
    }
  }
  return out;
}

absl::StatusOr<std::string> Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& im = *impl_;
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    if (id < 0 || static_cast<size_t>(id) >= im.id_to_token.size() || !(im.id_flags[id] & Impl::kPresent)) {
      return absl::InvalidArgumentError(absl::StrCat("Decode: ids[", i, "] = ", id, " names no token of '",
                                                     im.source, "' (vocab_size ", vocab_size(), ")"));
    }
    if (skip_special_tokens && (im.id_flags[id] & Impl::kSpecial)) continue;
    const std::string& token = im.id_to_token[id];
    if (im.decode_join_with_space && !out.empty()) out.push_back(' ');
    if (!im.decode_byte_level) {
      out += token;
      continue;
    }
    // A token with a character outside the byte map (an added token such as
    // a CJK word) contributes its own UTF-8 bytes, as Hugging Face does.
    const size_t mark = out.size();
    for (size_t pos = 0; pos < token.size();) {
      const int byte = tokenizer_internal::UnicodeToByte(tokenizer_internal::NextCodePoint(token, &pos));
      if (byte < 0) {
        out.resize(mark);
        out += token;
        break;
      }
      out.push_back(static_cast<char>(byte));
    }
  }
  // Byte-level tokens may split a character; a sequence that ends mid-way
  // decodes to U+FFFD like Hugging Face's lossy conversion.
  if (!tokenizer_internal::IsValidUtf8(out)) return tokenizer_internal::ToValidUtf8(out);
  return out;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_to_token.size()); }

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  if (auto it = impl_->added_to_id.find(Sv(token)); it != impl_->added_to_id.end()) return it->second;
  if (auto it = impl_->vocab.find(Sv(token)); it != impl_->vocab.end()) return it->second;
  return std::nullopt;
}

std::optional<std::string> Tokenizer::IdToToken(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_to_token.size() || !(impl_->id_flags[id] & Impl::kPresent)) {
    return std::nullopt;
  }
  return impl_->id_to_token[id];
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->id_flags.size() && (impl_->id_flags[id] & Impl::kSpecial);
}

absl::Status Tokenizer::SetRole(std::string_view token, std::optional<int32_t>* role) {
  auto id = TokenToId(token);
  if (!id) return absl::NotFoundError(absl::StrCat("token '", Sv(token), "' is not in tokenizer '", impl_->source, "'"));
  *role = id;
  return absl::OkStatus();
}
absl::Status Tokenizer::SetBosToken(std::string_view token) { return SetRole(token, &bos_id_); }
absl::Status Tokenizer::SetEosToken(std::string_view token) { return SetRole(token, &eos_id_); }
absl::Status Tokenizer::SetPadToken(std::string_view token) { return SetRole(token, &pad_id_); }

absl::Status Tokenizer::ApplyTokenizerConfig(std::string_view json, std::string_view source) {
  Json root;
  try {
    root = Json::parse(json.begin(), json.end());
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer config '", Sv(source), "': invalid JSON: ", e.what()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer config '", Sv(source), "': must be a JSON object"));
  }
  const std::pair<const char*, std::optional<int32_t>*> roles[] = {
      {"bos_token", &bos_id_}, {"eos_token", &eos_id_}, {"pad_token", &pad_id_}};
  for (const auto& [key, role] : roles) {
    auto it = root.find(key);
    if (it == root.end() || it->is_null()) continue;
    const Json* content = &*it;
    if (it->is_object()) {
      auto c = it->find("content");
      content = c == it->end() ? nullptr : &*c;
    }
    if (content == nullptr || !content->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("tokenizer config '", Sv(source), "': field '", key,
                                                     "' must be a string or an object with \"content\""));
    }
    absl::Status s = SetRole(content->get<std::string>(), role);
    if (!s.ok()) return Annotate(s, absl::StrCat("tokenizer config '", Sv(source), "': field '", key, "'"));
  }
  return absl::OkStatus();
}

const std::string& Tokenizer::json() const { return impl_->json_text; }

absl::Status Tokenizer::SaveJson(const std::string& path) const {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot open '", path, "' for writing"));
  out << impl_->json_text;
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("writing '", path, "' failed"));
  return absl::OkStatus();
}

}  // namespace roll
