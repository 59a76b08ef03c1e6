#include "roll/scheduler/dispatch.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace roll {
namespace {

struct Api {};
constexpr Method<Api> kDp{"dp", Dispatch::kDataParallel};
constexpr Method<Api> kAll{"all", Dispatch::kOneToAll};
constexpr Method<Api> kLead{"lead", Dispatch::kOneToAll, Execute::kRankZero};
constexpr Method<Api> kEach{"each", Dispatch::kAllToAll};

Batch Range(int64_t n) {
  Batch b;
  b.SetTensor("x", at::arange(n));
  return b;
}

TEST(DispatchTest, ExecutingRanks) {
  EXPECT_EQ(ExecutingRanks(Execute::kAll, 3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(ExecutingRanks(Execute::kRankZero, 3), (std::vector<int>{0}));
  EXPECT_TRUE(ExecutingRanks(Execute::kAll, 0).empty());
}

TEST(DispatchTest, DataParallelChunksThenConcatenatesInOrder) {
  auto parts = SplitForDispatch(kDp, Range(10), 4);
  ASSERT_TRUE(parts.ok());
  std::vector<int64_t> sizes;
  for (const auto& p : *parts) sizes.push_back(p.size());
  EXPECT_EQ(sizes, (std::vector<int64_t>{3, 3, 2, 2}));
  auto merged = CollectReplies(kDp, *parts);
  ASSERT_TRUE(merged.ok());
  EXPECT_TRUE(at::equal(*merged->Tensor("x"), at::arange(10)));
}

TEST(DispatchTest, DataParallelCanRequireAnEvenSplit) {
  auto parts = SplitForDispatch(kDp, Range(10), 4, /*require_even=*/true);
  ASSERT_FALSE(parts.ok());
  EXPECT_NE(parts.status().message().find("10 samples does not divide across 4"), std::string::npos);
  EXPECT_TRUE(SplitForDispatch(kDp, Range(12), 4, true).ok());
}

TEST(DispatchTest, OneToAllCopiesToEveryExecutingRank) {
  auto parts = SplitForDispatch(kAll, Range(5), 3);
  ASSERT_TRUE(parts.ok());
  ASSERT_EQ(parts->size(), 3u);
  for (const auto& p : *parts) EXPECT_EQ(p.size(), 5);
  auto lead = SplitForDispatch(kLead, Range(5), 3);
  ASSERT_TRUE(lead.ok());
  EXPECT_EQ(lead->size(), 1u);
}

TEST(DispatchTest, AllToAllNeedsOneBatchPerRank) {
  auto parts = SplitForDispatch(kEach, Range(5), 3);
  EXPECT_EQ(parts.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DispatchTest, EmptyClusterIsAnError) {
  EXPECT_EQ(SplitForDispatch(kAll, Range(1), 0).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(CollectReplies(kAll, {}).ok());
}

}  // namespace
}  // namespace roll
