#pragma once
// Tokenizer: a Hugging Face `tokenizer.json` tokenizer of the byte-level BPE
// family (GPT-2, LLaMA-3, Qwen2/Qwen2.5/Qwen3), plus BPE files without a
// byte-level step, such as the character tokenizer MakeCharTokenizer builds.
//
// What a file may contain (anything else is refused at load with an error
// naming the file and the JSON field):
//   normalizer     null, NFC, or a Sequence of NFC
//   pre_tokenizer  null, ByteLevel (use_regex, add_prefix_space), Split with a
//                  regex (behavior Isolated or Removed, invert false), or a
//                  Sequence of those
//   model          BPE: vocab, merges as "a b" strings or [a, b] pairs,
//                  ignore_merges, unk_token; no dropout, no subword prefixes,
//                  no byte_fallback
//   added_tokens   matched before anything else, longest match first, on the
//                  raw text; lstrip/rstrip are honoured, single_word and
//                  normalized are not (no supported model sets them)
//   post_processor null, ByteLevel, TemplateProcessing (single sequences),
//                  or a Sequence of those
//   decoder        null (tokens joined by spaces, as Hugging Face does),
//                  ByteLevel, Fuse, or a Sequence of those
//
// Ownership and thread-safety: a Tokenizer is a cheap handle to immutable
// shared state; copies share it. After construction every const method may be
// called from any number of threads at once (Encode's per-word cache is
// guarded by a mutex). The Set*Token methods change only this handle and must
// not race with other calls on the same handle.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "roll/common/status.h"

namespace roll {

class Tokenizer {
 public:
  // Reads `path` (a tokenizer.json). If a `tokenizer_config.json` sits in the
  // same directory, its bos_token / eos_token / pad_token are applied.
  static absl::StatusOr<Tokenizer> FromFile(const std::string& path);
  // Parses tokenizer.json text; `source` names it in error messages.
  static absl::StatusOr<Tokenizer> FromJson(std::string_view json,
                                            std::string_view source = "<json>");

  // Text to ids. Invalid UTF-8 in `text` is replaced by U+FFFD first.
  // add_special_tokens applies the file's TemplateProcessing post-processor
  // (LLaMA-3 prepends <|begin_of_text|>; GPT-2 and Qwen add nothing).
  std::vector<int32_t> Encode(std::string_view text,
                              bool add_special_tokens = false) const;
  // Ids to text. An id that names no token is an error. skip_special_tokens
  // drops added tokens marked "special".
  absl::StatusOr<std::string> Decode(const std::vector<int32_t>& ids,
                                     bool skip_special_tokens = false) const;

  // One past the largest id of any token (vocab or added), i.e. the smallest
  // embedding table that can hold every id this tokenizer emits.
  int32_t vocab_size() const;
  std::optional<int32_t> TokenToId(std::string_view token) const;
  std::optional<std::string> IdToToken(int32_t id) const;
  // True for added tokens flagged "special".
  bool IsSpecial(int32_t id) const;

  // Role tokens. Taken from tokenizer_config.json when FromFile finds one;
  // otherwise guessed from well-known names (<|begin_of_text|>, <s>, <bos>;
  // <|end_of_text|>, <|endoftext|>, </s>, <eos>; <pad>, <|pad|>), and for bos
  // from the TemplateProcessing prefix. nullopt when unknown.
  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::optional<int32_t> eos_id() const { return eos_id_; }
  std::optional<int32_t> pad_id() const { return pad_id_; }
  // Each names an existing token; an unknown token is an error.
  absl::Status SetBosToken(std::string_view token);
  absl::Status SetEosToken(std::string_view token);
  absl::Status SetPadToken(std::string_view token);
  // Applies bos_token / eos_token / pad_token of a tokenizer_config.json text
  // (a string or an object with "content"); absent or null keys are left.
  absl::Status ApplyTokenizerConfig(std::string_view json,
                                    std::string_view source = "<json>");

  // The tokenizer.json text this tokenizer was built from, so a checkpoint
  // can carry it unchanged.
  const std::string& json() const;
  absl::Status SaveJson(const std::string& path) const;


 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  absl::Status SetRole(std::string_view token, std::optional<int32_t>* role);

  std::shared_ptr<const Impl> impl_;
  std::optional<int32_t> bos_id_;
  std::optional<int32_t> eos_id_;
  std::optional<int32_t> pad_id_;
};

// A character-level tokenizer for tiny synthetic tasks, expressed as a real
// tokenizer.json (BPE with no merges, no pre-tokenizer, Fuse decoder) so that
// a checkpoint can ship it and any Hugging Face loader reads it back.
// Ids: the special tokens first, in the order given, then each distinct
// character (UTF-8 code point) of `alphabet` in order of first appearance.
// Characters outside the alphabet are dropped, or become "<unk>" when that is
// among the special tokens. If "<bos>" is among them, Encode with
// add_special_tokens prepends it. Role ids come from <bos>, <eos>, <pad>.
struct CharTokenizerOptions {
  std::string alphabet;
  std::vector<std::string> special_tokens = {"<pad>", "<bos>", "<eos>"};
};
absl::StatusOr<std::string> MakeCharTokenizerJson(const CharTokenizerOptions& options);
absl::StatusOr<Tokenizer> MakeCharTokenizer(const CharTokenizerOptions& options);

}  // namespace roll
