#include "roll/models/tokenizer.h"
#include "testing/files.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <unistd.h>

#include <nlohmann/json.hpp>

namespace roll {
namespace {

using Json = nlohmann::json;

// Substring check with a readable failure (no gmock dependency).
::testing::AssertionResult Contains(const std::string& haystack, const std::string& needle) {
  if (haystack.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "'" << haystack << "' does not contain '" << needle << "'";
}

std::string Fixture(const std::string& name) {
  return std::string(ROLL_SOURCE_DIR) + "/tests/models/testdata/tokenizers/" + name;
}

Json ReadJson(const std::string& path) {
  EXPECT_TRUE(std::filesystem::exists(path)) << path;
  return Json::parse(testing::ReadFile(path));
}

// Loading a multi-megabyte tokenizer.json takes a while; load each once.
const Tokenizer& Load(const std::string& name) {
  static auto* cache = new std::map<std::string, Tokenizer>();
  auto it = cache->find(name);
  if (it == cache->end()) {
    auto tok = Tokenizer::FromFile(Fixture(name + ".json"));
    if (!tok.ok()) ADD_FAILURE() << tok.status();
    it = cache->emplace(name, *std::move(tok)).first;
  }
  return it->second;
}

std::string Show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

// --- Real tokenizers against ids produced by the reference implementation ---

class ReferenceIdsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceIdsTest, EncodeAndDecodeMatchReference) {
  const Tokenizer& tok = Load(GetParam());
  const Json expected = ReadJson(Fixture(GetParam() + "_expected.json"));
  ASSERT_GE(expected["cases"].size(), 20u);
  for (const Json& c : expected["cases"]) {
    const std::string text = c["text"].get<std::string>();
    SCOPED_TRACE("text: " + text);
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    const auto got = tok.Encode(text);
    EXPECT_EQ(got, ids) << "got " << Show(got) << "\nwant " << Show(ids);
    EXPECT_EQ(tok.Encode(text, /*add_special_tokens=*/true),
              c["ids_with_special_tokens"].get<std::vector<int32_t>>());
    auto decoded = tok.Decode(ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, c["decoded"].get<std::string>());
    auto skipped = tok.Decode(ids, /*skip_special_tokens=*/true);
    ASSERT_TRUE(skipped.ok()) << skipped.status();
    EXPECT_EQ(*skipped, c["decoded_skip_special"].get<std::string>());
  }
}

TEST_P(ReferenceIdsTest, DecodeOfEncodeIsIdentityForNormalizedText) {
  const Tokenizer& tok = Load(GetParam());
  const Json expected = ReadJson(Fixture(GetParam() + "_expected.json"));
  int checked = 0;
  for (const Json& c : expected["cases"]) {
    const std::string text = c["text"].get<std::string>();
    // Qwen's NFC normalizer changes decomposed accents; every other text must
    // come back byte for byte.
    if (GetParam() == "qwen2_5" && text.find("Decomposed") == 0) continue;
    auto decoded = tok.Decode(tok.Encode(text));
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, text);
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ReferenceIdsTest, ::testing::Values("gpt2", "qwen2_5", "llama3_trimmed"));

TEST(TokenizerTest, VocabSizeAndRoleTokensOfRealFiles) {
  const Tokenizer& gpt2 = Load("gpt2");
  EXPECT_EQ(gpt2.vocab_size(), 50257);
  EXPECT_EQ(gpt2.eos_id(), 50256);
  EXPECT_EQ(gpt2.TokenToId("Hello"), 15496);
  EXPECT_EQ(gpt2.IdToToken(995), "Ġworld");
  EXPECT_EQ(gpt2.IdToToken(50257), std::nullopt);
  EXPECT_TRUE(gpt2.IsSpecial(50256));
  EXPECT_FALSE(gpt2.IsSpecial(15496));

  const Tokenizer& qwen = Load("qwen2_5");
  EXPECT_EQ(qwen.vocab_size(), 151665);
  EXPECT_EQ(qwen.eos_id(), 151643);
  EXPECT_EQ(qwen.TokenToId("<|im_start|>"), 151644);
  EXPECT_EQ(qwen.TokenToId("<|im_end|>"), 151645);
  // Qwen's vocab holds "<s>" as ordinary text; that is no bos token.
  EXPECT_EQ(qwen.bos_id(), std::nullopt);

  const Tokenizer& llama = Load("llama3_trimmed");
  EXPECT_EQ(llama.bos_id(), 128000);
  EXPECT_EQ(llama.eos_id(), 128001);
  EXPECT_EQ(llama.vocab_size(), 128010);
  // Ids between the trimmed vocab and the special tokens name nothing.
  EXPECT_EQ(llama.IdToToken(50000), std::nullopt);
}

TEST(TokenizerTest, QwenAppliesNfcBeforeSplitting) {
  const Tokenizer& qwen = Load("qwen2_5");
  EXPECT_EQ(qwen.Encode("cafe\xCC\x81"), qwen.Encode("caf\xC3\xA9"));
  EXPECT_EQ(*qwen.Decode(qwen.Encode("cafe\xCC\x81")), "caf\xC3\xA9");
}

TEST(TokenizerTest, DecodeRejectsUnknownIdsAndSkipsSpecials) {
  const Tokenizer& qwen = Load("qwen2_5");
  auto bad = qwen.Decode({9707, 151665});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(std::string(bad.status().message()), "ids[1] = 151665"));
  EXPECT_FALSE(qwen.Decode({-1}).ok());
  EXPECT_EQ(*qwen.Decode({151644, 9707, 151645}, true), "Hello");
  EXPECT_EQ(*qwen.Decode({151644, 9707, 151645}), "<|im_start|>Hello<|im_end|>");
}

TEST(TokenizerTest, InvalidUtf8IsReplacedNotFatal) {
  const Tokenizer& gpt2 = Load("gpt2");
  EXPECT_EQ(gpt2.Encode("a\xFF" "b"), gpt2.Encode("a\xEF\xBF\xBD" "b"));
  // A token holding half a character decodes to U+FFFD, not to broken UTF-8.
  const auto ids = gpt2.Encode("\xE6\x97\xA5");  // 日 is split into byte tokens
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(*gpt2.Decode({ids[0]}), "\xEF\xBF\xBD");
}

TEST(TokenizerTest, LongWordsAndLongTextsRoundTrip) {
  const Tokenizer& gpt2 = Load("gpt2");
  const std::string word(20000, 'a');
  EXPECT_EQ(*gpt2.Decode(gpt2.Encode(word)), word);
  std::string text;
  for (int i = 0; i < 500; ++i) text += "Line " + std::to_string(i) + ": the quick brown fox, again!\n";
  const auto ids = gpt2.Encode(text);
  EXPECT_LT(ids.size(), text.size() / 2);
  EXPECT_EQ(*gpt2.Decode(ids), text);
}

TEST(TokenizerTest, ConcurrentEncodeGivesTheSameIds) {
  const Tokenizer& qwen = Load("qwen2_5");
  const Json expected = ReadJson(Fixture("qwen2_5_expected.json"));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        for (const Json& c : expected["cases"]) {
          if (qwen.Encode(c["text"].get<std::string>()) != c["ids"].get<std::vector<int32_t>>()) ++mismatches[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

// --- Small hand-written files for behaviour the real files do not show ---

std::string TinyJson(const std::string& model_extra, const std::string& merges,
                     const std::string& pre_tokenizer = "null", const std::string& added = "[]") {
  return R"({"added_tokens":)" + added + R"(,"normalizer":null,"pre_tokenizer":)" + pre_tokenizer +
         R"(,"post_processor":null,"decoder":{"type":"Fuse"},"model":{"type":"BPE",)" + model_extra +
         R"("vocab":{"a":0,"b":1,"c":2,"ab":3,"bc":4,"abc":5," ":6,"<x>":7},"merges":)" + merges + "}}";
}

std::vector<int32_t> EncodeWith(const std::string& json, std::string_view text) {
  auto tok = Tokenizer::FromJson(json);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? tok->Encode(text) : std::vector<int32_t>{};
}

TEST(TokenizerTest, MergesApplyByRank) {
  EXPECT_EQ(EncodeWith(TinyJson("", R"(["b c","a b"])"), "abc"), (std::vector<int32_t>{0, 4}));
  EXPECT_EQ(EncodeWith(TinyJson("", R"(["a b","b c"])"), "abc"), (std::vector<int32_t>{3, 2}));
  EXPECT_EQ(EncodeWith(TinyJson("", R"(["a b","ab c"])"), "abc"), (std::vector<int32_t>{5}));
  // Pair spelling is the same merge list.
  EXPECT_EQ(EncodeWith(TinyJson("", R"([["b","c"],["a","b"]])"), "abc"), (std::vector<int32_t>{0, 4}));
  // Repeated pairs merge left to right.
  EXPECT_EQ(EncodeWith(TinyJson("", R"(["a b"])"), "ababa"), (std::vector<int32_t>{3, 3, 0}));
}

TEST(TokenizerTest, IgnoreMergesTakesWholeWordsFromTheVocab) {
  EXPECT_EQ(EncodeWith(TinyJson(R"("ignore_merges":true,)", "[]"), "abc"), (std::vector<int32_t>{5}));
  EXPECT_EQ(EncodeWith(TinyJson(R"("ignore_merges":false,)", "[]"), "abc"), (std::vector<int32_t>{0, 1, 2}));
}

TEST(TokenizerTest, UnknownCharactersAreDroppedOrBecomeUnk) {
  EXPECT_EQ(EncodeWith(TinyJson("", "[]"), "azb"), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(EncodeWith(TinyJson(R"("unk_token":"<x>",)", "[]"), "azb"), (std::vector<int32_t>{0, 7, 1}));
}

TEST(TokenizerTest, SplitRemovedAndAddedTokenStripping) {
  const std::string split_removed =
      R"({"type":"Split","pattern":{"String":" "},"behavior":"Removed","invert":false})";
  EXPECT_EQ(EncodeWith(TinyJson("", R"(["a b"])", split_removed), "ab  c"), (std::vector<int32_t>{3, 2}));
  const std::string added =
      R"([{"id":7,"content":"<x>","special":true,"lstrip":true,"rstrip":true}])";
  EXPECT_EQ(EncodeWith(TinyJson("", "[]", "null", added), "a <x> b"), (std::vector<int32_t>{0, 7, 1}));
  const std::string plain = R"([{"id":7,"content":"<x>","special":true}])";
  EXPECT_EQ(EncodeWith(TinyJson("", "[]", "null", plain), "a <x> b"), (std::vector<int32_t>{0, 6, 7, 6, 1}));
}

TEST(TokenizerTest, ByteLevelAddPrefixSpace) {
  // Ġ (U+0120) is the byte-level symbol for a space.
  const std::string json =
      R"({"added_tokens":[],"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":true,"use_regex":true},
          "decoder":{"type":"ByteLevel"},
          "model":{"type":"BPE","vocab":{"h":0,"i":1,"Ġ":2,"Ġh":3,"Ġhi":4},"merges":["Ġ h","Ġh i"]}})";
  auto tok = Tokenizer::FromJson(json);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->Encode("hi hi"), (std::vector<int32_t>{4, 4}));
  EXPECT_EQ(*tok->Decode({4, 4}), " hi hi");
}

// --- Bad files ---

absl::Status LoadError(const std::string& json) {
  auto tok = Tokenizer::FromJson(json, "bad.json");
  return tok.ok() ? absl::OkStatus() : tok.status();
}

TEST(TokenizerTest, BadFilesGiveErrorsNamingFileAndField) {
  auto missing = Tokenizer::FromFile("/nonexistent/dir/tokenizer.json");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(std::string(missing.status().message()), "/nonexistent/dir/tokenizer.json"));

  struct Case {
    std::string json;
    std::string want1, want2;
  } cases[] = {
      {R"({"model": )", "bad.json", "invalid JSON"},
      {R"([1,2])", "bad.json", "(root)"},
      {R"({"added_tokens":[]})", "bad.json", "'model'"},
      {R"({"model":{"type":"WordPiece","vocab":{"a":0}}})", "model.type", "WordPiece"},
      {R"({"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a c"]}})", "model.merges[0]", "'c'"},
      {R"({"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a b"]}})", "model.merges[0]", "'ab'"},
      {R"({"model":{"type":"BPE","vocab":{"a":0},"merges":["ab"]}})", "model.merges[0]", "left right"},
      {R"({"model":{"type":"BPE","vocab":{"a":"x"},"merges":[]}})", "model.vocab[\"a\"]", "integer"},
      {R"({"model":{"type":"BPE","vocab":{"a":-3},"merges":[]}})", "model.vocab[\"a\"]", "out of range"},
      {R"({"model":{"type":"BPE","vocab":{},"merges":[]}})", "model.vocab", "no tokens"},
      {R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[],"unk_token":"<unk>"}})", "model.unk_token", "<unk>"},
      {R"({"model":{"type":"BPE","vocab":{"a":0},"merges":[],"dropout":0.1}})", "model.dropout", "dropout"},
      {R"({"normalizer":{"type":"Lowercase"},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}})",
       "normalizer.type", "Lowercase"},
      {R"({"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Metaspace"}]},
           "model":{"type":"BPE","vocab":{"a":0},"merges":[]}})",
       "pre_tokenizer.pretokenizers[0].type", "Metaspace"},
      {R"({"pre_tokenizer":{"type":"Split","pattern":{"Regex":"(a"},"behavior":"Isolated"},
           "model":{"type":"BPE","vocab":{"a":0},"merges":[]}})",
       "pre_tokenizer.pattern.Regex", "compile"},
      {R"({"added_tokens":[{"id":1}],"model":{"type":"BPE","vocab":{"a":0},"merges":[]}})",
       "added_tokens[0].content", "non-empty string"},
      {R"({"decoder":{"type":"WordPiece"},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}})",
       "decoder.type", "WordPiece"},
      {R"({"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"<s>"}},
           {"Sequence":{"id":"A"}}]},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}})",
       "post_processor.single[0]", "'<s>'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.json);
    const absl::Status s = LoadError(c.json);
    ASSERT_FALSE(s.ok());
    EXPECT_TRUE(Contains(std::string(s.message()), "bad.json"));
    EXPECT_TRUE(Contains(std::string(s.message()), c.want1));
    EXPECT_TRUE(Contains(std::string(s.message()), c.want2));
  }
}

TEST(TokenizerTest, TokenizerConfigSetsRoleTokens) {
  auto tok = Tokenizer::FromFile(Fixture("qwen2_5.json"));
  ASSERT_TRUE(tok.ok());
  ASSERT_TRUE(tok->ApplyTokenizerConfig(R"({"eos_token":"<|im_end|>","pad_token":{"content":"<|endoftext|>"},
                                           "bos_token":null})")
                  .ok());
  EXPECT_EQ(tok->eos_id(), 151645);
  EXPECT_EQ(tok->pad_id(), 151643);
  EXPECT_EQ(tok->bos_id(), std::nullopt);
  const absl::Status bad = tok->ApplyTokenizerConfig(R"({"eos_token":"<nope>"})", "cfg.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Contains(std::string(bad.message()), "cfg.json"));
  EXPECT_TRUE(Contains(std::string(bad.message()), "eos_token"));
  // The shared fixture handle is unaffected by the copy's settings.
  EXPECT_EQ(Load("qwen2_5").eos_id(), 151643);
}

// --- Character tokenizer ---

TEST(CharTokenizerTest, EncodesCharactersAfterSpecialTokens) {
  auto tok = MakeCharTokenizer({"abc +=0123456789", {"<pad>", "<bos>", "<eos>"}});
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->vocab_size(), 3 + 16);
  EXPECT_EQ(tok->pad_id(), 0);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->Encode("ab c"), (std::vector<int32_t>{3, 4, 6, 5}));
  EXPECT_EQ(tok->Encode("1+2=3", true), (std::vector<int32_t>{1, 10, 7, 11, 8, 12}));
  EXPECT_EQ(tok->Encode("a<eos>"), (std::vector<int32_t>{3, 2}));
  EXPECT_EQ(*tok->Decode({1, 10, 7, 11, 2}), "<bos>1+2<eos>");
  EXPECT_EQ(*tok->Decode({1, 10, 7, 11, 2}, true), "1+2");
  EXPECT_EQ(tok->Encode("axb"), (std::vector<int32_t>{3, 4}));  // x is not in the alphabet
}

TEST(CharTokenizerTest, UnkAndUnicodeAlphabet) {
  auto tok = MakeCharTokenizer({"αβγ", {"<unk>", "<eos>"}});
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->Encode("αxγ"), (std::vector<int32_t>{2, 0, 4}));
  EXPECT_EQ(*tok->Decode({2, 3, 4}), "αβγ");
  EXPECT_EQ(tok->bos_id(), std::nullopt);
  EXPECT_EQ(tok->Encode("β", true), (std::vector<int32_t>{3}));
}

TEST(CharTokenizerTest, WritesARealTokenizerJson) {
  auto tok = MakeCharTokenizer({"xyz ", {"<pad>", "<bos>", "<eos>"}});
  ASSERT_TRUE(tok.ok());
  const std::string path =
      (std::filesystem::temp_directory_path() / ("char_tok_" + std::to_string(::getpid()) + ".json")).string();
  ASSERT_TRUE(tok->SaveJson(path).ok());
  auto back = Tokenizer::FromFile(path);
  std::remove(path.c_str());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->Encode("zyx x", true), tok->Encode("zyx x", true));
  const Json j = Json::parse(tok->json());
  EXPECT_EQ(j["model"]["type"], "BPE");
  EXPECT_TRUE(j["model"]["merges"].empty());
  EXPECT_EQ(j["model"]["vocab"]["x"], 3);
  EXPECT_EQ(j["added_tokens"][1]["content"], "<bos>");
}

TEST(CharTokenizerTest, RejectsBadOptions) {
  EXPECT_FALSE(MakeCharTokenizer({"", {"<pad>"}}).ok());
  EXPECT_FALSE(MakeCharTokenizer({"ab", {"<pad>", "<pad>"}}).ok());
  EXPECT_FALSE(MakeCharTokenizer({"ab", {"a"}}).ok());
  EXPECT_FALSE(MakeCharTokenizer({"a\xFF", {}}).ok());
  // Repeated alphabet characters are fine and keep their first id.
  auto tok = MakeCharTokenizer({"abca", {}});
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(tok->vocab_size(), 3);
}

}  // namespace
}  // namespace roll
