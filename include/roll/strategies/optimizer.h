#pragma once
// AdamW over named parameters, and gradient clipping by global norm.
//
// AdamW follows torch.optim.AdamW (Loshchilov & Hutter's decoupled weight
// decay) operation for operation, so updates match PyTorch's single-tensor
// implementation:
//   p   <- p * (1 - lr * wd)                  (only parameters with dim >= 2)
//   m   <- b1 * m + (1 - b1) * g
//   v   <- b2 * v + (1 - b2) * g^2
//   p   <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// with t the 1-based update count. Weight decay skips biases and norm
// weights (the 1-D parameters), as Hugging Face's Trainer does.
//
// Parameters stored in a 16-bit dtype get a float32 master copy that the
// update runs on and that is copied back to the parameter afterwards, so
// small updates are not lost to rounding. Moments are float32 always.
//
// Ownership: the optimizer holds handles aliasing the caller's parameters
// (it updates them in place) and owns its state tensors. Thread-safety:
// none; one thread at a time.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "roll/common/status.h"

namespace roll {

struct AdamWOptions {
  double beta1 = 0.9;         // default: 0.9, in [0, 1)
  double beta2 = 0.999;       // default: 0.999, in [0, 1)
  double eps = 1e-8;          // default: 1e-8, > 0
  double weight_decay = 0.0;  // default: 0, >= 0
};

class AdamW {
 public:
  // `params`: unique names, defined floating-point tensors. State is
  // allocated here (zeros), so memory use is visible up front.
  static absl::StatusOr<std::unique_ptr<AdamW>> Create(
      std::vector<std::pair<std::string, at::Tensor>> params, const AdamWOptions& options);

  // A parameter with its weight-decay ranges given explicitly: element
  // ranges [begin, end) of the flattened tensor that decay. Sharded training
  // updates flat shards that hold weight matrices and norm weights side by
  // side; Create above gives a parameter one range over all of it when its
  // dim >= 2, none otherwise.
  struct Param {
    std::string name;
    at::Tensor tensor;  // contiguous
    std::vector<std::pair<int64_t, int64_t>> decay_ranges;
  };
  static absl::StatusOr<std::unique_ptr<AdamW>> CreateWithDecayRanges(std::vector<Param> params,
                                                                      const AdamWOptions& options);

  // One update with learning rate `lr` from each parameter's .grad().
  // Parameters without a gradient are left untouched (their moments too);
  // the bias correction uses the optimizer's update count for every
  // parameter. Runs without recording autograd history.
  absl::Status Step(double lr);

  // Number of updates taken.
  int64_t step() const { return step_; }
  const AdamWOptions& options() const { return options_; }

  // The state as named tensors: "exp_avg/<param>", "exp_avg_sq/<param>"
  // and, for 16-bit parameters, "master/<param>". Aliases the live state.
  std::map<std::string, at::Tensor> StateDict() const;
  // Restores a StateDict() (copying into the live state) and the update
  // count. Every expected tensor must be present with the expected shape and
  // no other tensor may be present; errors name `source` (e.g. the file) and
  // the tensor.
  absl::Status LoadStateDict(const std::map<std::string, at::Tensor>& state, int64_t step,
                             const std::string& source);

 private:
  struct Slot {
    std::string name;
    at::Tensor param;
    at::Tensor exp_avg, exp_avg_sq;  // float32, shaped like param
    at::Tensor master;               // float32 copy for 16-bit params; else undefined
    std::vector<std::pair<int64_t, int64_t>> decay_ranges;
  };
  AdamW(std::vector<Slot> slots, const AdamWOptions& options)
      : slots_(std::move(slots)), options_(options) {}

  std::vector<Slot> slots_;
  AdamWOptions options_;
  int64_t step_ = 0;
};

// The global L2 norm of the gradients of `params` (accumulated in float32;
// parameters without a gradient count as zero), returned before clipping.
// When max_norm > 0 and c = max_norm / (norm + 1e-6) is below 1, every
// gradient is scaled in place by c, as torch.nn.utils.clip_grad_norm_ does.
// A non-finite norm leaves the gradients untouched.
double ClipGradNorm(const std::vector<at::Tensor>& params, double max_norm);

}  // namespace roll
