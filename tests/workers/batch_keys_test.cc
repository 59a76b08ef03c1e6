// The RL workers' batch keys: declared once, each name once, and the
// worker API docs list exactly the table the code declares.

#include "roll/worker/batch_keys.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace roll {
namespace {

TEST(BatchKeysTest, EveryNameIsDeclaredOnce) {
  std::set<std::string_view> names;
  for (const BatchKeySpec& k : kRlBatchKeys) {
    EXPECT_TRUE(names.insert(k.name).second) << k.name << " is declared twice";
    EXPECT_FALSE(k.where.empty() || k.type.empty() || k.methods.empty() || k.what.empty()) << k.name;
  }
  EXPECT_EQ(std::string_view(keys::kInputIds), "input_ids");
  EXPECT_EQ(std::string_view(keys::kStepIndex), "step_index");
}

TEST(BatchKeysTest, DocsListEveryKey) {
  std::ifstream in(std::string(ROLL_SOURCE_DIR) + "/docs/worker-api.md");
  ASSERT_TRUE(in) << "docs/worker-api.md";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str();
  size_t rows = 0;
  for (const BatchKeySpec& k : kRlBatchKeys) {
    const std::string row = "| `" + std::string(k.name) + "` | " + std::string(k.where) + " | " +
                            std::string(k.type) + " | " + std::string(k.methods) + " | " + std::string(k.what) +
                            " |\n";
    EXPECT_NE(doc.find(row), std::string::npos) << "docs/worker-api.md lacks the row " << row;
    ++rows;
  }
  // No row for a key the code no longer declares: as many key rows as keys.
  size_t doc_rows = 0;
  const std::string section = "## The RL workers' batch keys";
  for (size_t at = doc.find("\n| `", doc.find(section)); at != std::string::npos; at = doc.find("\n| `", at + 1)) {
    ++doc_rows;
  }
  EXPECT_EQ(doc_rows, rows);
}

}  // namespace
}  // namespace roll
