// Wire encoding of a Batch. Every RPC carries one, so decoding does one
// allocation and one memcpy per tensor and no per-element work (bool
// tensors excepted, whose bytes must be checked to be 0 or 1).
//
// Layout, all integers little-endian:
//   magic    4 bytes  "RBT1"
//   version  u16      kVersion
//   reserved u16      0
//   u32 tensor count, then per tensor (names in key order):
//     u32 name length, name bytes
//     u8  dtype code (kDtypes below; 0 = a dtype the format cannot carry)
//     u8  ndim, then ndim x i64 dims
//     u64 byte length (= numel * element size), then the raw bytes of the
//         contiguous tensor
//   u32 column count, then per column:
//     u32 name length, name bytes, u64 row count, per row u32 length + bytes
//   u32 meta count, then per entry: u32 key length, key, u32 value length,
//     value
// Nothing may follow the last meta entry.

#include <torch/torch.h>

#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "roll/common/batch.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error \
    "batch_codec.cc copies tensor bytes verbatim and assumes a little-endian host"
#endif

namespace roll {
namespace {

constexpr char kMagic[4] = {'R', 'B', 'T', '1'};
constexpr uint16_t kVersion = 1;
// Limits that keep a hostile header from making the decoder loop or
// allocate far beyond the size of its input.
constexpr uint32_t kMaxEntries = 1u << 16;  // tensors, columns, meta each
constexpr uint32_t kMaxNameBytes = 4096;
constexpr uint8_t kMaxDims = 16;

struct DtypeCode {
  uint8_t code;
  at::ScalarType type;
};
// Codes are part of the wire format: never renumber, only append.
constexpr DtypeCode kDtypes[] = {
    {1, at::kFloat}, {2, at::kDouble}, {3, at::kHalf},  {4, at::kBFloat16},
    {5, at::kLong},  {6, at::kInt},    {7, at::kShort}, {8, at::kChar},
    {9, at::kByte},  {10, at::kBool},
};
constexpr uint8_t kUnsupportedDtype = 0;

uint8_t CodeOf(at::ScalarType t) {
  for (const auto& d : kDtypes) {
    if (d.type == t) return d.code;
  }
  return kUnsupportedDtype;
}

bool TypeOf(uint8_t code, at::ScalarType* t) {
  for (const auto& d : kDtypes) {
    if (d.code == code) {
      *t = d.type;
      return true;
    }
  }
  return false;
}

// ---- encoding ----

template <typename T>
void Put(std::string* out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));
  out->append(buf, sizeof(T));
}

void PutString32(std::string* out, std::string_view s) {
  Put<uint32_t>(out, static_cast<uint32_t>(s.size()));
  out->append(s.data(), s.size());
}

// What goes on the wire for one tensor: contiguous CPU data, or nothing for
// tensors the format cannot carry (the decoder rejects their dtype code).
struct WireTensor {
  uint8_t code = kUnsupportedDtype;
  std::vector<int64_t> dims;
  at::Tensor data;  // undefined when code == kUnsupportedDtype
  size_t nbytes = 0;
};

WireTensor Prepare(const at::Tensor& t) {
  WireTensor w;
  if (!t.defined()) return w;
  w.dims.assign(t.sizes().begin(), t.sizes().end());
  w.code = CodeOf(t.scalar_type());
  if (w.code == kUnsupportedDtype) return w;
  at::Tensor c = t;
  if (!c.device().is_cpu()) c = c.to(at::kCPU);
  c = c.contiguous();
  w.nbytes = c.numel() * c.element_size();
  w.data = std::move(c);
  return w;
}

// ---- decoding ----

// Names come from the wire; escape them so an error message stays printable.
std::string Quoted(std::string_view name) {
  return absl::StrCat("'", absl::CHexEscape(Sv(name)), "'");
}

class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}

  size_t remaining() const { return bytes_.size() - pos_; }
  size_t pos() const { return pos_; }

  absl::Status Need(size_t n, absl::string_view what) const {
    if (n > remaining()) {
      return absl::InvalidArgumentError(
          absl::StrCat("truncated: ", what, " needs ", n, " bytes at offset ",
                       pos_, ", only ", remaining(), " left"));
    }
    return absl::OkStatus();
  }

  template <typename T>
  absl::Status Read(T* v, absl::string_view what) {
    ROLL_RETURN_IF_ERROR(Need(sizeof(T), what));
    std::memcpy(v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::Status Bytes(size_t n, absl::string_view what, std::string_view* out) {
    ROLL_RETURN_IF_ERROR(Need(n, what));
    *out = bytes_.substr(pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }

  // u32 length-prefixed string of at most `max` bytes.
  absl::Status String32(absl::string_view what, uint32_t max,
                        std::string_view* out) {
    uint32_t len = 0;
    ROLL_RETURN_IF_ERROR(Read(&len, absl::StrCat(what, " length")));
    if (len > max) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " length ", len, " exceeds the limit of ", max, " bytes"));
    }
    return Bytes(len, what, out);
  }

  // An entry count, bounded both by a fixed cap and by the bytes left (each
  // entry needs at least `min_entry_bytes`), so a forged count fails here
  // instead of driving a long loop or a huge reserve().
  absl::Status Count(absl::string_view what, absl::string_view plural,
                     uint32_t max, size_t min_entry_bytes, uint32_t* out) {
    ROLL_RETURN_IF_ERROR(Read(out, absl::StrCat(what, " count")));
    if (*out > max) {
      return absl::InvalidArgumentError(
          absl::StrCat("too many ", plural, ": ", *out, " (limit ", max, ")"));
    }
    if (static_cast<uint64_t>(*out) * min_entry_bytes > remaining()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " count ", *out, " cannot fit in the ",
                       remaining(), " bytes left"));
    }
    return absl::OkStatus();
  }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
};

absl::Status DecodeTensor(Reader& r, at::Tensor* out) {
  uint8_t code = 0;
  ROLL_RETURN_IF_ERROR(r.Read(&code, "dtype code"));
  at::ScalarType type;
  if (!TypeOf(code, &type)) {
    return absl::InvalidArgumentError(
        code == kUnsupportedDtype
            ? std::string("the sender's tensor was undefined or had a dtype "
                          "the wire format cannot carry")
            : absl::StrCat("unknown dtype code ", code));
  }
  uint8_t ndim = 0;
  ROLL_RETURN_IF_ERROR(r.Read(&ndim, "ndim"));
  if (ndim > kMaxDims) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ndim ", int{ndim}, " exceeds the limit of ", int{kMaxDims}));
  }
  const int64_t elem = static_cast<int64_t>(c10::elementSize(type));
  std::vector<int64_t> dims(ndim);
  // `bound` multiplies max(dim, 1) so that a zero dimension cannot hide an
  // overflowing neighbour; it is what LibTorch will compute strides from.
  int64_t bound = elem;
  int64_t expected = elem;
  for (uint8_t i = 0; i < ndim; ++i) {
    ROLL_RETURN_IF_ERROR(r.Read(&dims[i], "dims"));
    if (dims[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("negative dim ", dims[i], " at axis ", int{i}));
    }
    const int64_t d = std::max<int64_t>(dims[i], 1);
    if (bound > std::numeric_limits<int64_t>::max() / d) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape overflows: dim ", dims[i], " at axis ", int{i}));
    }
    bound *= d;
    expected *= dims[i];
  }
  uint64_t nbytes = 0;
  ROLL_RETURN_IF_ERROR(r.Read(&nbytes, "byte length"));
  if (nbytes != static_cast<uint64_t>(expected)) {
    return absl::InvalidArgumentError(
        absl::StrCat("byte length ", nbytes, " disagrees with shape ",
                     c10::str(c10::IntArrayRef(dims)), " of ",
                     c10::toString(type), " (", expected, " bytes)"));
  }
  std::string_view payload;
  ROLL_RETURN_IF_ERROR(r.Bytes(nbytes, "tensor data", &payload));
  if (type == at::kBool) {
    // Any other byte value is undefined behaviour for LibTorch's bool
    // kernels. Branch-free so the check vectorizes.
    unsigned char stray = 0;
    for (char c : payload) stray |= static_cast<unsigned char>(c) & 0xFE;
    if (stray != 0) {
      return absl::InvalidArgumentError(
          "bool tensor holds a byte other than 0 or 1");
    }
  }
  // Allocation is bounded by the payload just checked to be present.
  at::Tensor t = at::empty(dims, at::TensorOptions().dtype(type));
  if (nbytes > 0) std::memcpy(t.data_ptr(), payload.data(), nbytes);
  *out = std::move(t);
  return absl::OkStatus();
}

absl::Status DecodeInto(Reader& r, Batch* batch) {
  std::string_view magic;
  ROLL_RETURN_IF_ERROR(r.Bytes(sizeof(kMagic), "magic", &magic));
  if (std::memcmp(magic.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("bad magic \"",
                                                   absl::CHexEscape(Sv(magic)),
                                                   "\"; not a batch encoding"));
  }
  uint16_t version = 0, reserved = 0;
  ROLL_RETURN_IF_ERROR(r.Read(&version, "version"));
  if (version != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported version ", version, " (this build reads ", kVersion, ")"));
  }
  ROLL_RETURN_IF_ERROR(r.Read(&reserved, "reserved"));

  // Minimum sizes: name length + dtype + ndim + byte length; name length +
  // row count; key length + value length.
  uint32_t count = 0;
  ROLL_RETURN_IF_ERROR(
      r.Count("tensor", "tensors", kMaxEntries, 4 + 1 + 1 + 8, &count));
  for (uint32_t i = 0; i < count; ++i) {
    std::string_view name;
    ROLL_RETURN_IF_ERROR(Annotate(r.String32("name", kMaxNameBytes, &name),
                                  absl::StrCat("tensor #", i)));
    const std::string context = absl::StrCat("tensor ", Quoted(name));
    if (batch->tensors().count(std::string(name)) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(context, ": duplicate"));
    }
    at::Tensor t;
    ROLL_RETURN_IF_ERROR(Annotate(DecodeTensor(r, &t), context));
    batch->tensors().emplace(std::string(name), std::move(t));
  }

  ROLL_RETURN_IF_ERROR(
      r.Count("column", "columns", kMaxEntries, 4 + 8, &count));
  for (uint32_t i = 0; i < count; ++i) {
    std::string_view name;
    ROLL_RETURN_IF_ERROR(Annotate(r.String32("name", kMaxNameBytes, &name),
                                  absl::StrCat("column #", i)));
    const std::string context = absl::StrCat("column ", Quoted(name));
    if (batch->columns().count(std::string(name)) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(context, ": duplicate"));
    }
    uint64_t rows = 0;
    ROLL_RETURN_IF_ERROR(Annotate(r.Read(&rows, "row count"), context));
    // Each row needs at least its 4-byte length.
    if (rows > r.remaining() / 4) {
      return absl::InvalidArgumentError(
          absl::StrCat(context, ": row count ", rows, " cannot fit in the ",
                       r.remaining(), " bytes left"));
    }
    std::vector<std::string> col;
    col.reserve(rows);
    for (uint64_t j = 0; j < rows; ++j) {
      std::string_view s;
      ROLL_RETURN_IF_ERROR(Annotate(
          r.String32("value", std::numeric_limits<uint32_t>::max(), &s),
          absl::StrCat(context, ": row ", j)));
      col.emplace_back(s);
    }
    batch->columns().emplace(std::string(name), std::move(col));
  }

  ROLL_RETURN_IF_ERROR(
      r.Count("meta entry", "meta entries", kMaxEntries, 4 + 4, &count));
  for (uint32_t i = 0; i < count; ++i) {
    std::string_view key, value;
    ROLL_RETURN_IF_ERROR(Annotate(r.String32("key", kMaxNameBytes, &key),
                                  absl::StrCat("meta entry #", i)));
    const std::string context = absl::StrCat("meta ", Quoted(key));
    if (batch->meta().count(std::string(key)) > 0) {
      return absl::InvalidArgumentError(absl::StrCat(context, ": duplicate"));
    }
    ROLL_RETURN_IF_ERROR(Annotate(
        r.String32("value", std::numeric_limits<uint32_t>::max(), &value),
        context));
    batch->meta().emplace(std::string(key), std::string(value));
  }

  if (r.remaining() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(r.remaining(), " trailing bytes after the last entry"));
  }
  return batch->Validate();
}

}  // namespace

void EncodeBatchTo(const Batch& batch, std::string* out) {
  std::vector<WireTensor> wire;
  wire.reserve(batch.tensors().size());
  size_t total = sizeof(kMagic) + 2 + 2 + 4 + 4 + 4;
  for (const auto& [name, t] : batch.tensors()) {
    wire.push_back(Prepare(t));
    total += 4 + name.size() + 1 + 1 + 8 * wire.back().dims.size() + 8 +
             wire.back().nbytes;
  }
  for (const auto& [name, col] : batch.columns()) {
    total += 4 + name.size() + 8;
    for (const auto& s : col) total += 4 + s.size();
  }
  for (const auto& [key, value] : batch.meta()) {
    total += 4 + key.size() + 4 + value.size();
  }
  out->reserve(out->size() + total);

  out->append(kMagic, sizeof(kMagic));
  Put<uint16_t>(out, kVersion);
  Put<uint16_t>(out, 0);
  Put<uint32_t>(out, static_cast<uint32_t>(batch.tensors().size()));
  size_t i = 0;
  for (const auto& [name, t] : batch.tensors()) {
    const WireTensor& w = wire[i++];
    PutString32(out, name);
    Put<uint8_t>(out, w.code);
    Put<uint8_t>(out, static_cast<uint8_t>(w.dims.size()));
    for (int64_t d : w.dims) Put<int64_t>(out, d);
    Put<uint64_t>(out, w.nbytes);
    if (w.nbytes > 0) {
      out->append(static_cast<const char*>(w.data.data_ptr()), w.nbytes);
    }
  }
  Put<uint32_t>(out, static_cast<uint32_t>(batch.columns().size()));
  for (const auto& [name, col] : batch.columns()) {
    PutString32(out, name);
    Put<uint64_t>(out, col.size());
    for (const auto& s : col) PutString32(out, s);
  }
  Put<uint32_t>(out, static_cast<uint32_t>(batch.meta().size()));
  for (const auto& [key, value] : batch.meta()) {
    PutString32(out, key);
    PutString32(out, value);
  }
}

std::string EncodeBatch(const Batch& batch) {
  std::string out;
  EncodeBatchTo(batch, &out);
  return out;
}

absl::StatusOr<Batch> DecodeBatch(std::string_view bytes) {
  Reader reader(bytes);
  Batch batch;
  absl::Status s;
  try {
    s = DecodeInto(reader, &batch);
  } catch (const std::bad_alloc&) {
    s = absl::ResourceExhaustedError("out of memory");
  } catch (const std::exception& e) {
    s = absl::InternalError(e.what());
  }
  if (!s.ok()) return Annotate(s, "batch decode");
  return batch;
}

}  // namespace roll
