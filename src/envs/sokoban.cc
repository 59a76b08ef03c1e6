// Sokoban: push every box onto a target in a walled room. Levels are made by
// reverse play, so each one is solvable by construction: the room is carved
// by a random walk, the boxes start on their targets (the solved state), and
// the player then walks `search_depth` random steps backwards, pulling a box
// along when one is behind it. Undoing those steps, each a push or a plain
// move, solves the level in at most `search_depth` moves; `min_moves` redraws
// levels that fewer moves solve (a short breadth-first search). Everything is
// drawn from the reset seed; steps draw nothing, so an episode replays
// exactly from its seed and actions.

#include <algorithm>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "envs/env_options.h"

namespace roll::envs_internal {
namespace {

constexpr const char* kActionNames[] = {"up", "down", "left", "right"};
constexpr int kDr[] = {-1, 1, 0, 0};
constexpr int kDc[] = {0, 0, -1, 1};

constexpr double kStepReward = -0.1;
constexpr double kBoxOnTarget = 1.0;
constexpr double kBoxOffTarget = -1.0;
constexpr double kSolved = 10.0;

class Sokoban : public Environment {
 public:
  Sokoban(int dim, int boxes, int search_depth, int min_moves, int max_steps, double format_penalty, bool describe)
      : n_(dim),
        boxes_(boxes),
        depth_(search_depth),
        min_moves_(min_moves),
        max_steps_(max_steps),
        format_penalty_(format_penalty),
        describe_(describe) {}

  absl::StatusOr<std::string> Reset(uint64_t seed) override {
    rng_.seed(seed);
    started_ = false;
    // A small room with many boxes may leave no room to pull them apart, the
    // walk may undo its pulls, or the level may be shorter than min_moves:
    // draw again, within a budget.
    constexpr int kDraws = 1000;
    for (int draw = 0; draw < kDraws; ++draw) {
      if (DrawLevel() && !SolvableWithin(min_moves_ - 1)) {
        steps_ = 0;
        done_ = false;
        started_ = true;
        return Render();
      }
    }
    return absl::InvalidArgumentError(absl::StrCat("sokoban: no level with dim_room=", n_, ", num_boxes=", boxes_,
                                                   ", search_depth=", depth_, ", min_moves=", min_moves_, " in ", kDraws,
                                                   " draws (seed ", seed,
                                                   "); raise dim_room or search_depth, or lower num_boxes or min_moves"));
  }

  absl::StatusOr<EnvStep> Step(std::string_view action) override {
    if (!started_) return absl::FailedPreconditionError("sokoban: step before reset");
    if (done_) return absl::FailedPreconditionError("sokoban: step after the episode is done");
    EnvStep s;
    ++steps_;
    const int a = ParseMove(action, {kActionNames, kActionNames + 4});
    if (a < 0) {
      s.action_valid = false;
      s.reward = format_penalty_;
    } else {
      s.reward = kStepReward + Push(a);
      if (Solved()) {
        s.reward += kSolved;
        s.success = true;
        done_ = true;
      }
    }
    if (!done_ && steps_ >= max_steps_) {
      s.truncated = true;
      done_ = true;
    }
    s.done = done_;
    s.observation = Render();
    return s;
  }

  std::vector<std::string> Actions() const override { return {"Up", "Down", "Left", "Right"}; }

  std::string Instructions() const override {
    return "You are in a Sokoban room, shown as a grid: # wall, _ floor, O target, X box, * box on a target, P you, "
           "S you on a target. Push every box onto a target: you push a box by walking into it, when the cell "
           "behind it is free; you cannot pull. Each step costs 0.1; a box onto a target gives 1, off a target "
           "costs 1, and solving the room gives 10. Answer with one move: Up, Down, Left or Right, as "
           "<answer>Up</answer>." +
           std::string(describe_ ? " Below the grid, each box not on a target and each free target is listed "
                                   "by its offset from you: rows down (negative: up), columns right (negative: left)."
                                 : "");
  }

 private:
  bool Floor(int p) const { return room_[p] != '#'; }
  bool HasBox(int p) const { return box_[p]; }
  int Next(int p, int d) const {
    const int r = p / n_ + kDr[d], c = p % n_ + kDc[d];
    if (r < 0 || c < 0 || r >= n_ || c >= n_) return -1;
    return r * n_ + c;
  }
  bool Free(int p) const { return p >= 0 && Floor(p) && !HasBox(p); }

  bool Solved() const {
    for (size_t p = 0; p < room_.size(); ++p) {
      if (box_[p] && room_[p] != 'O') return false;
    }
    return true;
  }

  // Walks (and pushes) in direction d; the reward of what the box did.
  double Push(int d) {
    const int to = Next(player_, d);
    if (to < 0 || !Floor(to)) return 0.0;
    if (!HasBox(to)) {
      player_ = to;
      return 0.0;
    }
    const int beyond = Next(to, d);
    if (!Free(beyond)) return 0.0;
    box_[to] = false;
    box_[beyond] = true;
    player_ = to;
    const bool was = room_[to] == 'O', is = room_[beyond] == 'O';
    return was == is ? 0.0 : is ? kBoxOnTarget : kBoxOffTarget;
  }

  // Whether some sequence of at most `moves` moves solves the current level:
  // breadth-first over (player, boxes) states, at most 4^moves of them.
  // Leaves the level as it was.
  bool SolvableWithin(int moves) {
    if (Solved()) return true;
    const int start_player = player_;
    const std::vector<bool> start_boxes = box_;
    auto key = [&] { return std::make_pair(player_, box_); };
    std::set<std::pair<int, std::vector<bool>>> seen{key()};
    std::vector<std::pair<int, std::vector<bool>>> layer{key()};
    bool found = false;
    for (int depth = 0; depth < moves && !found && !layer.empty(); ++depth) {
      std::vector<std::pair<int, std::vector<bool>>> next;
      for (const auto& [p, boxes] : layer) {
        for (int d = 0; d < 4 && !found; ++d) {
          player_ = p;
          box_ = boxes;
          Push(d);
          found = Solved();
          if (seen.insert(key()).second) next.push_back(key());
        }
      }
      layer = std::move(next);
    }
    player_ = start_player;
    box_ = start_boxes;
    return found;
  }

  // One level: carve, place the solved state, play backwards. False when the
  // result is not a usable level.
  bool DrawLevel() {
    room_.assign(n_ * n_, '#');
    box_.assign(n_ * n_, false);
    // Carve the interior by a random walk that turns now and then.
    std::uniform_int_distribution<int> inner(1, n_ - 2);
    int r = inner(rng_), c = inner(rng_), d = static_cast<int>(rng_() % 4);
    const int walk = static_cast<int>(1.5 * (n_ - 2) * (n_ - 2));
    // Each step carves one of a few small shapes at the walker (a cell, a
    // pair, an L, a square), so rooms get open areas, not only corridors.
    static constexpr int kShapes[5][4][2] = {{{0, 0}, {0, 0}, {0, 0}, {0, 0}},
                                             {{0, 0}, {0, 1}, {0, 1}, {0, 1}},
                                             {{0, 0}, {1, 0}, {1, 0}, {1, 0}},
                                             {{0, 0}, {0, 1}, {1, 0}, {1, 0}},
                                             {{0, 0}, {0, 1}, {1, 0}, {1, 1}}};
    for (int i = 0; i < walk; ++i) {
      for (const auto& [dr, dc] : kShapes[rng_() % 5]) {
        const int rr = std::min(r + dr, n_ - 2), cc = std::min(c + dc, n_ - 2);
        room_[rr * n_ + cc] = '_';
      }
      if (rng_() % 100 < 35) d = static_cast<int>(rng_() % 4);
      const int nr = r + kDr[d], nc = c + kDc[d];
      if (nr >= 1 && nc >= 1 && nr <= n_ - 2 && nc <= n_ - 2) {
        r = nr;
        c = nc;
      }
    }
    std::vector<int> floor;
    for (int p = 0; p < n_ * n_; ++p) {
      if (room_[p] == '_') floor.push_back(p);
    }
    if (static_cast<int>(floor.size()) < boxes_ + 2) return false;
    std::shuffle(floor.begin(), floor.end(), rng_);
    for (int b = 0; b < boxes_; ++b) {
      room_[floor[b]] = 'O';
      box_[floor[b]] = true;
    }
    player_ = floor[boxes_];
    // Reverse play: a step into a free cell, pulling the box behind along.
    for (int i = 0; i < depth_; ++i) {
      const int dir = static_cast<int>(rng_() % 4);
      const int to = Next(player_, dir);
      if (!Free(to)) continue;
      const int behind = Next(player_, dir ^ 1);  // the opposite direction
      const bool pull = behind >= 0 && HasBox(behind) && rng_() % 100 < 80;
      if (pull) {
        box_[behind] = false;
        box_[player_] = true;
      }
      player_ = to;
    }
    return !Solved();
  }

  std::string Render() const {
    std::string out = Grid();
    if (!describe_) return out;
    // Offsets from the player: "box +1 -2" is one row down, two columns left.
    const int pr = player_ / n_, pc = player_ % n_;
    auto offset = [&](const char* what, int p) {
      absl::StrAppend(&out, "\n", what, " ", p / n_ - pr >= 0 ? "+" : "", p / n_ - pr, " ", p % n_ - pc >= 0 ? "+" : "",
                      p % n_ - pc);
    };
    for (int p = 0; p < n_ * n_; ++p) {
      if (box_[p] && room_[p] != 'O') offset("box", p);
    }
    for (int p = 0; p < n_ * n_; ++p) {
      if (room_[p] == 'O' && !box_[p]) offset("target", p);
    }
    return out;
  }

  std::string Grid() const {
    std::string out;
    for (int r = 0; r < n_; ++r) {
      if (r > 0) out += '\n';
      for (int c = 0; c < n_; ++c) {
        const int p = r * n_ + c;
        const bool target = room_[p] == 'O';
        if (p == player_) {
          out += target ? 'S' : 'P';
        } else if (box_[p]) {
          out += target ? '*' : 'X';
        } else {
          out += room_[p];
        }
      }
    }
    return out;
  }

  const int n_;
  const int boxes_;
  const int depth_;
  const int min_moves_;
  const int max_steps_;
  const double format_penalty_;
  const bool describe_;
  std::mt19937_64 rng_;
  std::string room_;       // row-major: '#' wall, '_' floor, 'O' target
  std::vector<bool> box_;  // a box on the cell
  int player_ = 0;
  int steps_ = 0;
  bool done_ = false;
  bool started_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Environment>> MakeSokoban(EnvOptions* o) {
  ROLL_ASSIGN_OR_RETURN(const int64_t dim, o->Int("dim_room", 6, 5, 16));
  ROLL_ASSIGN_OR_RETURN(const int64_t boxes, o->Int("num_boxes", 1, 1, 4));
  ROLL_ASSIGN_OR_RETURN(const int64_t depth, o->Int("search_depth", 30, 1, 1000));
  ROLL_ASSIGN_OR_RETURN(const int64_t min_moves, o->Int("min_moves", 1, 1, 10));
  if (min_moves > depth) {
    return absl::InvalidArgumentError(absl::StrCat("sokoban: min_moves=", min_moves, " exceeds search_depth=", depth,
                                                   ": reverse play of ", depth, " steps makes no level that long"));
  }
  ROLL_ASSIGN_OR_RETURN(const int64_t max_steps, o->Int("max_steps", 100, 1, 100000));
  ROLL_ASSIGN_OR_RETURN(const double penalty, o->Double("format_penalty", -0.1, -1.0, 0.0));
  ROLL_ASSIGN_OR_RETURN(const bool describe, o->Bool("describe", false));
  return std::unique_ptr<Environment>(new Sokoban(static_cast<int>(dim), static_cast<int>(boxes),
                                                  static_cast<int>(depth), static_cast<int>(min_moves),
                                                  static_cast<int>(max_steps), penalty,
                                                  describe));
}

}  // namespace roll::envs_internal
