#include "roll/common/batch.h"

#include <torch/torch.h>

#include <algorithm>
#include <exception>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace roll {
namespace {

template <typename Map>
std::string KeyList(const Map& m) {
  if (m.empty()) return "none";
  std::vector<absl::string_view> keys;
  keys.reserve(m.size());
  for (const auto& [k, v] : m) keys.push_back(k);
  return absl::StrJoin(keys, ", ");
}

std::string ShapeString(const at::Tensor& t) {
  std::ostringstream os;
  os << t.sizes();
  return os.str();
}

// LibTorch reports failures as c10::Error; they must not cross the Batch API.
absl::Status FromException(absl::string_view op, const std::exception& e) {
  return absl::InternalError(absl::StrCat("batch ", op, ": ", e.what()));
}

template <typename Map>
bool SameKeys(const Map& a, const Map& b) {
  if (a.size() != b.size()) return false;
  auto it = b.begin();
  for (const auto& [k, v] : a) {
    if (k != it->first) return false;
    ++it;
  }
  return true;
}

// First key of `want` missing from `have`, or the first extra key of `have`.
template <typename Map>
std::string KeyDifference(const Map& want, const Map& have) {
  for (const auto& [k, v] : want) {
    if (have.count(k) == 0) return absl::StrCat("'", k, "' missing");
  }
  for (const auto& [k, v] : have) {
    if (want.count(k) == 0) return absl::StrCat("'", k, "' unexpected");
  }
  return "";
}

}  // namespace

int64_t Batch::size() const {
  if (!tensors_.empty()) {
    const at::Tensor& t = tensors_.begin()->second;
    // Invalid (scalar or undefined) tensors have no sample dimension;
    // Validate() reports them.
    if (!t.defined() || t.dim() == 0) return 0;
    return t.size(0);
  }
  if (!columns_.empty()) {
    return static_cast<int64_t>(columns_.begin()->second.size());
  }
  return 0;
}

absl::StatusOr<at::Tensor> Batch::Tensor(std::string_view name) const {
  auto it = tensors_.find(std::string(name));
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat("batch has no tensor '", Sv(name),
                                            "' (tensors: ", KeyList(tensors_),
                                            ")"));
  }
  return it->second;
}

absl::StatusOr<const std::vector<std::string>*> Batch::Column(
    std::string_view name) const {
  auto it = columns_.find(std::string(name));
  if (it == columns_.end()) {
    return absl::NotFoundError(absl::StrCat("batch has no column '", Sv(name),
                                            "' (columns: ", KeyList(columns_),
                                            ")"));
  }
  return &it->second;
}

std::string Batch::MetaOr(std::string_view key,
                          std::string_view fallback) const {
  auto it = meta_.find(std::string(key));
  return it == meta_.end() ? std::string(fallback) : it->second;
}

absl::Status Batch::Validate() const {
  // The reference is the first key, as in size(), so the error names the
  // entry that disagrees with what size() reports.
  std::string ref_kind;
  std::string ref_key;
  int64_t ref_size = -1;
  auto check = [&](absl::string_view kind, const std::string& key,
                   int64_t n) -> absl::Status {
    if (ref_size < 0) {
      ref_kind = std::string(kind);
      ref_key = key;
      ref_size = n;
      return absl::OkStatus();
    }
    if (n != ref_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch: ", kind, " '", key, "' has ", n, " samples but ",
                       ref_kind, " '", ref_key, "' has ", ref_size));
    }
    return absl::OkStatus();
  };
  for (const auto& [name, t] : tensors_) {
    if (!t.defined()) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch: tensor '", name, "' is undefined"));
    }
    if (t.dim() == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch: tensor '", name,
          "' is a scalar (dim 0); tensors need a sample dimension"));
    }
    ROLL_RETURN_IF_ERROR(check("tensor", name, t.size(0)));
  }
  for (const auto& [name, col] : columns_) {
    ROLL_RETURN_IF_ERROR(
        check("column", name, static_cast<int64_t>(col.size())));
  }
  return absl::OkStatus();
}

absl::StatusOr<Batch> Batch::Slice(int64_t begin, int64_t end) const {
  ROLL_RETURN_IF_ERROR(Annotate(Validate(), "Slice"));
  const int64_t n = size();
  if (begin < 0 || end < begin || end > n) {
    return absl::OutOfRangeError(absl::StrCat("batch Slice [", begin, ", ", end,
                                              ") is outside [0, ", n, ")"));
  }
  Batch out;
  out.meta_ = meta_;
  try {
    for (const auto& [name, t] : tensors_) {
      out.tensors_.emplace(name, t.narrow(0, begin, end - begin));
    }
  } catch (const std::exception& e) {
    return FromException("Slice", e);
  }
  for (const auto& [name, col] : columns_) {
    out.columns_.emplace(
        name, std::vector<std::string>(col.begin() + begin, col.begin() + end));
  }
  return out;
}

absl::StatusOr<std::vector<Batch>> Batch::Chunk(int n) const {
  if (n <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch Chunk: number of pieces must be positive, got ", n));
  }
  ROLL_RETURN_IF_ERROR(Annotate(Validate(), "Chunk"));
  const int64_t total = size();
  const int64_t base = total / n;
  const int64_t extra = total % n;
  std::vector<Batch> pieces;
  pieces.reserve(n);
  int64_t begin = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t len = base + (i < extra ? 1 : 0);
    ROLL_ASSIGN_OR_RETURN(Batch piece, Slice(begin, begin + len));
    pieces.push_back(std::move(piece));
    begin += len;
  }
  return pieces;
}

absl::StatusOr<Batch> Batch::Concat(const std::vector<Batch>& parts) {
  if (parts.empty()) return Batch();
  const Batch& first = parts.front();
  for (size_t i = 0; i < parts.size(); ++i) {
    const Batch& p = parts[i];
    ROLL_RETURN_IF_ERROR(
        Annotate(p.Validate(), absl::StrCat("Concat part ", i)));
    if (!SameKeys(first.tensors_, p.tensors_)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch Concat: part ", i, " has different tensor keys than part 0: ",
          KeyDifference(first.tensors_, p.tensors_)));
    }
    if (!SameKeys(first.columns_, p.columns_)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch Concat: part ", i, " has different column keys than part 0: ",
          KeyDifference(first.columns_, p.columns_)));
    }
    for (const auto& [name, t] : p.tensors_) {
      const at::Tensor& t0 = first.tensors_.at(name);
      if (t.scalar_type() != t0.scalar_type()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "batch Concat: tensor '", name, "' is ",
            c10::toString(t.scalar_type()), " in part ", i, " but ",
            c10::toString(t0.scalar_type()), " in part 0"));
      }
      if (t.device() != t0.device()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "batch Concat: tensor '", name, "' is on ", t.device().str(),
            " in part ", i, " but on ", t0.device().str(), " in part 0"));
      }
      if (t.dim() != t0.dim() || t.sizes().slice(1) != t0.sizes().slice(1)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "batch Concat: tensor '", name, "' has shape ", ShapeString(t),
            " in part ", i, " but ", ShapeString(t0),
            " in part 0; trailing dimensions must match"));
      }
    }
  }

  Batch out;
  out.meta_ = first.meta_;
  try {
    std::vector<at::Tensor> pieces;
    pieces.reserve(parts.size());
    for (const auto& [name, t0] : first.tensors_) {
      pieces.clear();
      for (const Batch& p : parts) pieces.push_back(p.tensors_.at(name));
      out.tensors_.emplace(name, at::cat(pieces, 0));
    }
  } catch (const std::exception& e) {
    return FromException("Concat", e);
  }
  for (const auto& [name, c0] : first.columns_) {
    size_t total = 0;
    for (const Batch& p : parts) total += p.columns_.at(name).size();
    std::vector<std::string> col;
    col.reserve(total);
    for (const Batch& p : parts) {
      const auto& src = p.columns_.at(name);
      col.insert(col.end(), src.begin(), src.end());
    }
    out.columns_.emplace(name, std::move(col));
  }
  return out;
}

absl::StatusOr<Batch> Batch::Select(const std::vector<int64_t>& indices) const {
  ROLL_RETURN_IF_ERROR(Annotate(Validate(), "Select"));
  const int64_t n = size();
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] < 0 || indices[i] >= n) {
      return absl::OutOfRangeError(absl::StrCat("batch Select: index ",
                                                indices[i], " at position ", i,
                                                " is outside [0, ", n, ")"));
    }
  }
  Batch out;
  out.meta_ = meta_;
  try {
    const at::Tensor index =
        at::from_blob(const_cast<int64_t*>(indices.data()),
                      {static_cast<int64_t>(indices.size())}, at::kLong)
            .clone();
    for (const auto& [name, t] : tensors_) {
      out.tensors_.emplace(name, t.index_select(0, index.to(t.device())));
    }
  } catch (const std::exception& e) {
    return FromException("Select", e);
  }
  for (const auto& [name, col] : columns_) {
    std::vector<std::string> picked;
    picked.reserve(indices.size());
    for (int64_t i : indices) picked.push_back(col[i]);
    out.columns_.emplace(name, std::move(picked));
  }
  return out;
}

absl::Status Batch::Union(const Batch& other) {
  ROLL_RETURN_IF_ERROR(Annotate(Validate(), "Union (this)"));
  ROLL_RETURN_IF_ERROR(Annotate(other.Validate(), "Union (other)"));
  // A batch without per-sample keys has no sample count to disagree with
  // (e.g. a fresh Batch that only carries meta).
  const bool this_has_samples = !tensors_.empty() || !columns_.empty();
  const bool other_has_samples =
      !other.tensors_.empty() || !other.columns_.empty();
  if (this_has_samples && other_has_samples && size() != other.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch Union: sizes differ: ", size(), " vs ", other.size()));
  }
  // Check every conflict before changing anything, so a failed Union leaves
  // this batch as it was.
  try {
    for (const auto& [name, t] : other.tensors_) {
      auto it = tensors_.find(name);
      if (it == tensors_.end()) continue;
      const at::Tensor& mine = it->second;
      const bool equal = mine.scalar_type() == t.scalar_type() &&
                         mine.sizes() == t.sizes() &&
                         at::equal(mine, t.to(mine.device()));
      if (!equal) {
        return absl::InvalidArgumentError(absl::StrCat(
            "batch Union: tensor '", name, "' exists in both with different ",
            "values (", c10::toString(mine.scalar_type()), ShapeString(mine),
            " vs ", c10::toString(t.scalar_type()), ShapeString(t), ")"));
      }
    }
  } catch (const std::exception& e) {
    return FromException("Union", e);
  }
  for (const auto& [name, col] : other.columns_) {
    auto it = columns_.find(name);
    if (it != columns_.end() && it->second != col) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch Union: column '", name,
                       "' exists in both with different values"));
    }
  }
  for (const auto& [key, value] : other.meta_) {
    auto it = meta_.find(key);
    if (it != meta_.end() && it->second != value) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch Union: meta '", key, "' exists in both with ",
          "different values ('", it->second, "' vs '", value, "')"));
    }
  }
  for (const auto& [name, t] : other.tensors_) tensors_.emplace(name, t);
  for (const auto& [name, col] : other.columns_) columns_.emplace(name, col);
  for (const auto& [key, value] : other.meta_) meta_.emplace(key, value);
  return absl::OkStatus();
}

Batch Batch::Repeat(int times, bool interleave) const {
  // Repeat cannot fail for a valid batch; times <= 0 yields zero samples
  // with the same keys.
  const int64_t reps = std::max(times, 0);
  Batch out;
  out.meta_ = meta_;
  for (const auto& [name, t] : tensors_) {
    if (!t.defined() || t.dim() == 0) {
      // No sample dimension to repeat along; keep it so Validate() on the
      // result reports the same problem as on the input.
      out.tensors_.emplace(name, t);
      continue;
    }
    if (interleave) {
      out.tensors_.emplace(name, t.repeat_interleave(reps, 0));
    } else {
      std::vector<int64_t> factors(t.dim(), 1);
      factors[0] = reps;
      out.tensors_.emplace(name, t.repeat(factors));
    }
  }
  for (const auto& [name, col] : columns_) {
    std::vector<std::string> rep;
    rep.reserve(col.size() * reps);
    if (interleave) {
      for (const auto& s : col) {
        for (int64_t r = 0; r < reps; ++r) rep.push_back(s);
      }
    } else {
      for (int64_t r = 0; r < reps; ++r)
        rep.insert(rep.end(), col.begin(), col.end());
    }
    out.columns_.emplace(name, std::move(rep));
  }
  return out;
}

}  // namespace roll
