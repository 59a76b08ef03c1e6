#pragma once
// AtomicFileWriter: replaces a file so that readers see either the old
// contents or the complete new contents, never a torn file.
//
// The bytes go to a temporary file beside the destination (same directory,
// hence same filesystem, so the final rename(2) is atomic). Commit() fsyncs
// the temporary, renames it over the destination and fsyncs the directory so
// the rename itself survives a crash. A writer destroyed without a successful
// Commit() removes its temporary and leaves the destination untouched.
//
// Not thread-safe; one writer per destination at a time. Move-only.

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <string_view>

#include "roll/common/status.h"

namespace roll {
namespace common_internal {

class AtomicFileWriter {
 public:
  // Creates the temporary file for `path` with permissions `mode` (0600 for
  // secrets). Fails when the directory does not exist or is not writable.
  static absl::StatusOr<AtomicFileWriter> Create(const std::string& path, mode_t mode = 0644);

  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  absl::Status Append(const void* data, size_t n);
  absl::Status Append(std::string_view s) { return Append(s.data(), s.size()); }
  // Makes the new contents visible at the destination path.
  absl::Status Commit();

  const std::string& path() const { return path_; }

 private:
  AtomicFileWriter(std::string path, std::string tmp_path, int fd)
      : path_(std::move(path)), tmp_path_(std::move(tmp_path)), fd_(fd) {}
  void Abandon();

  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

// Writes `contents` to `path` through an AtomicFileWriter.
absl::Status WriteFileAtomically(const std::string& path, std::string_view contents);

}  // namespace common_internal
}  // namespace roll
