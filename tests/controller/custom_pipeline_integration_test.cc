// Runs examples/custom_pipeline as a user would and checks what it prints.

#include <gtest/gtest.h>

#include <array>
#include <cstdio>

#include "controller/test_util.h"

namespace roll {
namespace {

std::string RunCommand(const std::string& cmd, int* code) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  *code = pclose(p);
  return out;
}

TEST(CustomPipelineTest, ScoresEverySampleAcrossTwoRanks) {
  const std::string dir = testing::TempDir("custom");
  int code = 0;
  std::string out = RunCommand(std::string(ROLL_BINARY_DIR) + "/bin/custom_pipeline " + ROLL_SOURCE_DIR +
                            "/examples/custom_pipeline/config.yaml output_dir=" + dir + " rollout_batch_size=6",
                        &code);
  ASSERT_EQ(code, 0) << out;
  // Samples 0 and 3 mention "reward"; 6 samples split 3 + 3 over two ranks.
  EXPECT_NE(out.find("sample 0 score 1 (rank 0)"), std::string::npos) << out;
  EXPECT_NE(out.find("sample 1 score 0 (rank 0)"), std::string::npos) << out;
  EXPECT_NE(out.find("sample 3 score 1 (rank 1)"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 0 scored 3 samples"), std::string::npos) << out;
  EXPECT_NE(out.find("rank 1 scored 3 samples"), std::string::npos) << out;
  EXPECT_NE(out.find("mean score 0.333"), std::string::npos) << out;
}

TEST(CustomPipelineTest, BadConfigIsReportedWithFileAndKey) {
  const std::string dir = testing::TempDir("custom-bad");
  int code = 0;
  std::string out = RunCommand(std::string(ROLL_BINARY_DIR) + "/bin/custom_pipeline " + ROLL_SOURCE_DIR +
                            "/examples/custom_pipeline/config.yaml output_dir=" + dir + " scorer.wrold_size=2",
                        &code);
  EXPECT_NE(code, 0);
  EXPECT_NE(out.find("wrold_size"), std::string::npos) << out;
  EXPECT_NE(out.find("world_size"), std::string::npos) << out;
}

}  // namespace
}  // namespace roll
