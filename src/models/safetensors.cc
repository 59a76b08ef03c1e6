#include "roll/models/safetensors.h"

#include <torch/torch.h>

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/atomic_file.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.cc maps little-endian tensor bytes directly and needs a little-endian host"
#endif

namespace roll {

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr != nullptr) munmap(addr, size);
  }
};

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// The reference implementation refuses larger headers; so do we, which also
// bounds the work a hostile file can cause before any data is touched.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr char kMetadataKey[] = "__metadata__";

struct DtypeEntry {
  const char* name;
  uint64_t itemsize;
  c10::ScalarType scalar_type;  // Undefined: the format knows it, LibTorch 1.x does not
};

constexpr DtypeEntry kDtypes[] = {
    {"F64", 8, c10::ScalarType::Double},     {"F32", 4, c10::ScalarType::Float},
    {"F16", 2, c10::ScalarType::Half},       {"BF16", 2, c10::ScalarType::BFloat16},
    {"I64", 8, c10::ScalarType::Long},       {"I32", 4, c10::ScalarType::Int},
    {"I16", 2, c10::ScalarType::Short},      {"I8", 1, c10::ScalarType::Char},
    {"U8", 1, c10::ScalarType::Byte},        {"BOOL", 1, c10::ScalarType::Bool},
    {"U16", 2, c10::ScalarType::Undefined},  {"U32", 4, c10::ScalarType::Undefined},
    {"U64", 8, c10::ScalarType::Undefined},  {"F8_E4M3", 1, c10::ScalarType::Undefined},
    {"F8_E5M2", 1, c10::ScalarType::Undefined},
};

const DtypeEntry* DtypeByName(const std::string& name) {
  for (const DtypeEntry& d : kDtypes) {
    if (name == d.name) return &d;
  }
  return nullptr;
}

const DtypeEntry* DtypeByScalarType(c10::ScalarType t) {
  for (const DtypeEntry& d : kDtypes) {
    if (d.scalar_type == t && t != c10::ScalarType::Undefined) return &d;
  }
  return nullptr;
}

std::string ShapeStr(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string ShapeStr(at::IntArrayRef shape) {
  return ShapeStr(std::vector<int64_t>(shape.begin(), shape.end()));
}

std::string Quote(std::string_view s) { return absl::StrCat("'", Sv(s), "'"); }

absl::Status ErrnoStatus(const std::string& path, absl::string_view what, int err) {
  std::string msg = absl::StrCat(path, ": ", what, ": ", strerror(err));
  if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

// Turns a LibTorch exception into a status with context instead of letting it
// escape the module.
template <typename F>
auto CatchTorch(const std::string& context, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat(context, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(context, ": ", e.what()));
  }
}

// Reads a non-negative JSON integer that fits uint64.
bool GetU64(const json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer()) {
    int64_t v = j.get<int64_t>();
    if (v < 0) return false;
    *out = static_cast<uint64_t>(v);
    return true;
  }
  return false;
}

absl::StatusOr<SafetensorsTensorInfo> ParseEntry(const std::string& path, const std::string& name,
                                                 const json& entry) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tensor ", Quote(name), ": ", what));
  };
  if (!entry.is_object()) return bad("header entry is not a JSON object");
  SafetensorsTensorInfo info;
  info.name = name;

  auto dt = entry.find("dtype");
  if (dt == entry.end() || !dt->is_string()) return bad("missing or non-string \"dtype\"");
  info.dtype = dt->get<std::string>();
  const DtypeEntry* d = DtypeByName(info.dtype);
  if (d == nullptr) return bad(absl::StrCat("unknown dtype ", Quote(info.dtype)));
  info.scalar_type = d->scalar_type;

  auto sh = entry.find("shape");
  if (sh == entry.end() || !sh->is_array()) return bad("missing or non-array \"shape\"");
  uint64_t numel = 1;
  for (const json& dim : *sh) {
    uint64_t v = 0;
    if (!GetU64(dim, &v) || v > static_cast<uint64_t>(INT64_MAX)) {
      return bad(absl::StrCat("shape ", sh->dump(), " has a dimension that is not a non-negative integer"));
    }
    if (__builtin_mul_overflow(numel, v, &numel)) {
      return bad(absl::StrCat("shape ", sh->dump(), " overflows"));
    }
    info.shape.push_back(static_cast<int64_t>(v));
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, d->itemsize, &nbytes)) {
    return bad(absl::StrCat("shape ", sh->dump(), " overflows"));
  }

  auto off = entry.find("data_offsets");
  if (off == entry.end() || !off->is_array() || off->size() != 2 || !GetU64((*off)[0], &info.begin) ||
      !GetU64((*off)[1], &info.end)) {
    return bad("\"data_offsets\" must be two non-negative integers [begin, end]");
  }
  if (info.begin > info.end) {
    return bad(absl::StrCat("data_offsets [", info.begin, ", ", info.end, "] have begin > end"));
  }
  if (info.end - info.begin != nbytes) {
    return bad(absl::StrCat("data_offsets [", info.begin, ", ", info.end, "] span ",
                            info.end - info.begin, " bytes but ", info.dtype, " ",
                            ShapeStr(info.shape), " needs ", nbytes));
  }
  return info;
}

// Checks the entries tile [0, buffer_size) exactly.
absl::Status CheckLayout(const std::string& path,
                         const std::map<std::string, SafetensorsTensorInfo, std::less<>>& tensors,
                         uint64_t buffer_size) {
  std::vector<const SafetensorsTensorInfo*> order;
  order.reserve(tensors.size());
  for (const auto& [name, info] : tensors) order.push_back(&info);
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return std::tie(a->begin, a->end, a->name) < std::tie(b->begin, b->end, b->name);
  });
  uint64_t cursor = 0;
  const SafetensorsTensorInfo* prev = nullptr;
  for (const SafetensorsTensorInfo* t : order) {
    if (t->end > buffer_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor ", Quote(t->name), ": data_offsets [", t->begin, ", ", t->end,
          "] run past the end of the data buffer (", buffer_size, " bytes)"));
    }
    if (t->begin < cursor) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor ", Quote(t->name), ": data_offsets [", t->begin, ", ", t->end,
          "] overlap tensor ", Quote(prev->name), " [", prev->begin, ", ", prev->end, "]"));
    }
    if (t->begin > cursor) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor ", Quote(t->name), ": data_offsets [", t->begin, ", ", t->end,
          "] leave a gap of unindexed bytes at [", cursor, ", ", t->begin, ")"));
    }
    if (t->end > t->begin) prev = t;
    cursor = t->end;
  }
  if (cursor != buffer_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": data buffer is ", buffer_size, " bytes but the header indexes only ",
                     cursor, " (trailing bytes or a header that lies about offsets)"));
  }
  return absl::OkStatus();
}

bool IsAligned(const void* p, uint64_t itemsize) {
  return reinterpret_cast<uintptr_t>(p) % itemsize == 0;
}

absl::Status CheckBoolBytes(const std::string& path, const std::string& name, const uint8_t* p,
                            uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    if (p[i] > 1) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", Quote(name),
                                                     ": BOOL element ", i, " has byte value ",
                                                     static_cast<int>(p[i]), " (must be 0 or 1)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoStatus(path, "cannot open", errno == 0 ? ENOENT : errno);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::InternalError(absl::StrCat(path, ": read failed"));
  return ss.str();
}

}  // namespace

// ---------------------------------------------------------------------------
// SafetensorsFile

SafetensorsFile::~SafetensorsFile() = default;

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(path, "cannot open safetensors file", errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return ErrnoStatus(path, "cannot stat", err);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": truncated safetensors file: ", file_size,
        " bytes, shorter than the 8-byte header length"));
  }
  auto mapping = std::make_shared<Mapping>();
  // Private and writable: a caller writing into a View() tensor gets its own
  // copy of the page instead of a SIGSEGV, and the file never changes.
  void* addr = mmap(nullptr, file_size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  int map_err = errno;
  close(fd);
  if (addr == MAP_FAILED) return ErrnoStatus(path, "mmap failed", map_err);
  mapping->addr = addr;
  mapping->size = file_size;
  const uint8_t* base = static_cast<const uint8_t*>(addr);

  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);
  if (header_len > file_size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": header length ", header_len, " exceeds the ", file_size - 8,
        " bytes that follow it (truncated or not a safetensors file)"));
  }
  if (header_len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", header_len,
                                                   " exceeds the format's limit of ",
                                                   kMaxHeaderBytes, " bytes"));
  }
  const char* hdr = reinterpret_cast<const char*>(base + 8);
  if (header_len < 2 || hdr[0] != '{') {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header is not a JSON object (must start with '{')"));
  }
  json header;
  try {
    header = json::parse(hdr, hdr + header_len);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": invalid JSON header: ", e.what()));
  }
  if (!header.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not a JSON object"));
  }

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->data_start_ = 8 + header_len;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      if (value.is_null()) continue;
      if (!value.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": \"__metadata__\" is not an object of strings"));
      }
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(
              path, ": \"__metadata__\" key ", Quote(mk), " is not a string (", mv.dump(), ")"));
        }
        file->metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    ROLL_ASSIGN_OR_RETURN(SafetensorsTensorInfo info, ParseEntry(path, key, value));
    file->tensors_.emplace(key, std::move(info));
  }
  ROLL_RETURN_IF_ERROR(CheckLayout(path, file->tensors_, file_size - file->data_start_));
  file->mapping_ = std::move(mapping);
  return file;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) out.push_back(name);
  return out;
}

bool SafetensorsFile::Contains(std::string_view name) const {
  return tensors_.find(name) != tensors_.end();
}

absl::StatusOr<const SafetensorsTensorInfo*> SafetensorsFile::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(
        absl::StrCat(path_, ": no tensor named ", Quote(name), " (file has ", tensors_.size(),
                     " tensors)"));
  }
  if (it->second.scalar_type == c10::ScalarType::Undefined) {
    return absl::UnimplementedError(absl::StrCat(path_, ": tensor ", Quote(name), ": dtype ",
                                                 it->second.dtype,
                                                 " has no LibTorch equivalent"));
  }
  return &it->second;
}

absl::StatusOr<SafetensorsTensorInfo> SafetensorsFile::Info(std::string_view name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor named ", Quote(name)));
  }
  return it->second;
}

absl::StatusOr<at::Tensor> SafetensorsFile::Load(std::string_view name) const {
  ROLL_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, Find(name));
  const uint8_t* src = static_cast<const uint8_t*>(mapping_->addr) + data_start_ + info->begin;
  if (info->scalar_type == c10::ScalarType::Bool) {
    ROLL_RETURN_IF_ERROR(CheckBoolBytes(path_, info->name, src, info->nbytes()));
  }
  return CatchTorch(absl::StrCat(path_, ": tensor ", Quote(name)),
                    [&]() -> absl::StatusOr<at::Tensor> {
                      at::Tensor t = torch::empty(info->shape, torch::dtype(info->scalar_type));
                      if (info->nbytes() > 0) std::memcpy(t.data_ptr(), src, info->nbytes());
                      return t;
                    });
}

absl::StatusOr<at::Tensor> SafetensorsFile::View(std::string_view name) const {
  ROLL_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, Find(name));
  uint8_t* src = static_cast<uint8_t*>(mapping_->addr) + data_start_ + info->begin;
  const uint64_t itemsize = c10::elementSize(info->scalar_type);
  if (!IsAligned(src, itemsize)) return Load(name);
  if (info->scalar_type == c10::ScalarType::Bool) {
    ROLL_RETURN_IF_ERROR(CheckBoolBytes(path_, info->name, src, info->nbytes()));
  }
  std::shared_ptr<Mapping> keep = mapping_;
  return CatchTorch(absl::StrCat(path_, ": tensor ", Quote(name)),
                    [&]() -> absl::StatusOr<at::Tensor> {
                      return torch::from_blob(
                          src, info->shape, [keep](void*) mutable { keep.reset(); },
                          torch::dtype(info->scalar_type));
                    });
}

absl::StatusOr<at::Tensor> SafetensorsFile::Load(std::string_view name,
                                                 c10::ScalarType dtype) const {
  ROLL_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, Find(name));
  if (info->scalar_type == dtype) return Load(name);
  // Converting straight from the mapping avoids an intermediate copy.
  ROLL_ASSIGN_OR_RETURN(at::Tensor view, View(name));
  return CatchTorch(absl::StrCat(path_, ": tensor ", Quote(name), ": converting ", info->dtype,
                                 " to ", c10::toString(dtype)),
                    [&]() -> absl::StatusOr<at::Tensor> { return view.to(dtype); });
}

absl::StatusOr<at::Tensor> SafetensorsFile::Load(
    std::string_view name, const std::vector<int64_t>& expected_shape) const {
  ROLL_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, Find(name));
  if (info->shape != expected_shape) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor ", Quote(name), " has shape ",
                                                   ShapeStr(info->shape), ", expected ",
                                                   ShapeStr(expected_shape)));
  }
  return Load(name);
}

absl::Status SafetensorsFile::LoadInto(std::string_view name, at::Tensor& target) const {
  ROLL_ASSIGN_OR_RETURN(const SafetensorsTensorInfo* info, Find(name));
  if (!target.defined()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor ", Quote(name), ": target tensor is undefined"));
  }
  if (target.sizes() != at::IntArrayRef(info->shape)) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor ", Quote(name), " has shape ",
                                                   ShapeStr(info->shape), ", target expects ",
                                                   ShapeStr(target.sizes())));
  }
  ROLL_ASSIGN_OR_RETURN(at::Tensor src, View(name));
  return CatchTorch(absl::StrCat(path_, ": tensor ", Quote(name), ": copying into target"),
                    [&]() -> absl::Status {
                      torch::NoGradGuard no_grad;
                      target.copy_(src);
                      return absl::OkStatus();
                    });
}

// ---------------------------------------------------------------------------
// Checkpoint

namespace {

absl::Status CheckShardName(const std::string& index_path, const std::string& tensor,
                            const std::string& shard) {
  fs::path p(shard);
  bool escapes = shard.empty() || p.is_absolute();
  for (const auto& part : p) {
    if (part == "..") escapes = true;
  }
  if (escapes) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": tensor ", Quote(tensor),
                                                   ": shard file name ", Quote(shard),
                                                   " must be a relative path inside the "
                                                   "checkpoint directory"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& path) {
  std::error_code ec;
  std::string file = path;
  if (fs::is_directory(path, ec)) {
    fs::path dir(path);
    if (fs::exists(dir / kSafetensorsIndexFile, ec)) {
      file = (dir / kSafetensorsIndexFile).string();
    } else if (fs::exists(dir / kSafetensorsSingleFile, ec)) {
      file = (dir / kSafetensorsSingleFile).string();
    } else {
      return absl::NotFoundError(absl::StrCat(path, ": directory has neither ",
                                              kSafetensorsSingleFile, " nor ",
                                              kSafetensorsIndexFile));
    }
  }

  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->path_ = file;
  const bool is_index = file.size() >= 5 && file.compare(file.size() - 5, 5, ".json") == 0;
  if (!is_index) {
    ROLL_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f, SafetensorsFile::Open(file));
    for (const std::string& name : f->names()) ckpt->index_.emplace(name, f.get());
    ckpt->metadata_ = f->metadata();
    ckpt->files_.push_back(std::move(f));
    return ckpt;
  }

  ckpt->sharded_ = true;
  ROLL_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(file));
  json index;
  try {
    index = json::parse(text);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": invalid JSON: ", e.what()));
  }
  if (!index.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": not a JSON object"));
  }
  auto meta = index.find("metadata");
  if (meta != index.end() && !meta->is_null()) {
    if (!meta->is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": \"metadata\" is not an object"));
    }
    for (const auto& [k, v] : meta->items()) {
      ckpt->metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
    }
  }
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": missing or non-object \"weight_map\""));
  }

  const fs::path dir = fs::path(file).parent_path();
  std::map<std::string, SafetensorsFile*> shards;
  for (const auto& [tensor, shard_json] : wm->items()) {
    if (!shard_json.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": weight_map entry for tensor ",
                                                     Quote(tensor), " is not a file name"));
    }
    const std::string shard = shard_json.get<std::string>();
    ROLL_RETURN_IF_ERROR(CheckShardName(file, tensor, shard));
    auto it = shards.find(shard);
    if (it == shards.end()) {
      const std::string shard_path = (dir / shard).string();
      auto opened = SafetensorsFile::Open(shard_path);
      if (!opened.ok()) {
        return Annotate(opened.status(), absl::StrCat(file, ": shard ", Quote(shard),
                                                      " (holds tensor ", Quote(tensor), ")"));
      }
      ckpt->files_.push_back(std::move(opened).value());
      it = shards.emplace(shard, ckpt->files_.back().get()).first;
    }
    if (!it->second->Contains(tensor)) {
      return absl::NotFoundError(absl::StrCat(file, ": tensor ", Quote(tensor),
                                              " is mapped to shard ", Quote(shard),
                                              ", which does not contain it"));
    }
    ckpt->index_.emplace(tensor, it->second);
  }
  return ckpt;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, f] : index_) out.push_back(name);
  return out;
}

bool Checkpoint::Contains(std::string_view name) const { return index_.find(name) != index_.end(); }

absl::StatusOr<const SafetensorsFile*> Checkpoint::FileFor(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor named ", Quote(name),
                                            " in the checkpoint"));
  }
  return it->second;
}

absl::StatusOr<SafetensorsTensorInfo> Checkpoint::Info(std::string_view name) const {
  ROLL_ASSIGN_OR_RETURN(const SafetensorsFile* f, FileFor(name));
  return f->Info(name);
}
absl::StatusOr<at::Tensor> Checkpoint::Load(std::string_view name) const {
  ROLL_ASSIGN_OR_RETURN(const SafetensorsFile* f, FileFor(name));
  return f->Load(name);
}
absl::StatusOr<at::Tensor> Checkpoint::Load(std::string_view name, c10::ScalarType dtype) const {
  ROLL_ASSIGN_OR_RETURN(const SafetensorsFile* f, FileFor(name));
  return f->Load(name, dtype);
}
absl::StatusOr<at::Tensor> Checkpoint::Load(std::string_view name,
                                            const std::vector<int64_t>& expected_shape) const {
  ROLL_ASSIGN_OR_RETURN(const SafetensorsFile* f, FileFor(name));
  return f->Load(name, expected_shape);
}
absl::Status Checkpoint::LoadInto(std::string_view name, at::Tensor& target) const {
  ROLL_ASSIGN_OR_RETURN(const SafetensorsFile* f, FileFor(name));
  return f->LoadInto(name, target);
}
absl::StatusOr<at::Tensor> Checkpoint::View(std::string_view name) const {
  ROLL_ASSIGN_OR_RETURN(const SafetensorsFile* f, FileFor(name));
  return f->View(name);
}

// ---------------------------------------------------------------------------
// Writing

namespace {

struct PlannedTensor {
  const std::string* name;
  const at::Tensor* tensor;
  const DtypeEntry* dtype;
  uint64_t nbytes;
};

absl::StatusOr<PlannedTensor> PlanTensor(const std::string& path, const std::string& name,
                                         const at::Tensor& t) {
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot save tensor ", Quote(name), ": ", what));
  };
  if (name.empty()) return bad("empty tensor name");
  if (name == kMetadataKey) return bad("the name is reserved for metadata");
  if (!t.defined()) return bad("tensor is undefined");
  if (t.layout() != c10::kStrided) return bad("only dense (strided) tensors can be saved");
  const DtypeEntry* d = DtypeByScalarType(t.scalar_type());
  if (d == nullptr) {
    return bad(absl::StrCat("dtype ", c10::toString(t.scalar_type()),
                            " has no safetensors equivalent"));
  }
  return PlannedTensor{&name, &t, d, static_cast<uint64_t>(t.numel()) * d->itemsize};
}

// Header bytes (length prefix + JSON + space padding) for tensors in `order`.
std::string BuildHeader(const std::vector<PlannedTensor>& order,
                        const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  std::map<std::string, std::string> meta = metadata;
  meta.emplace("format", "pt");
  header[kMetadataKey] = meta;
  uint64_t offset = 0;
  for (const PlannedTensor& p : order) {
    std::vector<int64_t> shape(p.tensor->sizes().begin(), p.tensor->sizes().end());
    header[*p.name] = {{"dtype", p.dtype->name},
                       {"shape", shape},
                       {"data_offsets", {offset, offset + p.nbytes}}};
    offset += p.nbytes;
  }
  std::string text = header.dump();
  // The data buffer must start 8-aligned; the format pads with spaces.
  text.append((8 - text.size() % 8) % 8, ' ');
  uint64_t n = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &n, 8);
  out += text;
  return out;
}

absl::Status WriteFile(const std::string& path, std::vector<PlannedTensor> order,
                       const std::map<std::string, std::string>& metadata) {
  std::stable_sort(order.begin(), order.end(), [](const PlannedTensor& a, const PlannedTensor& b) {
    if (a.dtype->itemsize != b.dtype->itemsize) return a.dtype->itemsize > b.dtype->itemsize;
    return *a.name < *b.name;
  });
  std::string header;
  try {
    header = BuildHeader(order, metadata);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot encode header (tensor names and metadata must be valid "
                           "UTF-8): ",
                     e.what()));
  }
  ROLL_ASSIGN_OR_RETURN(common_internal::AtomicFileWriter writer,
                        common_internal::AtomicFileWriter::Create(path));
  ROLL_RETURN_IF_ERROR(writer.Append(header));
  for (const PlannedTensor& p : order) {
    if (p.nbytes == 0) continue;
    ROLL_ASSIGN_OR_RETURN(
        at::Tensor cpu,
        CatchTorch(absl::StrCat(path, ": tensor ", Quote(*p.name)),
                   [&]() -> absl::StatusOr<at::Tensor> {
                     return p.tensor->detach().to(torch::kCPU).contiguous();
                   }));
    absl::Status s = writer.Append(cpu.data_ptr(), p.nbytes);
    if (!s.ok()) return Annotate(s, absl::StrCat("writing tensor ", Quote(*p.name)));
  }
  return writer.Commit();
}

absl::StatusOr<std::vector<PlannedTensor>> PlanAll(const std::string& path,
                                                   const std::map<std::string, at::Tensor>& tensors) {
  std::vector<PlannedTensor> plan;
  plan.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    ROLL_ASSIGN_OR_RETURN(PlannedTensor p, PlanTensor(path, name, t));
    plan.push_back(p);
  }
  return plan;
}

void RemoveIfExists(const fs::path& p) {
  std::error_code ec;
  fs::remove(p, ec);
}

// Removes shards of an earlier save that the new layout does not use.
void RemoveStaleShards(const fs::path& dir, const std::set<std::string>& keep) {
  static const std::regex kShardName(R"(model-\d{5}-of-\d{5}\.safetensors)");
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (keep.count(name) == 0 && std::regex_match(name, kShardName)) RemoveIfExists(entry.path());
  }
}

}  // namespace

absl::Status SaveSafetensors(const std::string& path,
                             const std::map<std::string, at::Tensor>& tensors,
                             const std::map<std::string, std::string>& metadata) {
  ROLL_ASSIGN_OR_RETURN(std::vector<PlannedTensor> plan, PlanAll(path, tensors));
  return WriteFile(path, std::move(plan), metadata);
}

absl::Status SaveSharded(const std::string& dir, const std::map<std::string, at::Tensor>& tensors,
                         uint64_t max_shard_bytes,
                         const std::map<std::string, std::string>& metadata) {
  if (max_shard_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(dir, ": max_shard_bytes must be positive"));
  }
  ROLL_ASSIGN_OR_RETURN(std::vector<PlannedTensor> plan, PlanAll(dir, tensors));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat(dir, ": cannot create directory: ", ec.message()));
  }

  std::vector<std::vector<PlannedTensor>> shards;
  uint64_t current = 0;
  uint64_t total = 0;
  for (const PlannedTensor& p : plan) {
    if (shards.empty() || (current > 0 && current + p.nbytes > max_shard_bytes)) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(p);
    current += p.nbytes;
    total += p.nbytes;
  }
  const fs::path root(dir);
  if (shards.size() <= 1) {
    ROLL_RETURN_IF_ERROR(WriteFile((root / kSafetensorsSingleFile).string(),
                                   shards.empty() ? std::vector<PlannedTensor>{} : shards[0],
                                   metadata));
    RemoveIfExists(root / kSafetensorsIndexFile);
    RemoveStaleShards(root, {});
    return absl::OkStatus();
  }

  json weight_map = json::object();
  std::set<std::string> written;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name =
        absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, shards.size());
    ROLL_RETURN_IF_ERROR(WriteFile((root / name).string(), shards[i], metadata));
    for (const PlannedTensor& p : shards[i]) weight_map[*p.name] = name;
    written.insert(name);
  }
  json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  for (const auto& [k, v] : metadata) {
    if (k != "total_size") index["metadata"][k] = v;
  }
  ROLL_RETURN_IF_ERROR(common_internal::WriteFileAtomically(
      (root / kSafetensorsIndexFile).string(), index.dump(2) + "\n"));
  RemoveIfExists(root / kSafetensorsSingleFile);
  RemoveStaleShards(root, written);
  return absl::OkStatus();
}

}  // namespace roll
