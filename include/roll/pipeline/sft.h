#pragma once
// Supervised fine-tuning, the pipeline behind `roll sft`: trains on the
// prompts of the config's `data` section with their ground truths as the
// answers (RLVR configs, with sft.answer_noise), or on episodes of play of
// train_env_manager's environment (agentic configs, sft.expert_moves), so
// that the RL presets start from a base model that knows the task's format.
// Starts from sft.init_from, or from a fresh Qwen2-shaped model of the
// sft.* shape with a character tokenizer over the data's alphabet. Writes a
// Hugging Face directory (config.json, model.safetensors, tokenizer.json)
// to sft.output_dir, atomically.
//
// It runs in this process: one TrainStrategy (replicated, no communicator)
// with runtime.threads_per_worker LibTorch threads, or every thread of the
// node's CPU slots, and the generation engine for the greedy checks.

#include <cstdint>
#include <functional>
#include <string>

#include "roll/common/config.h"
#include "roll/common/status.h"

namespace roll {

struct SftResult {
  std::string output_dir;
  int64_t params = 0;
  int steps = 0;
  double loss_first = 0, loss_last = 0;
  // The held-out check, greedy: "val_accuracy" (the first reward domain's
  // reward on the validation prompts) or "val_valid_moves" (the share of
  // held-out episodes whose first answer the environment takes as a move).
  std::string check;
  double check_before = 0, check_after = 0;
  // The threads the placement gives the run, and the fewest it ran with
  // while other processes kept cores busy (runtime.threads_follow_load).
  int threads = 0;
  int fewest_threads = 0;
  double seconds = 0;

  // One JSON line: {"sft": "done", "output_dir": ..., "params": ...,
  // "<check>_before": ..., "<check>_after": ..., "seconds": ...}.
  std::string ToJson() const;
};

// Called every 50 steps and after the last: the step (1-based), its loss
// and learning rate.
using SftProgress = std::function<void(int step, double loss, double lr)>;

// InvalidArgument naming the key for a config that cannot be trained on
// (no output_dir, options of the other kind of config, non-ASCII data for
// a fresh character tokenizer, no training records); errors of the data,
// the model and the save otherwise.
absl::StatusOr<SftResult> RunSft(const PipelineConfig& cfg, const SftProgress& progress = {});

}  // namespace roll
