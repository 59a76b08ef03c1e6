#include "roll/strategies/offload.h"

#include <fcntl.h>
#include <malloc.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/variable.h>
#ifdef ROLL_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "roll/common/logging.h"

namespace roll {
namespace {

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// An unlinked file in `dir`: nothing is left behind however the process ends.
absl::StatusOr<int> OpenSpillFile(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  // Filesystems without O_TMPFILE: create and unlink at once.
  std::string tmpl = (std::filesystem::path(dir) / "roll-offload-XXXXXX").string();
  fd = ::mkostemp(tmpl.data(), O_CLOEXEC);
  if (fd < 0) return Errno(absl::StrCat("cannot create a spill file in ", dir));
  ::unlink(tmpl.c_str());
  return fd;
}

absl::Status WriteAll(int fd, const char* data, int64_t n, int64_t offset, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, data, static_cast<size_t>(n), offset);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return Errno(absl::StrCat("offloading to ", path));
    data += w;
    n -= w;
    offset += w;
  }
  return absl::OkStatus();
}

absl::Status ReadAll(int fd, char* data, int64_t n, int64_t offset, const std::string& path) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, data, static_cast<size_t>(n), offset);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno(absl::StrCat("onloading from ", path));
    if (r == 0) return absl::DataLossError(absl::StrCat("onloading from ", path, ": the file is short"));
    data += r;
    n -= r;
    offset += r;
  }
  return absl::OkStatus();
}

at::TensorOptions OptionsOf(const at::Tensor& t) {
  return at::TensorOptions().dtype(t.dtype()).device(t.device());
}

// A uint8 tensor over all of `storage`.
at::Tensor BytesOf(const c10::Storage& storage, c10::Device device) {
  const int64_t n = static_cast<int64_t>(storage.nbytes());
  return at::empty({0}, at::TensorOptions().dtype(at::kByte).device(device)).set_(storage, 0, {n}, {1});
}

}  // namespace

bool IsMemoryFileSystem(const std::string& dir) {
  struct statfs fs;
  if (::statfs(dir.c_str(), &fs) != 0) return false;
  return fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC;
}

std::string DefaultSpillDirectory() {
  std::error_code ec;
  std::string temp = std::filesystem::temp_directory_path(ec).string();
  if (ec || temp.empty()) temp = "/tmp";
  if (IsMemoryFileSystem(temp) && ::access("/var/tmp", W_OK | X_OK) == 0 && !IsMemoryFileSystem("/var/tmp")) {
    return "/var/tmp";
  }
  return temp;
}

TensorOffloader::TensorOffloader(std::string spill_dir) : spill_dir_(std::move(spill_dir)) {
  if (spill_dir_.empty()) spill_dir_ = DefaultSpillDirectory();
}

TensorOffloader::~TensorOffloader() {
  if (fd_ >= 0) ::close(fd_);
}

int64_t TensorOffloader::offloaded_bytes() const {
  int64_t n = 0;
  for (const Group& g : groups_) n += g.nbytes;
  return n;
}

absl::Status TensorOffloader::Offload(const std::vector<at::Tensor>& tensors) {
  if (offloaded()) return absl::FailedPreconditionError("Offload: the tensors are already offloaded");
  int fd = -1;  // the spill file, closed on every failure
  try {
    std::vector<Group> groups;
    std::map<const c10::StorageImpl*, size_t> index;
    for (const at::Tensor& t : tensors) {
      if (!t.defined() || !t.has_storage() || t.storage().nbytes() == 0) continue;
      const c10::StorageImpl* key = t.storage().unsafeGetStorageImpl();
      auto [it, fresh] = index.emplace(key, groups.size());
      if (fresh) {
        Group g;
        g.nbytes = static_cast<int64_t>(t.storage().nbytes());
        g.device = t.device();
        groups.push_back(std::move(g));
      }
      Member m;
      m.tensor = t;
      m.offset = t.storage_offset();
      m.sizes = t.sizes().vec();
      m.strides = t.strides().vec();
      groups[it->second].members.push_back(std::move(m));
    }
    if (groups.empty()) return absl::OkStatus();

    // Copy everything out first; only then release the device memory, so a
    // failure leaves every tensor as it was.
    int64_t file_bytes = 0;
    for (Group& g : groups) {
      const c10::Storage& storage = g.members.front().tensor.storage();
      if (g.device.is_cpu()) {
        if (fd < 0) {
          auto opened = OpenSpillFile(spill_dir_);
          if (!opened.ok()) return opened.status();
          fd = *opened;
        }
        g.file_offset = file_bytes;
        absl::Status s = WriteAll(fd, static_cast<const char*>(storage.data()), g.nbytes, g.file_offset,
                                  absl::StrCat("a spill file in ", spill_dir_));
        if (!s.ok()) {
          ::close(fd);
          fd = -1;
          return s;
        }
        file_bytes += g.nbytes;
      } else {
        g.host = at::empty({g.nbytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
        g.host.copy_(BytesOf(storage, g.device));
      }
    }
    bool on_device = false;
    for (Group& g : groups) {
      for (Member& m : g.members) m.tensor.set_data(at::empty({0}, OptionsOf(m.tensor)));
      on_device = on_device || !g.device.is_cpu();
    }
    // The caching allocator keeps freed blocks for this process; colocated
    // clusters are other processes, so give the blocks back to the driver.
    if (on_device) ReleaseCachedDeviceMemory();
    fd_ = fd;
    spill_path_ = absl::StrCat("a spill file in ", spill_dir_);
    groups_ = std::move(groups);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    if (fd >= 0) ::close(fd);
    return absl::InternalError(absl::StrCat("Offload: ", e.what()));
  }
}

absl::Status TensorOffloader::Onload() {
  if (!offloaded()) return absl::OkStatus();
  try {
    // Allocate and fill every storage before any tensor points at it.
    std::vector<at::Tensor> fresh;
    for (const Group& g : groups_) {
      at::Tensor bytes = at::empty({g.nbytes}, at::TensorOptions().dtype(at::kByte).device(g.device));
      if (g.device.is_cpu()) {
        ROLL_RETURN_IF_ERROR(ReadAll(fd_, static_cast<char*>(bytes.data_ptr()), g.nbytes, g.file_offset, spill_path_));
      } else {
        bytes.copy_(g.host);
      }
      fresh.push_back(std::move(bytes));
    }
    for (size_t i = 0; i < groups_.size(); ++i) {
      const c10::Storage storage = fresh[i].storage();
      for (Member& m : groups_[i].members) {
        m.tensor.set_data(at::empty({0}, OptionsOf(m.tensor)).set_(storage, m.offset, m.sizes, m.strides));
        // Caches keyed by (data pointer, version) -- the decode path's fused
        // weights -- must not take the new memory for the old.
        torch::autograd::impl::bump_version(m.tensor);
      }
    }
    groups_.clear();
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("Onload: ", e.what()));
  }
}

void ReleaseCachedDeviceMemory() {
#ifdef ROLL_WITH_CUDA
  // Only the CUDA configuration links the caching allocator (and so can hold
  // device memory); a machine without a device has nothing cached.
  if (c10::cuda::device_count() > 0) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

int64_t ResidentBytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) != 0) continue;
    std::string digits;
    for (char c : line) {
      if (c >= '0' && c <= '9') digits.push_back(c);
    }
    int64_t kb = 0;
    if (absl::SimpleAtoi(digits, &kb)) return kb * 1024;
  }
  return -1;
}

StateOffload::StateOffload(std::string who, std::string spill_dir)
    : who_(std::move(who)), offloader_(std::move(spill_dir)) {}

absl::StatusOr<Batch> StateOffload::Offload(const std::vector<at::Tensor>& tensors, int64_t also_freed) {
  if (!offloaded_) {
    if (!warned_in_memory_ &&
        std::any_of(tensors.begin(), tensors.end(),
                    [](const at::Tensor& t) { return t.defined() && t.device().is_cpu(); }) &&
        offloader_.spill_in_memory()) {
      warned_in_memory_ = true;
      LogWarning(absl::StrCat(who_, ": offload_dir ", offloader_.spill_dir(),
                              " is a memory file system (tmpfs): offloaded CPU tensors stay in memory"));
    }
    ROLL_RETURN_IF_ERROR(Annotate(offloader_.Offload(tensors), absl::StrCat(who_, ": offload_states")));
    offloaded_ = true;
    // Give the freed heap pages back to the system, so resident memory
    // reflects the offload.
    malloc_trim(0);
  }
  Batch out;
  out.SetMeta("offloaded_bytes", absl::StrCat(offloader_.offloaded_bytes() + also_freed));
  out.SetMeta("resident_bytes", absl::StrCat(ResidentBytes()));
  return out;
}

absl::StatusOr<Batch> StateOffload::Onload() {
  ROLL_RETURN_IF_ERROR(Annotate(offloader_.Onload(), absl::StrCat(who_, ": load_states")));
  offloaded_ = false;
  Batch out;
  out.SetMeta("resident_bytes", absl::StrCat(ResidentBytes()));
  return out;
}

absl::Status StateOffload::Check(std::string_view method) const {
  if (!offloaded_) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(who_, ": '", Sv(method), "' while its states are offloaded; call load_states first"));
}

}  // namespace roll
