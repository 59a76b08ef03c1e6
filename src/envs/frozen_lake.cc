// FrozenLake: an n x n grid, start at the top left, goal at the bottom
// right, holes elsewhere; a map is drawn from the reset seed until a path
// from start to goal exists. Actions: Left, Down, Right, Up. On slippery
// ice a move goes the intended way or to either side of it, one third each
// (drawn from the same seeded generator, so an episode replays exactly).

#include <algorithm>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "envs/env_options.h"

namespace roll::envs_internal {
namespace {

constexpr const char* kLakeActionNames[] = {"left", "down", "right", "up"};
constexpr int kLakeDr[] = {0, 1, 0, -1};
constexpr int kLakeDc[] = {-1, 0, 1, 0};

class FrozenLake : public Environment {
 public:
  FrozenLake(int size, double frozen_p, bool slippery, int max_steps, double format_penalty)
      : n_(size), frozen_p_(frozen_p), slippery_(slippery), max_steps_(max_steps), format_penalty_(format_penalty) {}

  absl::StatusOr<std::string> Reset(uint64_t seed) override {
    rng_.seed(seed);
    started_ = false;
    // Large lakes with many holes seldom have a path (below p ~ 0.6 almost
    // never): give up rather than loop.
    constexpr int kDraws = 10000;
    int draws = 0;
    do {
      if (++draws > kDraws) {
        return absl::InvalidArgumentError(absl::StrCat("frozen_lake: no map of size ", n_, " with p=", frozen_p_,
                                                       " had a path to the goal in ", kDraws,
                                                       " draws (seed ", seed, "); raise p or lower size"));
      }
      map_.assign(n_ * n_, '_');
      for (char& c : map_) c = Uniform() < frozen_p_ ? '_' : 'O';
      map_[0] = '_';
      map_[n_ * n_ - 1] = 'G';
    } while (!Reachable());
    pos_ = 0;
    steps_ = 0;
    done_ = false;
    started_ = true;
    return Render();
  }

  absl::StatusOr<EnvStep> Step(std::string_view action) override {
    if (!started_) return absl::FailedPreconditionError("frozen_lake: step before reset");
    if (done_) return absl::FailedPreconditionError("frozen_lake: step after the episode is done");
    EnvStep s;
    ++steps_;
    const int a = ParseMove(action, {kLakeActionNames, kLakeActionNames + 4});
    if (a < 0) {
      s.action_valid = false;
      s.reward = format_penalty_;
    } else {
      int actual = a;
      if (slippery_) actual = (a + static_cast<int>(rng_() % 3) + 3) % 4;  // a-1, a or a+1
      const int r = std::clamp(pos_ / n_ + kLakeDr[actual], 0, n_ - 1);
      const int c = std::clamp(pos_ % n_ + kLakeDc[actual], 0, n_ - 1);
      pos_ = r * n_ + c;
      if (map_[pos_] == 'G') {
        s.success = true;
        s.reward = 1.0;
        done_ = true;
      } else if (map_[pos_] == 'O') {
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

  std::vector<std::string> Actions() const override { return {"Left", "Down", "Right", "Up"}; }

  std::string Instructions() const override {
    return absl::StrCat(
        "You are on a frozen lake, shown as a grid: P is you, G the goal, O a hole, _ frozen ice. Reach G without "
        "stepping into a hole.",
        slippery_ ? " The ice is slippery: a move may take you to either side of where you meant to go." : "",
        " Answer with one move: Left, Down, Right or Up, as <answer>Right</answer>.");
  }

 private:
  double Uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

  bool Reachable() const {
    std::vector<bool> seen(map_.size(), false);
    std::vector<int> stack = {0};
    seen[0] = true;
    while (!stack.empty()) {
      const int p = stack.back();
      stack.pop_back();
      if (map_[p] == 'G') return true;
      for (int d = 0; d < 4; ++d) {
        const int r = p / n_ + kLakeDr[d], c = p % n_ + kLakeDc[d];
        if (r < 0 || c < 0 || r >= n_ || c >= n_) continue;
        const int q = r * n_ + c;
        if (seen[q] || map_[q] == 'O') continue;
        seen[q] = true;
        stack.push_back(q);
      }
    }
    return false;
  }

  std::string Render() const {
    std::string out;
    for (int r = 0; r < n_; ++r) {
      if (r > 0) out += '\n';
      for (int c = 0; c < n_; ++c) {
        const int p = r * n_ + c;
        char ch = map_[p];
        if (p == pos_) ch = ch == 'O' ? 'X' : ch == 'G' ? '*' : 'P';
        out += ch;
      }
    }
    return out;
  }

  const int n_;
  const double frozen_p_;
  const bool slippery_;
  const int max_steps_;
  const double format_penalty_;
  std::mt19937_64 rng_;
  std::string map_;  // row-major: '_' ice, 'O' hole, 'G' goal
  int pos_ = 0;
  int steps_ = 0;
  bool done_ = false;
  bool started_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Environment>> MakeFrozenLake(EnvOptions* o) {
  ROLL_ASSIGN_OR_RETURN(const int64_t size, o->Int("size", 4, 2, 32));
  ROLL_ASSIGN_OR_RETURN(const double p, o->Double("p", 0.8, 0.5, 1.0));
  ROLL_ASSIGN_OR_RETURN(const bool slippery, o->Bool("is_slippery", false));
  ROLL_ASSIGN_OR_RETURN(const int64_t max_steps, o->Int("max_steps", 20, 1, 100000));
  ROLL_ASSIGN_OR_RETURN(const double penalty, o->Double("format_penalty", -0.1, -1.0, 0.0));
  return std::unique_ptr<Environment>(new FrozenLake(static_cast<int>(size), p, slippery,
                                                     static_cast<int>(max_steps), penalty));
}

}  // namespace roll::envs_internal
