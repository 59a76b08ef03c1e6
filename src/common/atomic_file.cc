#include "common/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace roll {
namespace common_internal {
namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path, int err) {
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (err == ENOENT || err == ENOTDIR) code = absl::StatusCode::kNotFound;
  if (err == EACCES || err == EPERM || err == EROFS) code = absl::StatusCode::kPermissionDenied;
  if (err == ENOSPC || err == EFBIG || err == EDQUOT) code = absl::StatusCode::kResourceExhausted;
  return absl::Status(code, absl::StrCat(path, ": ", what, ": ", strerror(err)));
}

std::string DirOf(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Create(const std::string& path, mode_t mode) {
  if (path.empty() || path.back() == '/') {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a file path"));
  }
  // mkstemp picks a fresh name, so concurrent writers of the same
  // destination never share a temporary.
  std::string tmpl = absl::StrCat(path, ".tmp.XXXXXX");
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  int fd = mkostemp(buf.data(), O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot create temporary file", path, errno);
  // mkstemp creates 0600; checkpoints are meant to be shared like any file.
  if (mode != 0600) fchmod(fd, mode);
  return AtomicFileWriter(path, std::string(buf.data()), fd);
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      tmp_path_(std::move(other.tmp_path_)),
      fd_(std::exchange(other.fd_, -1)),
      committed_(std::exchange(other.committed_, true)) {}

AtomicFileWriter& AtomicFileWriter::operator=(AtomicFileWriter&& other) noexcept {
  if (this != &other) {
    Abandon();
    path_ = std::move(other.path_);
    tmp_path_ = std::move(other.tmp_path_);
    fd_ = std::exchange(other.fd_, -1);
    committed_ = std::exchange(other.committed_, true);
  }
  return *this;
}

AtomicFileWriter::~AtomicFileWriter() { Abandon(); }

void AtomicFileWriter::Abandon() {
  if (fd_ >= 0) {
    close(fd_);
    fd_ = -1;
  }
  if (!committed_ && !tmp_path_.empty()) unlink(tmp_path_.c_str());
  committed_ = true;
}

absl::Status AtomicFileWriter::Append(const void* data, size_t n) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": writer is closed"));
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = write(fd_, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError("write failed", path_, errno);
    }
    if (w == 0) return ErrnoError("write failed", path_, EIO);
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, ": writer is closed"));
  if (fsync(fd_) != 0) return ErrnoError("fsync failed", path_, errno);
  int fd = std::exchange(fd_, -1);
  if (close(fd) != 0) return ErrnoError("close failed", path_, errno);
  if (rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    return ErrnoError("cannot rename temporary file into place", path_, errno);
  }
  committed_ = true;
  // Without this the rename may be lost on power failure even though the
  // data blocks were synced.
  int dir_fd = open(DirOf(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    fsync(dir_fd);
    close(dir_fd);
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, std::string_view contents) {
  ROLL_ASSIGN_OR_RETURN(AtomicFileWriter writer, AtomicFileWriter::Create(path));
  ROLL_RETURN_IF_ERROR(writer.Append(contents));
  return writer.Commit();
}

}  // namespace common_internal
}  // namespace roll
