#pragma once
// TensorOffloader: takes the memory of a set of tensors off their device
// and gives it back, in place -- what colocated clusters use so that only
// the stage that runs holds device memory (docs/placement.md, "Offload").
//
// Offload() groups the tensors by the storage they live in (a flattened
// model's parameters are views of one buffer; a tied weight appears once),
// copies each storage's bytes out and points every tensor at an empty
// storage of its dtype. Onload() allocates each storage again on its
// device, copies the bytes back and points every tensor at it with the
// offset, sizes and strides it had. The tensor objects stay the same, so
// whatever holds them (the model's modules, the optimizer's slots, autograd
// leaves with requires_grad) sees the new memory; aliasing between them is
// kept.
//
// Where the bytes go:
//   GPU tensors  host memory (pinned when CUDA is available);
//   CPU tensors  an unlinked file in `spill_dir`, so the process's resident
//                memory drops by their size (the data sits in the page
//                cache, which the kernel may write out and reclaim; on a
//                tmpfs it stays in memory as shmem). The file is gone when
//                the offloader closes it or the process ends.
// Offload is all or nothing: when copying out fails, every tensor keeps its
// memory and the error names the file. Gradients are not offloaded: release
// them (set .grad() undefined) before offloading.
//
// Ownership: the offloader holds handles to the tensors it offloaded until
// Onload(). Thread-safety: none; the owner (a worker's executor thread)
// calls it, and nobody may use the tensors while they are offloaded.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "roll/common/batch.h"
#include "roll/common/status.h"

namespace roll {

// Whether `dir` is on a memory file system (tmpfs, ramfs); false when it
// cannot be examined.
bool IsMemoryFileSystem(const std::string& dir);

// Where spill files go by default: the system's temporary directory (TMPDIR,
// else /tmp), unless that is a memory file system and /var/tmp is a
// writable directory that is not.
std::string DefaultSpillDirectory();

class TensorOffloader {
 public:
  // `spill_dir`: directory for the spill files of CPU tensors; empty:
  // DefaultSpillDirectory().
  explicit TensorOffloader(std::string spill_dir = "");
  ~TensorOffloader();
  TensorOffloader(const TensorOffloader&) = delete;
  TensorOffloader& operator=(const TensorOffloader&) = delete;

  // Moves the memory of `tensors` (undefined and empty ones are skipped)
  // off their device. FailedPrecondition when already offloaded.
  absl::Status Offload(const std::vector<at::Tensor>& tensors);
  // Brings everything back. A no-op when nothing is offloaded. On failure
  // the tensors stay offloaded (empty) and a later Onload may retry.
  absl::Status Onload();

  bool offloaded() const { return !groups_.empty(); }
  // Bytes currently held off the device (0 when not offloaded).
  int64_t offloaded_bytes() const;

  const std::string& spill_dir() const { return spill_dir_; }
  // Whether spill_dir is on a memory file system (tmpfs, ramfs): CPU
  // tensors spilled there stay in memory, as shared memory.
  bool spill_in_memory() const { return IsMemoryFileSystem(spill_dir_); }

 private:
  struct Member {
    at::Tensor tensor;  // a handle of the caller's tensor object
    int64_t offset = 0;
    std::vector<int64_t> sizes, strides;
  };
  struct Group {
    int64_t nbytes = 0;
    c10::Device device = c10::Device(c10::DeviceType::CPU);
    int64_t file_offset = 0;  // CPU: where in the spill file
    at::Tensor host;          // GPU: the bytes in host memory
    std::vector<Member> members;
  };

  std::string spill_dir_;
  int fd_ = -1;  // spill file of the current offload, -1 when none
  std::string spill_path_;  // for error messages
  std::vector<Group> groups_;
};

// Returns the GPU memory LibTorch's caching allocator keeps for this
// process to the driver, so that another process (a colocated cluster) can
// use it. A no-op outside the CUDA configuration (ROLL_WITH_CUDA) and on a
// machine without a device. Offload calls it for GPU tensors;
// call it after freeing other device memory (a KV cache) yourself.
void ReleaseCachedDeviceMemory();

// Resident memory of this process in bytes (VmRSS of /proc/self/status), or
// -1 where that is not available.
int64_t ResidentBytes();

// offload_states / load_states of a model worker (docs/placement.md,
// "Offload"): the tensors the worker keeps between calls move off its
// device and back. While offloaded, the worker's other methods that need
// them fail with Check()'s error.
class StateOffload {
 public:
  // `who`: "actor_train rank 0" for messages; `spill_dir` as TensorOffloader.
  StateOffload(std::string who, std::string spill_dir);
  // Offloads `tensors`; `also_freed`: bytes the caller released itself
  // (a KV cache). Reply meta: offloaded_bytes, resident_bytes (VmRSS of the
  // process afterwards). Offloading twice is a no-op.
  absl::StatusOr<Batch> Offload(const std::vector<at::Tensor>& tensors, int64_t also_freed = 0);
  // Brings the tensors back; reply meta resident_bytes. A no-op when not offloaded.
  absl::StatusOr<Batch> Onload();
  bool offloaded() const { return offloaded_; }
  // FailedPrecondition naming the worker and `method` while offloaded.
  absl::Status Check(std::string_view method) const;

 private:
  std::string who_;
  TensorOffloader offloader_;
  bool offloaded_ = false;
  bool warned_in_memory_ = false;
};

}  // namespace roll
