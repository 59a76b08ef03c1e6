// Builds the character tokenizer as an ordinary tokenizer.json, so it goes
// through the same loader and can be saved with a checkpoint.

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/container/flat_hash_set.h"
#include "models/tokenizer_text.h"
#include "roll/models/tokenizer.h"

namespace roll {

absl::StatusOr<std::string> MakeCharTokenizerJson(const CharTokenizerOptions& options) {
  namespace ti = tokenizer_internal;
  using Json = nlohmann::ordered_json;
  if (options.alphabet.empty()) return absl::InvalidArgumentError("char tokenizer: alphabet is empty");
  if (!ti::IsValidUtf8(options.alphabet)) {
    return absl::InvalidArgumentError("char tokenizer: alphabet is not valid UTF-8");
  }
  std::vector<std::string> symbols;
  absl::flat_hash_set<std::string> seen;
  for (const std::string& s : options.special_tokens) {
    if (s.empty()) return absl::InvalidArgumentError("char tokenizer: a special token is empty");
    if (!ti::IsValidUtf8(s)) {
      return absl::InvalidArgumentError(absl::StrCat("char tokenizer: special token '", s, "' is not valid UTF-8"));
    }
    if (!seen.insert(s).second) {
      return absl::InvalidArgumentError(absl::StrCat("char tokenizer: special token '", s, "' is listed twice"));
    }
    symbols.push_back(s);
  }
  const size_t num_special = symbols.size();
  for (size_t pos = 0; pos < options.alphabet.size();) {
    const size_t begin = pos;
    ti::NextCodePoint(options.alphabet, &pos);
    std::string ch = options.alphabet.substr(begin, pos - begin);
    if (seen.contains(ch)) {
      if (std::find(symbols.begin(), symbols.begin() + num_special, ch) != symbols.begin() + num_special) {
        return absl::InvalidArgumentError(
            absl::StrCat("char tokenizer: '", ch, "' is both a special token and an alphabet character"));
      }
      continue;  // repeated alphabet characters keep their first id
    }
    seen.insert(ch);
    symbols.push_back(std::move(ch));
  }

  Json vocab = Json::object();
  for (size_t i = 0; i < symbols.size(); ++i) vocab[symbols[i]] = static_cast<int64_t>(i);
  Json added = Json::array();
  for (size_t i = 0; i < num_special; ++i) {
    added.push_back({{"id", static_cast<int64_t>(i)},
                     {"content", symbols[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  }
  const auto has = [&](const char* name) {
    return std::find(symbols.begin(), symbols.begin() + num_special, name) != symbols.begin() + num_special;
  };
  Json post_processor = nullptr;
  if (has("<bos>")) {
    const int64_t bos = std::find(symbols.begin(), symbols.end(), "<bos>") - symbols.begin();
    post_processor = {
        {"type", "TemplateProcessing"},
        {"single", {{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair",
         {{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
          {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
        {"special_tokens", {{"<bos>", {{"id", "<bos>"}, {"ids", {bos}}, {"tokens", {"<bos>"}}}}}}};
  }
  Json root = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", nullptr},
      {"post_processor", post_processor},
      {"decoder", {{"type", "Fuse"}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", has("<unk>") ? Json("<unk>") : Json(nullptr)},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", Json::array()}}}};
  return root.dump(2);
}

absl::StatusOr<Tokenizer> MakeCharTokenizer(const CharTokenizerOptions& options) {
  ROLL_ASSIGN_OR_RETURN(std::string json, MakeCharTokenizerJson(options));
  return Tokenizer::FromJson(json, "<char tokenizer>");
}

}  // namespace roll
