#pragma once
// ShardLayout: how fully sharded training (TrainStrategyOptions::
// fully_sharded, docs/parallelism.md) cuts a model's parameters across N
// ranks. Parameters are grouped into units -- "embed" (the input
// embeddings), "layers.<i>" (one decoder layer each) and "head" (final norm,
// LM head, value head) -- in the model's parameter order. Each unit is
// flattened in that order, padded to a multiple of N, and cut into N equal
// shards: rank r holds elements [r * shard_numel, (r + 1) * shard_numel) of
// every unit.
//
// Both sides of a sharded model update compute the same layout from the
// model's parameter names and shapes: a trainer rank sends the real part of
// each of its unit shards as one transfer, and a generator receives it
// straight into the run of parameters it covers (Pieces() says where).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "roll/common/status.h"

namespace roll {

struct ShardUnitLayout {
  std::string name;                       // "embed", "layers.<i>", "head"
  std::vector<size_t> params;             // indices into the model's parameter list
  std::vector<int64_t> offsets;           // each parameter's first element in the unit's flat
  std::vector<int64_t> numels;            // each parameter's element count
  int64_t numel = 0;                      // real elements (without padding)
  int64_t shard_numel = 0;                // ceil(numel / world_size)
};

// A contiguous run of one parameter inside one rank's shard of one unit.
struct ShardPiece {
  size_t unit = 0;          // index into ShardLayout::units
  size_t param = 0;         // index into the model's parameter list
  int64_t param_offset = 0; // first element in the (flattened) parameter
  int64_t numel = 0;
};

class ShardLayout {
 public:
  // `params`: the model's parameters in order (names as CausalLM names
  // them, shapes). InvalidArgument for world_size < 1 or no parameters.
  static absl::StatusOr<ShardLayout> Create(
      const std::vector<std::pair<std::string, std::vector<int64_t>>>& params, int world_size);

  int world_size() const { return world_size_; }
  const std::vector<ShardUnitLayout>& units() const { return units_; }
  // The unit a parameter name belongs to.
  static std::string UnitOf(const std::string& param_name);
  // Rank `rank`'s real elements, unit by unit and parameter by parameter
  // (the padding at the end of the last shards is not part of any piece).
  std::vector<ShardPiece> Pieces(int rank) const;
  // Real elements of rank `rank`'s shard of unit `unit` (the shard's first
  // ones; the rest is padding).
  int64_t RealElements(size_t unit, int rank) const;
  // Elements of rank `rank`'s shards, padding included.
  int64_t ShardElements() const;

 private:
  int world_size_ = 1;
  std::vector<ShardUnitLayout> units_;
};

}  // namespace roll
