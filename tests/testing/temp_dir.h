#pragma once
// Scratch directories for tests, one implementation for every suite:
// TempDir makes a fresh directory the caller removes (a run's output_dir
// that a failing test leaves behind to look at), ScratchDir one removed
// with everything in it when the test's scope ends.

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace roll::testing {

// A fresh, empty directory <temp>/roll-test-<tag>-XXXXXX (unique across
// processes and calls).
inline std::string TempDir(const std::string& tag) {
  std::string tmpl = (std::filesystem::temp_directory_path() / ("roll-test-" + tag + "-XXXXXX")).string();
  if (mkdtemp(tmpl.data()) == nullptr) return "";
  return tmpl;
}

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag = "scratch") : path_(TempDir(tag)) {}
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace roll::testing
