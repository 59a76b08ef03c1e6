#pragma once
// Reading and writing the safetensors checkpoint format, single-file and
// sharded the way Hugging Face lays out model directories.
//
// Format: an 8-byte little-endian header length N, N bytes of JSON header
//   {"<name>": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]},
//    ..., "__metadata__": {"<key>": "<string>"}}
// then the data buffer; offsets are relative to the buffer start. Open()
// validates the whole header before returning: every entry has a known
// dtype, end - begin == numel * itemsize, and the entries tile the buffer
// exactly (no overlap, no gap, nothing past the end), as the format requires.
// Any violation is an error naming the file and the tensor.
//
// Supported dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL. Files holding
// other dtypes the format defines (U16 U32 U64 F8_E4M3 F8_E5M2) still open;
// loading such a tensor is an Unimplemented error.
//
// Files are memory-mapped. Load*() return owned tensors (a copy, the mapping
// may go away afterwards); View() returns a zero-copy tensor that aliases the
// mapping and keeps it alive. As with any mapping, the file must not be
// truncated in place while open (replacing it by rename, as the writers here
// do, is safe). All multi-byte data is little-endian on disk;
// this code requires a little-endian host.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include "roll/common/status.h"

namespace roll {

// One tensor's header entry.
struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype;  // as spelled in the file: "F32", "BF16", ...
  // The matching LibTorch dtype; c10::ScalarType::Undefined when LibTorch has
  // none (then Load/View fail for this tensor).
  c10::ScalarType scalar_type = c10::ScalarType::Undefined;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data buffer, [begin, end)
  uint64_t end = 0;

  uint64_t nbytes() const { return end - begin; }
};

// A validated, memory-mapped safetensors file.
//
// Ownership: the file object owns the mapping; tensors returned by View()
// share it (they stay valid after the SafetensorsFile is destroyed). The
// mapping is private copy-on-write: writing into a View() tensor never
// reaches the file on disk, but later View()/Load() calls on the same
// SafetensorsFile see the change. Do not write into View() tensors unless
// that is what you want.
//
// Thread-safety: immutable after Open(); every const method may be called
// from any number of threads at once.
class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // Tensor names, sorted.
  std::vector<std::string> names() const;
  bool Contains(std::string_view name) const;
  // The "__metadata__" object; empty when the file has none.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Byte offset of the data buffer in the file (8 + header length).
  uint64_t data_start() const { return data_start_; }

  // NotFound (naming the tensor and the file) when absent.
  absl::StatusOr<SafetensorsTensorInfo> Info(std::string_view name) const;

  // Owned contiguous CPU copy in the stored dtype.
  absl::StatusOr<at::Tensor> Load(std::string_view name) const;
  // Owned contiguous CPU copy converted to `dtype`.
  absl::StatusOr<at::Tensor> Load(std::string_view name, c10::ScalarType dtype) const;
  // Like Load(name), but first checks the stored shape equals
  // `expected_shape` (InvalidArgument naming both shapes otherwise).
  absl::StatusOr<at::Tensor> Load(std::string_view name,
                                  const std::vector<int64_t>& expected_shape) const;
  // Copies the tensor into `target` (any dtype or device; converted), which
  // must have exactly the stored shape. Works on parameters that require
  // grad (the copy is not recorded by autograd).
  absl::Status LoadInto(std::string_view name, at::Tensor& target) const;

  // Zero-copy CPU tensor aliasing the mapping when the data is aligned to
  // the element size (always the case for files SaveSafetensors writes);
  // otherwise an owned copy.
  absl::StatusOr<at::Tensor> View(std::string_view name) const;

  struct Mapping;  // private; public only so the .cc can name it

 private:
  SafetensorsFile() = default;
  absl::StatusOr<const SafetensorsTensorInfo*> Find(std::string_view name) const;

  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  uint64_t data_start_ = 0;
  std::map<std::string, SafetensorsTensorInfo, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A Hugging Face model checkpoint: one `model.safetensors`, or shards listed
// by `model.safetensors.index.json` ("weight_map": tensor name -> shard file
// name, relative to the index's directory).
//
// Open() maps every shard and checks that each tensor the index names exists
// in its shard; a missing shard or tensor is an error naming the index file,
// the shard and the tensor. Tensors present in a shard but absent from the
// weight_map are ignored, as Hugging Face does.
//
// Ownership and thread-safety: as SafetensorsFile (owns its shards;
// immutable after Open; const methods are safe from many threads).
class Checkpoint {
 public:
  // `path` is a directory (the index is preferred when both files exist), a
  // `*.safetensors` file, or a `*.index.json` file.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& path);

  // The file opened: the single .safetensors or the index.
  const std::string& path() const { return path_; }
  bool sharded() const { return sharded_; }
  std::vector<std::string> names() const;
  bool Contains(std::string_view name) const;
  // Single file: its __metadata__. Sharded: the index's "metadata" object
  // (non-string values such as total_size as their JSON text).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The shard holding `name` (NotFound when absent).
  absl::StatusOr<const SafetensorsFile*> FileFor(std::string_view name) const;

  absl::StatusOr<SafetensorsTensorInfo> Info(std::string_view name) const;
  absl::StatusOr<at::Tensor> Load(std::string_view name) const;
  absl::StatusOr<at::Tensor> Load(std::string_view name, c10::ScalarType dtype) const;
  absl::StatusOr<at::Tensor> Load(std::string_view name,
                                  const std::vector<int64_t>& expected_shape) const;
  absl::Status LoadInto(std::string_view name, at::Tensor& target) const;
  absl::StatusOr<at::Tensor> View(std::string_view name) const;

 private:
  Checkpoint() = default;

  std::string path_;
  bool sharded_ = false;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
};

// File names Hugging Face uses inside a model directory.
inline constexpr char kSafetensorsSingleFile[] = "model.safetensors";
inline constexpr char kSafetensorsIndexFile[] = "model.safetensors.index.json";
// Hugging Face's default max_shard_size ("5GB").
inline constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000ull;

// Writes `tensors` (any device, any layout; copied to contiguous CPU memory
// one tensor at a time) to `path` atomically: a temporary file in the same
// directory is written, fsynced and renamed over `path`, so on failure the
// previous file is left intact and no temporary remains.
//
// Data is laid out by decreasing element size, then name (the order the
// reference implementation uses), and the header is padded with spaces so the
// buffer starts at a multiple of 8: every tensor is aligned to its element
// size, which View() relies on. A "format": "pt" entry is added to the
// metadata unless present, because Hugging Face transformers refuses
// metadata without it. Tensor names must be non-empty and not
// "__metadata__"; dtypes must be among the supported ones.
absl::Status SaveSafetensors(const std::string& path,
                             const std::map<std::string, at::Tensor>& tensors,
                             const std::map<std::string, std::string>& metadata = {});

// Writes `tensors` into directory `dir` (created if missing) the way
// Hugging Face's save_pretrained does: tensors are packed in name order into
// shards of at most `max_shard_bytes` of tensor data (a larger tensor gets a
// shard of its own), named `model-00001-of-0000N.safetensors`, plus
// `model.safetensors.index.json` with {"metadata": {"total_size": bytes},
// "weight_map": {...}}. When everything fits in one shard the result is a
// plain `model.safetensors` and no index. `metadata` goes into every shard.
//
// Every file is replaced atomically and the index is written last, after all
// shards. Afterwards, model*.safetensors files and an index in `dir` that
// belong to a previous save of a different layout are removed, so Checkpoint
// ::Open(dir) always reads what was just written. A failed save may leave a
// mix of old and new shards under the old index; save each checkpoint into
// a fresh directory when that matters.
absl::Status SaveSharded(const std::string& dir,
                         const std::map<std::string, at::Tensor>& tensors,
                         uint64_t max_shard_bytes = kDefaultMaxShardBytes,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace roll
