// CheckpointStore: atomic checkpoint directories, the newest complete one,
// and the errors of a bad pipeline_state.json.

#include "roll/pipeline/checkpoints.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "nlohmann/json.hpp"
#include "testing/files.h"
#include "testing/temp_dir.h"

namespace roll {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

absl::Status WriteModel(const std::string& dir, const std::string& contents) {
  fs::create_directories(dir + "/actor");
  std::ofstream(dir + "/actor/model.safetensors") << contents;
  return absl::OkStatus();
}

TEST(CheckpointStoreTest, SaveWritesPartsAndStateThenReadReturnsThem) {
  testing::ScratchDir out;
  CheckpointStore store(out.path());
  ASSERT_TRUE(store.Save(
                      3, [](const std::string& dir) { return WriteModel(dir, "weights-3"); },
                      R"({"data_position": {"epoch": 1, "index": 7}})")
                  .ok());
  EXPECT_EQ(testing::ReadFile(out / "checkpoint-3/actor/model.safetensors"), "weights-3");
  auto state = store.Read(out / "checkpoint-3", {"data_position"});
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->step, 3);
  nlohmann::json j = nlohmann::json::parse(state->json);
  EXPECT_EQ(j["data_position"]["index"], 7);
  EXPECT_EQ(j["step"], 3);
  // Nothing of the assembly is left beside it.
  for (const auto& e : fs::directory_iterator(out.path())) {
    EXPECT_EQ(e.path().filename().string().rfind(".checkpoint", 0), std::string::npos) << e.path();
  }
}

TEST(CheckpointStoreTest, FailedSaveKeepsTheCheckpointOfThatStepWhole) {
  testing::ScratchDir out;
  CheckpointStore store(out.path());
  ASSERT_TRUE(store.Save(5, [](const std::string& dir) { return WriteModel(dir, "first"); }, "{}").ok());
  absl::Status s = store.Save(
      5,
      [](const std::string& dir) {
        WriteModel(dir, "half").IgnoreError();
        return absl::InternalError("trainer rank 1 died while saving");
      },
      "{}");
  EXPECT_THAT(std::string(s.message()), HasSubstr("trainer rank 1 died"));
  EXPECT_EQ(testing::ReadFile(out / "checkpoint-5/actor/model.safetensors"), "first");
  EXPECT_EQ(store.Latest(), out / "checkpoint-5");
  EXPECT_FALSE(fs::exists(out / ".checkpoint-5.tmp"));
}

TEST(CheckpointStoreTest, LatestIsTheNewestCompleteCheckpoint) {
  testing::ScratchDir out;
  CheckpointStore store(out.path());
  EXPECT_EQ(store.Latest(), "");
  auto ok = [](const std::string&) { return absl::OkStatus(); };
  ASSERT_TRUE(store.Save(2, ok, "{}").ok());
  ASSERT_TRUE(store.Save(10, ok, "{}").ok());
  // Step 20 has no pipeline_state.json (a crash before it was written):
  // not a checkpoint to resume from; nor is a stray directory.
  fs::create_directories(out / "checkpoint-20/actor");
  fs::create_directories(out / "checkpoint-x");
  EXPECT_EQ(store.Latest(), out / "checkpoint-10");
}

TEST(CheckpointStoreTest, BadStateIsNamed) {
  testing::ScratchDir out;
  CheckpointStore store(out.path());
  EXPECT_FALSE(store.Save(1, [](const std::string&) { return absl::OkStatus(); }, "[1, 2]").ok());
  EXPECT_FALSE(store.Save(1, [](const std::string&) { return absl::OkStatus(); }, "{not json").ok());

  auto missing = store.Read(out / "nowhere");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("nowhere/pipeline_state.json"));

  fs::create_directories(out / "bad");
  std::ofstream(out / "bad/pipeline_state.json") << "{\"step\": 1.5}";
  auto bad_step = store.Read(out / "bad");
  EXPECT_THAT(std::string(bad_step.status().message()), HasSubstr("missing 'step'"));

  std::ofstream(out / "bad/pipeline_state.json", std::ios::trunc) << "{\"step\": 4";
  auto not_json = store.Read(out / "bad");
  EXPECT_EQ(not_json.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(not_json.status().message()), HasSubstr("bad/pipeline_state.json"));

  std::ofstream(out / "bad/pipeline_state.json", std::ios::trunc) << "{\"step\": 4}";
  auto no_position = store.Read(out / "bad", {"data_position"});
  EXPECT_THAT(std::string(no_position.status().message()), HasSubstr("missing 'data_position'"));
}

}  // namespace
}  // namespace roll
