#include "roll/common/batch.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace roll {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Samples 0..n-1: "ids" is [n, 2] with row i = {10 i, 10 i + 1}, "score" is
// [n] float = i, column "prompt" = "p<i>".
Batch MakeBatch(int64_t n) {
  Batch b;
  at::Tensor i = at::arange(n, at::kLong);
  b.SetTensor("ids", at::stack({i * 10, i * 10 + 1}, 1));
  b.SetTensor("score", at::arange(n, at::kFloat));
  std::vector<std::string> prompts;
  for (int64_t i = 0; i < n; ++i) prompts.push_back("p" + std::to_string(i));
  b.SetColumn("prompt", prompts);
  b.SetMeta("step", "7");
  return b;
}

// Sample indices held by a batch made by MakeBatch (via "score").
std::vector<int64_t> Ids(const Batch& b) {
  at::Tensor s = b.tensors().at("score");
  std::vector<int64_t> out;
  for (int64_t i = 0; i < s.size(0); ++i) {
    out.push_back(static_cast<int64_t>(s[i].item<float>()));
  }
  return out;
}

TEST(BatchTest, MakeBatchIsConsistent) {
  Batch b = MakeBatch(3);
  ASSERT_TRUE(b.Validate().ok());
  EXPECT_EQ(b.size(), 3);
  // Row i of ids is {10 i, 10 i + 1}.
  EXPECT_EQ(b.tensors().at("ids")[2][0].item<int64_t>(), 20);
  EXPECT_EQ(b.tensors().at("ids")[2][1].item<int64_t>(), 21);
}

TEST(BatchTest, EmptyBatch) {
  Batch b;
  EXPECT_EQ(b.size(), 0);
  EXPECT_TRUE(b.empty());
  EXPECT_TRUE(b.Validate().ok());
  Batch only_column;
  only_column.SetColumn("x", {"a", "b"});
  EXPECT_EQ(only_column.size(), 2);
}

TEST(BatchTest, AccessorsNameMissingKeys) {
  Batch b = MakeBatch(2);
  ASSERT_TRUE(b.Tensor("ids").ok());
  auto missing = b.Tensor("logprobs");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("'logprobs'"));
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("ids, score"));
  auto col = b.Column("prompt");
  ASSERT_TRUE(col.ok());
  EXPECT_THAT(**col, ElementsAre("p0", "p1"));
  auto missing_col = b.Column("answer");
  ASSERT_FALSE(missing_col.ok());
  EXPECT_THAT(std::string(missing_col.status().message()),
              HasSubstr("'answer'"));
  EXPECT_EQ(b.MetaOr("step", "0"), "7");
  EXPECT_EQ(b.MetaOr("epoch", "0"), "0");
}

TEST(BatchTest, ValidateNamesMismatchedKeyAndSizes) {
  Batch b = MakeBatch(4);
  b.SetTensor("short", at::zeros({3}));
  absl::Status s = b.Validate();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("'short'"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("3"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("4"));

  Batch c = MakeBatch(4);
  c.SetColumn("prompt", {"only one"});
  s = c.Validate();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("column 'prompt' has 1"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("has 4"));

  Batch d = MakeBatch(2);
  d.SetTensor("scalar", at::tensor(1.0));
  s = d.Validate();
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("'scalar'"));

  Batch e;
  e.SetTensor("undef", at::Tensor());
  EXPECT_FALSE(e.Validate().ok());
}

TEST(BatchTest, SliceIsAViewOfTheRange) {
  Batch b = MakeBatch(5);
  auto s = b.Slice(1, 4);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->size(), 3);
  EXPECT_THAT(Ids(*s), ElementsAre(1, 2, 3));
  EXPECT_THAT(s->columns().at("prompt"), ElementsAre("p1", "p2", "p3"));
  EXPECT_EQ(s->MetaOr("step", ""), "7");
  // A view: writing through the slice changes the source.
  s->tensors().at("score")[0].fill_(100);
  EXPECT_EQ(b.tensors().at("score")[1].item<float>(), 100);

  EXPECT_TRUE(b.Slice(5, 5).ok());
  EXPECT_EQ(b.Slice(2, 2)->size(), 0);
  EXPECT_FALSE(b.Slice(-1, 2).ok());
  EXPECT_FALSE(b.Slice(3, 2).ok());
  EXPECT_FALSE(b.Slice(0, 6).ok());
}

TEST(BatchTest, ChunkUnevenGivesExtraToFirstPieces) {
  Batch b = MakeBatch(7);
  auto pieces = b.Chunk(3);
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  ASSERT_EQ(pieces->size(), 3u);
  EXPECT_THAT(Ids((*pieces)[0]), ElementsAre(0, 1, 2));
  EXPECT_THAT(Ids((*pieces)[1]), ElementsAre(3, 4));
  EXPECT_THAT(Ids((*pieces)[2]), ElementsAre(5, 6));
  EXPECT_THAT((*pieces)[2].columns().at("prompt"), ElementsAre("p5", "p6"));
  for (const Batch& p : *pieces) EXPECT_EQ(p.MetaOr("step", ""), "7");
}

TEST(BatchTest, ChunkMorePiecesThanSamplesKeepsKeys) {
  Batch b = MakeBatch(2);
  auto pieces = b.Chunk(4);
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  ASSERT_EQ(pieces->size(), 4u);
  EXPECT_EQ((*pieces)[0].size(), 1);
  EXPECT_EQ((*pieces)[1].size(), 1);
  for (int i = 2; i < 4; ++i) {
    const Batch& p = (*pieces)[i];
    EXPECT_EQ(p.size(), 0);
    EXPECT_TRUE(p.HasTensor("ids"));
    EXPECT_EQ(p.tensors().at("ids").sizes(), (std::vector<int64_t>{0, 2}));
    EXPECT_EQ(p.columns().count("prompt"), 1u);
    EXPECT_TRUE(p.Validate().ok());
  }
  EXPECT_FALSE(b.Chunk(0).ok());
  EXPECT_FALSE(b.Chunk(-2).ok());
}

TEST(BatchTest, ChunkThenConcatRoundTrips) {
  Batch b = MakeBatch(9);
  auto pieces = b.Chunk(4);
  ASSERT_TRUE(pieces.ok());
  auto joined = Batch::Concat(*pieces);
  ASSERT_TRUE(joined.ok()) << joined.status();
  EXPECT_TRUE(at::equal(joined->tensors().at("ids"), b.tensors().at("ids")));
  EXPECT_TRUE(
      at::equal(joined->tensors().at("score"), b.tensors().at("score")));
  EXPECT_EQ(joined->columns().at("prompt"), b.columns().at("prompt"));
  EXPECT_EQ(joined->meta(), b.meta());
}

TEST(BatchTest, ConcatTakesMetaFromFirstPartAndCopies) {
  Batch a = MakeBatch(2);
  Batch b = MakeBatch(3);
  b.SetMeta("step", "8");
  auto c = Batch::Concat({a, b});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->size(), 5);
  EXPECT_THAT(Ids(*c), ElementsAre(0, 1, 0, 1, 2));
  EXPECT_THAT(c->columns().at("prompt"),
              ElementsAre("p0", "p1", "p0", "p1", "p2"));
  EXPECT_EQ(c->MetaOr("step", ""), "7");
  c->tensors().at("score").fill_(-1);
  EXPECT_EQ(a.tensors().at("score")[0].item<float>(), 0);

  auto none = Batch::Concat({});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->size(), 0);
}

TEST(BatchTest, ConcatRejectsMismatchedKeys) {
  Batch a = MakeBatch(2);
  Batch b = MakeBatch(2);
  b.tensors().erase("score");
  auto c = Batch::Concat({a, b});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("'score'"));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("part 1"));

  Batch d = MakeBatch(2);
  d.SetColumn("extra", {"x", "y"});
  c = Batch::Concat({a, d});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("'extra'"));
}

TEST(BatchTest, ConcatRejectsMismatchedDtypeAndShape) {
  Batch a = MakeBatch(2);
  Batch b = MakeBatch(2);
  b.SetTensor("score", at::arange(2, at::kDouble));
  auto c = Batch::Concat({a, b});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("'score'"));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("Double"));

  Batch d = MakeBatch(2);
  d.SetTensor("ids", at::zeros({2, 3}, at::kLong));
  c = Batch::Concat({a, d});
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("'ids'"));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("[2, 3]"));

  Batch e = MakeBatch(2);
  e.SetTensor("ids", at::zeros({2}, at::kLong));
  EXPECT_FALSE(Batch::Concat({a, e}).ok());

  Batch bad = MakeBatch(2);
  bad.SetColumn("prompt", {"x"});
  EXPECT_FALSE(Batch::Concat({a, bad}).ok());
}

TEST(BatchTest, SelectKeepsOrderAndRepeats) {
  Batch b = MakeBatch(5);
  auto s = b.Select({4, 0, 4, 2});
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(Ids(*s), ElementsAre(4, 0, 4, 2));
  EXPECT_THAT(s->columns().at("prompt"), ElementsAre("p4", "p0", "p4", "p2"));
  EXPECT_EQ(s->tensors().at("ids")[0][1].item<int64_t>(), 41);
  EXPECT_EQ(s->MetaOr("step", ""), "7");

  auto empty = b.Select({});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->size(), 0);
  EXPECT_TRUE(empty->HasTensor("ids"));
}

TEST(BatchTest, SelectOutOfRangeIsAnError) {
  Batch b = MakeBatch(3);
  auto s = b.Select({0, 3});
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("index 3"));
  EXPECT_FALSE(b.Select({-1}).ok());
}

TEST(BatchTest, UnionAddsKeys) {
  Batch a = MakeBatch(3);
  Batch b;
  b.SetTensor("reward", at::ones({3}));
  b.SetColumn("answer", {"x", "y", "z"});
  b.SetMeta("source", "rule");
  ASSERT_TRUE(a.Union(b).ok());
  EXPECT_TRUE(a.HasTensor("reward"));
  EXPECT_TRUE(a.HasTensor("ids"));
  EXPECT_EQ(a.columns().at("answer")[2], "z");
  EXPECT_EQ(a.MetaOr("source", ""), "rule");
  EXPECT_TRUE(a.Validate().ok());
}

TEST(BatchTest, UnionEqualKeyIsFine) {
  Batch a = MakeBatch(3);
  Batch b = MakeBatch(3);  // same values, distinct tensors
  b.SetTensor("extra", at::zeros({3}));
  ASSERT_TRUE(a.Union(b).ok());
  EXPECT_TRUE(a.HasTensor("extra"));
}

TEST(BatchTest, UnionConflictingKeyIsAnErrorAndChangesNothing) {
  Batch a = MakeBatch(3);
  Batch b = MakeBatch(3);
  b.tensors().at("score")[1].fill_(42);
  b.SetTensor("extra", at::zeros({3}));
  absl::Status s = a.Union(b);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("'score'"));
  EXPECT_FALSE(a.HasTensor("extra"));

  Batch c = MakeBatch(3);
  c.columns().at("prompt")[0] = "other";
  s = a.Union(c);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("'prompt'"));

  Batch d = MakeBatch(3);
  d.SetMeta("step", "8");
  s = a.Union(d);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("'step'"));

  Batch e = MakeBatch(3);
  e.SetTensor("score", at::arange(3, at::kDouble));  // same values, other dtype
  EXPECT_FALSE(a.Union(e).ok());
}

TEST(BatchTest, UnionSizeMismatchIsAnError) {
  Batch a = MakeBatch(3);
  Batch b;
  b.SetTensor("reward", at::ones({4}));
  absl::Status s = a.Union(b);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("3"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("4"));
  EXPECT_FALSE(a.HasTensor("reward"));

  // A fresh batch has no sample count yet and takes the other's.
  Batch fresh;
  fresh.SetMeta("k", "v");
  ASSERT_TRUE(fresh.Union(a).ok());
  EXPECT_EQ(fresh.size(), 3);
}

TEST(BatchTest, RepeatInterleaved) {
  Batch b = MakeBatch(2);
  Batch r = b.Repeat(3, /*interleave=*/true);
  ASSERT_TRUE(r.Validate().ok());
  EXPECT_EQ(r.size(), 6);
  EXPECT_THAT(Ids(r), ElementsAre(0, 0, 0, 1, 1, 1));
  EXPECT_THAT(r.columns().at("prompt"),
              ElementsAre("p0", "p0", "p0", "p1", "p1", "p1"));
  EXPECT_EQ(r.tensors().at("ids").sizes(), (std::vector<int64_t>{6, 2}));
  EXPECT_EQ(r.tensors().at("ids")[4][1].item<int64_t>(), 11);
  EXPECT_EQ(r.MetaOr("step", ""), "7");
}

TEST(BatchTest, RepeatTiled) {
  Batch b = MakeBatch(2);
  Batch r = b.Repeat(3, /*interleave=*/false);
  ASSERT_TRUE(r.Validate().ok());
  EXPECT_THAT(Ids(r), ElementsAre(0, 1, 0, 1, 0, 1));
  EXPECT_THAT(r.columns().at("prompt"),
              ElementsAre("p0", "p1", "p0", "p1", "p0", "p1"));
  EXPECT_EQ(r.tensors().at("ids").sizes(), (std::vector<int64_t>{6, 2}));
  EXPECT_EQ(r.tensors().at("ids")[3][0].item<int64_t>(), 10);

  Batch zero = b.Repeat(0);
  EXPECT_EQ(zero.size(), 0);
  EXPECT_TRUE(zero.HasTensor("ids"));
  EXPECT_TRUE(zero.Validate().ok());
}

}  // namespace
}  // namespace roll
