#include "roll/pipeline/checkpoints.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace roll {
namespace fs = std::filesystem;

absl::Status CheckpointStore::Save(int64_t step, const std::function<absl::Status(const std::string&)>& write_parts,
                                   const std::string& state_json) {
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(state_json);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline state of step ", step, " is not JSON: ", e.what()));
  }
  if (!state.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat("pipeline state of step ", step, " is not a JSON object"));
  }
  state["step"] = step;
  const fs::path out(output_dir_);
  const fs::path final_dir = out / absl::StrCat("checkpoint-", step);
  const fs::path tmp = out / absl::StrCat(".checkpoint-", step, ".tmp");
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", tmp.string(), ": ", ec.message()));
  // A failed assembly leaves nothing behind but the checkpoints there were.
  auto discard = [&](absl::Status s) {
    fs::remove_all(tmp, ec);
    return s;
  };
  if (absl::Status s = write_parts(tmp.string()); !s.ok()) return discard(s);
  {
    std::ofstream f(tmp / "pipeline_state.json");
    f << state.dump(2) << "\n";
    f.flush();
    if (!f) {
      return discard(absl::InternalError(absl::StrCat("cannot write ", (tmp / "pipeline_state.json").string())));
    }
  }
  // Swap in the complete directory; an older checkpoint of the same step is
  // only removed once the new one is in place.
  const fs::path old = out / absl::StrCat(".checkpoint-", step, ".old");
  fs::remove_all(old, ec);
  ec.clear();
  if (fs::exists(final_dir)) fs::rename(final_dir, old, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot move ", final_dir.string(), " aside: ", ec.message()));
  fs::rename(tmp, final_dir, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot move ", tmp.string(), " to ", final_dir.string(), ": ", ec.message()));
  }
  fs::remove_all(old, ec);
  return absl::OkStatus();
}

std::string CheckpointStore::Latest() const {
  std::error_code ec;
  int64_t best = -1;
  std::string dir;
  for (const auto& e : fs::directory_iterator(output_dir_, ec)) {
    const std::string name = e.path().filename().string();
    int64_t n = 0;
    if (name.rfind("checkpoint-", 0) != 0 || !absl::SimpleAtoi(name.substr(11), &n)) continue;
    if (!fs::exists(e.path() / "pipeline_state.json") || n <= best) continue;
    best = n;
    dir = e.path().string();
  }
  return dir;
}

absl::StatusOr<CheckpointStore::State> CheckpointStore::Read(const std::string& dir,
                                                             const std::vector<std::string>& required) const {
  const fs::path state_path = fs::path(dir) / "pipeline_state.json";
  std::ifstream f(state_path);
  if (!f) return absl::NotFoundError(absl::StrCat("resume_from_checkpoint: cannot read ", state_path.string()));
  nlohmann::json state;
  try {
    f >> state;
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(state_path.string(), ": ", e.what()));
  }
  if (!state.is_object() || !state.contains("step") || !state["step"].is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(state_path.string(), ": missing 'step'"));
  }
  for (const std::string& key : required) {
    if (!state.contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat(state_path.string(), ": missing '", key, "'"));
    }
  }
  State out;
  out.step = state["step"].get<int64_t>();
  out.json = state.dump();
  return out;
}

}  // namespace roll
