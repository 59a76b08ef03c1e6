#include "roll/strategies/sharding.h"

#include <algorithm>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace roll {

std::string ShardLayout::UnitOf(const std::string& name) {
  if (name == "model.embed_tokens.weight") return "embed";
  constexpr absl::string_view kLayers = "model.layers.";
  if (absl::StartsWith(name, kLayers)) {
    const size_t dot = name.find('.', kLayers.size());
    return absl::StrCat("layers.", name.substr(kLayers.size(), dot - kLayers.size()));
  }
  return "head";
}

absl::StatusOr<ShardLayout> ShardLayout::Create(
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& params, int world_size) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("ShardLayout: world_size must be >= 1, got ", world_size));
  }
  if (params.empty()) return absl::InvalidArgumentError("ShardLayout: the model has no parameters");
  ShardLayout layout;
  layout.world_size_ = world_size;
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string unit = UnitOf(params[i].first);
    auto [it, fresh] = index.emplace(unit, layout.units_.size());
    if (fresh) {
      layout.units_.emplace_back();
      layout.units_.back().name = unit;
    } else if (it->second + 1 != layout.units_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ShardLayout: the parameters of unit '", unit, "' are not consecutive (at '", params[i].first, "')"));
    }
    ShardUnitLayout& u = layout.units_[it->second];
    int64_t n = 1;
    for (int64_t d : params[i].second) n *= d;
    u.params.push_back(i);
    u.offsets.push_back(u.numel);
    u.numels.push_back(n);
    u.numel += n;
  }
  for (ShardUnitLayout& u : layout.units_) u.shard_numel = (u.numel + world_size - 1) / world_size;
  return layout;
}

std::vector<ShardPiece> ShardLayout::Pieces(int rank) const {
  std::vector<ShardPiece> out;
  for (size_t k = 0; k < units_.size(); ++k) {
    const ShardUnitLayout& u = units_[k];
    const int64_t lo = rank * u.shard_numel, hi = std::min(lo + u.shard_numel, u.numel);
    for (size_t j = 0; j < u.params.size(); ++j) {
      const int64_t a = std::max(lo, u.offsets[j]), b = std::min(hi, u.offsets[j] + u.numels[j]);
      if (a >= b) continue;
      out.push_back(ShardPiece{k, u.params[j], a - u.offsets[j], b - a});
    }
  }
  return out;
}

int64_t ShardLayout::RealElements(size_t unit, int rank) const {
  const ShardUnitLayout& u = units_.at(unit);
  return std::max<int64_t>(0, std::min(u.shard_numel, u.numel - rank * u.shard_numel));
}

int64_t ShardLayout::ShardElements() const {
  int64_t n = 0;
  for (const ShardUnitLayout& u : units_) n += u.shard_numel;
  return n;
}

}  // namespace roll
