#include "roll/common/cli_args.h"

#include <gtest/gtest.h>

namespace roll {
namespace {

TEST(CliArgsTest, ParsesValuesFlagsAndPositionals) {
  auto a = CliArgs::Parse({"cfg.yaml", "--workers", "4", "--calls=10", "--fast", "x=1"}, {"workers", "calls"},
                          {"fast"});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a->GetInt("workers", 0), 4);
  EXPECT_EQ(*a->GetInt("calls", 0), 10);
  EXPECT_TRUE(a->Has("fast"));
  EXPECT_EQ(a->positional(), (std::vector<std::string>{"cfg.yaml", "x=1"}));
  EXPECT_EQ(*a->GetDouble("absent", 2.5), 2.5);
}

TEST(CliArgsTest, RejectsUnknownFlagsAndBadValues) {
  auto unknown = CliArgs::Parse({"--wrokers", "4"}, {"workers"}, {});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("--wrokers"), std::string::npos);
  auto missing = CliArgs::Parse({"--workers"}, {"workers"}, {});
  EXPECT_FALSE(missing.ok());
  auto a = CliArgs::Parse({"--workers", "four"}, {"workers"}, {});
  ASSERT_TRUE(a.ok());
  EXPECT_NE(a->GetInt("workers", 0).status().message().find("four"), std::string::npos);
  EXPECT_FALSE(a->Required("calls").ok());
  EXPECT_FALSE(CliArgs::Parse({"--fast=1"}, {}, {"fast"}).ok());
}

}  // namespace
}  // namespace roll
