#include "roll/data/dataset.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace roll {
namespace {

constexpr int kMaxErrors = 20;

// A ground truth may be written as a string or a number.
bool TextOf(const nlohmann::json& v, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return true;
  }
  if (v.is_number_integer()) {
    *out = std::to_string(v.get<int64_t>());
    return true;
  }
  if (v.is_number()) {
    *out = v.dump();
    return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::vector<Sample>> ParseJsonl(const std::string& text, const std::string& source) {
  std::vector<Sample> out;
  std::vector<std::string> errors;
  std::istringstream in(text);
  std::string line;
  const std::string stem = std::filesystem::path(source).stem().string();
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto err = [&](const std::string& what) {
      if (static_cast<int>(errors.size()) < kMaxErrors) {
        errors.push_back(absl::StrCat(source, ":", lineno, ": ", what));
      }
    };
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      err(absl::StrCat("not valid JSON: ", e.what()));
      continue;
    }
    if (!j.is_object()) {
      err("expected a JSON object");
      continue;
    }
    Sample s;
    if (j.contains("prompt")) {
      if (!j["prompt"].is_string()) {
        err("\"prompt\" must be a string");
        continue;
      }
      s.prompt = j["prompt"].get<std::string>();
    } else if (j.contains("messages")) {
      const auto& m = j["messages"];
      bool ok = m.is_array() && !m.empty();
      for (size_t i = 0; ok && i < m.size(); ++i) {
        ok = m[i].is_object() && m[i].contains("role") && m[i]["role"].is_string() &&
             m[i].contains("content") && m[i]["content"].is_string();
        if (ok) s.messages.push_back({m[i]["role"].get<std::string>(), m[i]["content"].get<std::string>()});
      }
      if (!ok) {
        err("\"messages\" must be a non-empty list of {\"role\": string, \"content\": string}");
        continue;
      }
    } else {
      err("missing \"prompt\" (or \"messages\")");
      continue;
    }
    const char* gt_key = j.contains("ground_truth") ? "ground_truth" : j.contains("answer") ? "answer" : nullptr;
    if (gt_key == nullptr) {
      err("missing \"ground_truth\" (or \"answer\")");
      continue;
    }
    if (!TextOf(j[gt_key], &s.ground_truth)) {
      // Structured truths (code test cases, countdown) travel as JSON text.
      s.ground_truth = j[gt_key].dump();
    }
    if (j.contains("tag")) {
      if (!j["tag"].is_string()) {
        err("\"tag\" must be a string");
        continue;
      }
      s.tag = j["tag"].get<std::string>();
    }
    if (j.contains("solution")) {
      if (!j["solution"].is_string()) {
        err("\"solution\" must be a string");
        continue;
      }
      s.solution = j["solution"].get<std::string>();
    }
    if (j.contains("id")) {
      if (!TextOf(j["id"], &s.id)) {
        err("\"id\" must be a string or a number");
        continue;
      }
    } else {
      s.id = absl::StrCat(stem, "-", lineno);
    }
    out.push_back(std::move(s));
  }
  if (!errors.empty()) return absl::InvalidArgumentError(absl::StrJoin(errors, "\n"));
  return out;
}

absl::StatusOr<std::vector<Sample>> LoadJsonl(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat(path, ": cannot read the dataset file"));
  std::stringstream ss;
  ss << f.rdbuf();
  return ParseJsonl(ss.str(), path);
}

absl::Status WriteJsonl(const std::string& path, const std::vector<Sample>& samples) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return absl::InternalError(absl::StrCat(tmp, ": cannot write"));
    for (const Sample& s : samples) {
      nlohmann::json j;
      j["id"] = s.id;
      if (!s.messages.empty()) {
        for (const DataMessage& m : s.messages) j["messages"].push_back({{"role", m.role}, {"content", m.content}});
      } else {
        j["prompt"] = s.prompt;
      }
      j["ground_truth"] = s.ground_truth;
      if (!s.tag.empty()) j["tag"] = s.tag;
      if (!s.solution.empty()) j["solution"] = s.solution;
      f << j.dump() << "\n";
    }
    f.flush();
    if (!f) return absl::InternalError(absl::StrCat(tmp, ": write failed"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

}  // namespace roll
