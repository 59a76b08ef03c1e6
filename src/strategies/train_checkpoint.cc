// Trainer checkpoints: TrainStrategy::Save / Load.

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <torch/torch.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>

#include <ATen/core/Generator.h>
#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_join.h"
#include "roll/models/safetensors.h"
#include "roll/models/transformer.h"
#include "roll/strategies/communicator.h"
#include "roll/strategies/train_strategy.h"
#include "strategies/parallel_mode.h"
#include "strategies/train_internal.h"

namespace roll {

using strategies_internal::kOptimizerFile;
using strategies_internal::ShapeString;
using strategies_internal::ShardFileName;
namespace {

namespace fs = std::filesystem;

constexpr char kStateFile[] = "trainer_state.json";
constexpr char kRngFile[] = "rng_state.safetensors";
constexpr char kFormat[] = "roll-trainer-state";
constexpr int kVersion = 1;

absl::Status FsyncPath(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
  if (fd < 0) return absl::InternalError(absl::StrCat(path, ": cannot open for fsync: ", strerror(errno)));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) return absl::InternalError(absl::StrCat(path, ": fsync failed: ", strerror(errno)));
  return absl::OkStatus();
}

absl::Status WriteDurably(const std::string& path, const std::string& contents) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << contents;
    out.close();
    if (!out) return absl::InternalError(absl::StrCat(path, ": write failed"));
  }
  return FsyncPath(path, false);
}

// Puts the complete directory `tmp` in place of `target` (which may exist)
// so that `target` always names one whole checkpoint.
absl::Status SwapIntoPlace(const fs::path& tmp, const fs::path& target) {
  std::error_code ec;
  if (!fs::exists(target, ec)) {
    if (::rename(tmp.c_str(), target.c_str()) != 0) {
      return absl::InternalError(absl::StrCat("rename ", tmp.string(), " -> ", target.string(),
                                              " failed: ", strerror(errno)));
    }
    return absl::OkStatus();
  }
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(tmp, ec);  // now holds the previous checkpoint
    return absl::OkStatus();
  }
  // Without RENAME_EXCHANGE: move the old one aside first; a crash in
  // between leaves both complete copies on disk.
  std::string aside = (target.parent_path() / ("." + target.filename().string() + ".old-XXXXXX")).string();
  if (::mkdtemp(aside.data()) == nullptr || ::rmdir(aside.c_str()) != 0 ||
      ::rename(target.c_str(), aside.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("cannot move ", target.string(), " aside: ", strerror(errno)));
  }
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const std::string err = strerror(errno);
    ::rename(aside.c_str(), target.c_str());
    return absl::InternalError(absl::StrCat("rename ", tmp.string(), " -> ", target.string(), " failed: ", err));
  }
  fs::remove_all(aside, ec);
  return absl::OkStatus();
}

at::Generator CpuGenerator() { return at::detail::getDefaultCPUGenerator(); }

// A fresh temporary directory beside `dir` (created with its parents) and
// the normalized target path.
absl::StatusOr<std::pair<fs::path, fs::path>> MakeTempBeside(const std::string& dir) {
  if (dir.empty()) return absl::InvalidArgumentError("Save: empty checkpoint directory");
  fs::path target(dir);
  if (target.filename().empty()) target = target.parent_path();
  fs::path parent = target.parent_path();
  if (parent.empty()) parent = ".";
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) return absl::InternalError(absl::StrCat(parent.string(), ": cannot create directory: ", ec.message()));
  if (fs::exists(target, ec) && !fs::is_directory(target, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(target.string(), ": exists and is not a directory"));
  }
  std::string tmpl = (parent / ("." + target.filename().string() + ".ckpt-XXXXXX")).string();
  if (::mkdtemp(tmpl.data()) == nullptr) {
    return absl::InternalError(absl::StrCat(tmpl, ": cannot create temporary directory: ", strerror(errno)));
  }
  return std::make_pair(fs::path(tmpl), target);
}

// Rank 0 tells the others whether the checkpoint is complete; every rank
// returns its own error or rank 0's outcome.
absl::Status ShareOutcome(Communicator& comm, const absl::Status& s, const std::string& dir) {
  at::Tensor ok = torch::tensor({s.ok() ? 1.0f : 0.0f});
  ROLL_RETURN_IF_ERROR(Annotate(comm.Broadcast(ok, 0), "saving checkpoint: broadcasting the outcome"));
  if (!s.ok()) return s;
  if (ok.item<float>() != 1.0f) {
    return absl::InternalError(absl::StrCat("saving checkpoint ", dir, " failed on rank 0"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TrainStrategy::Save(const std::string& dir) { return Save(dir, SaveOptions{}); }

absl::Status TrainStrategy::Save(const std::string& dir, const SaveOptions& model_options) {
  if (mode_->sharded_optimizer()) return SaveSharded(dir, model_options);
  absl::Status s;
  if (!distributed() || communicator_->rank() == 0) {
    try {
      // Tensor-parallel slices are joined into the whole model for it.
      s = WithFullModel([&](CausalLM&) { return SaveImpl(dir, model_options); });
    } catch (const c10::Error& e) {
      s = absl::InternalError(absl::StrCat("saving checkpoint ", dir, ": ", e.what_without_backtrace()));
    } catch (const std::exception& e) {
      s = absl::InternalError(absl::StrCat("saving checkpoint ", dir, ": ", e.what()));
    }
  }
  if (!distributed()) return s;
  return ShareOutcome(*communicator_, s, dir);
}

absl::Status TrainStrategy::SaveImpl(const std::string& dir, const SaveOptions& model_options) {
  ROLL_ASSIGN_OR_RETURN(auto paths, MakeTempBeside(dir));
  const auto& [tmp, target] = paths;
  absl::Status s = model_->SavePretrained(tmp.string(), model_options);
  if (!s.ok()) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    return s;
  }
  return FinishCheckpoint(tmp.string(), target.string());
}

// Adds the optimizer state (rank 0's shard when sharded), the rng and the
// trainer state to `tmp`, which holds the model already, and puts it in
// place of `target_dir`. Removes `tmp` on failure.
absl::Status TrainStrategy::FinishCheckpoint(const std::string& tmp_dir, const std::string& target_dir) {
  const fs::path tmp(tmp_dir), target(target_dir);
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  auto fail = [&](const absl::Status& st) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    return st;
  };
  absl::Status s;
  const nlohmann::json sharding = mode_->ShardingRecord();
  if (mode_->sharded_optimizer()) {
    // The other ranks wrote their optimizer files into `tmp` already.
    s = SaveSafetensors((tmp / ShardFileName(0, distributed() ? communicator_->world_size() : 1)).string(),
                        optimizer_->StateDict());
  } else {
    s = SaveSafetensors((tmp / kOptimizerFile).string(), mode_->OptimizerStateToSave(optimizer_->StateDict()));
  }
  if (!s.ok()) return fail(s);
  at::Tensor rng;
  {
    at::Generator gen = CpuGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    rng = gen.get_state();
  }
  s = SaveSafetensors((tmp / kRngFile).string(), {{"cpu", rng}});
  if (!s.ok()) return fail(s);

  const LrScheduleOptions& lr = schedule_.options();
  const AdamWOptions& adam = optimizer_->options();
  nlohmann::json state = {
      {"format", kFormat},
      {"version", kVersion},
      {"step", step_},
      {"world_size", distributed() ? communicator_->world_size() : 1},
      {"optimizer",
       {{"type", "adamw"},
        {"step", optimizer_->step()},
        {"beta1", adam.beta1},
        {"beta2", adam.beta2},
        {"eps", adam.eps},
        {"weight_decay", adam.weight_decay},
        {"file", kOptimizerFile}}},
      {"lr_scheduler",
       {{"type", std::string(strategies_internal::LrSchedulerTypeName(lr.type))},
        {"base_lr", lr.base_lr},
        {"warmup_steps", lr.warmup_steps},
        {"total_steps", lr.total_steps},
        {"next_lr", schedule_.LrAt(step_)}}},
      {"rng", {{"file", kRngFile}, {"tensors", {"cpu"}}}},
  };
  if (!sharding.is_null()) {
    state["optimizer"].erase("file");
    state["sharding"] = sharding;
  }
  s = WriteDurably((tmp / kStateFile).string(), state.dump(2) + "\n");
  if (!s.ok()) return fail(s);
  s = FsyncPath(tmp.string(), true);
  if (!s.ok()) return fail(s);
  s = SwapIntoPlace(tmp, target);
  if (!s.ok()) return fail(s);
  return FsyncPath(parent.string(), true);
}

// Every rank gathers the model (rank 0 writes it); rank 0 makes the
// temporary directory and sends its path; every other rank writes its
// optimizer shard there and syncs it; rank 0 adds its own shard, the rng
// and trainer state and renames the directory into place. Whatever fails
// where, every rank takes part in each collective below and returns only
// at the end, so no rank is left waiting for another.
absl::Status TrainStrategy::SaveSharded(const std::string& dir, const SaveOptions& model_options) {
  const int rank = distributed() ? communicator_->rank() : 0;
  const int world = distributed() ? communicator_->world_size() : 1;
  // A step that throws becomes this rank's status: the collectives below still run.
  auto guarded = [&dir](const std::function<absl::Status()>& step) -> absl::Status {
    try {
      return step();
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("saving checkpoint ", dir, ": ", e.what()));
    }
  };
  absl::Status s;
  fs::path tmp, target;
  // Every rank gathers the model for it; rank 0 writes it.
  ROLL_RETURN_IF_ERROR(Annotate(mode_->WithFullModel([&](CausalLM&) {
                                  if (rank != 0) return absl::OkStatus();
                                  s = guarded([&]() -> absl::Status {
                                    ROLL_ASSIGN_OR_RETURN(std::tie(tmp, target), MakeTempBeside(dir));
                                    tmp = fs::absolute(tmp);  // the other ranks may run elsewhere
                                    return model_->SavePretrained(tmp.string(), model_options);
                                  });
                                  return absl::OkStatus();
                                }),
                                absl::StrCat("saving checkpoint ", dir)));
  if (world > 1) {
    // [0] = rank 0's outcome, then its temporary path, NUL-terminated.
    constexpr int64_t kMaxPath = 4096;
    at::Tensor msg = at::zeros({kMaxPath + 1}, at::kByte);
    const std::string path = tmp.string();
    if (rank == 0) {
      if (s.ok() && static_cast<int64_t>(path.size()) >= kMaxPath) {
        s = absl::InvalidArgumentError(absl::StrCat(path, ": checkpoint path of ", kMaxPath, " bytes or more"));
      }
      msg[0] = s.ok() ? 1 : 0;
      if (s.ok()) std::memcpy(msg.data_ptr<uint8_t>() + 1, path.data(), path.size());
    }
    ROLL_RETURN_IF_ERROR(Annotate(communicator_->Broadcast(msg, 0), "saving checkpoint: sending the directory"));
    if (rank != 0) {
      if (msg[0].item<uint8_t>() != 1) {
        s = absl::InternalError(absl::StrCat("saving checkpoint ", dir, " failed on rank 0"));
      } else {
        s = guarded([&]() -> absl::Status {
          tmp = fs::path(std::string(reinterpret_cast<const char*>(msg.data_ptr<uint8_t>() + 1)));
          const std::string file = (tmp / ShardFileName(rank, world)).string();
          ROLL_RETURN_IF_ERROR(SaveSafetensors(file, optimizer_->StateDict()));
          return FsyncPath(file, false);
        });
      }
    }
    // Every shard is on disk before rank 0 completes the directory.
    at::Tensor failed = torch::tensor({s.ok() ? 0.0f : 1.0f});
    ROLL_RETURN_IF_ERROR(Annotate(communicator_->AllReduce(failed, ReduceOp::kSum),
                                  "saving checkpoint: collecting the shards"));
    if (rank == 0 && s.ok() && failed.item<float>() > 0) {
      s = absl::InternalError(absl::StrCat("saving checkpoint ", dir, ": ",
                                           static_cast<int>(failed.item<float>()),
                                           " rank(s) failed to write their optimizer shard"));
    }
  }
  if (rank == 0) {
    if (s.ok()) {
      // Rank 0's shard, the rng and the trainer state join the model in
      // `tmp`, which then takes the place of `dir`.
      s = guarded([&] { return FinishCheckpoint(tmp.string(), target.string()); });
    }
    if (!s.ok() && !tmp.empty()) {
      std::error_code ignored;
      fs::remove_all(tmp, ignored);
    }
  }
  if (world == 1) return s;
  return ShareOutcome(*communicator_, s, dir);
}

absl::Status TrainStrategy::Load(const std::string& dir) {
  try {
    // The mode puts together what the load reads into (tensor parallel: the
    // joined whole model, cut into the slices after).
    absl::Status s = mode_->AroundLoad([&] { return LoadImpl(dir); });
    for (const at::Tensor& p : mode_->trained()) {
      at::Tensor q = p;
      q.mutable_grad() = at::Tensor();
    }
    return s;
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("loading checkpoint ", dir, ": ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("loading checkpoint ", dir, ": ", e.what()));
  }
}

absl::Status TrainStrategy::LoadImpl(const std::string& dir) {
  const fs::path root(dir);
  const std::string state_path = (root / kStateFile).string();
  std::ifstream in(state_path);
  if (!in) return absl::NotFoundError(absl::StrCat(state_path, ": cannot read (not a trainer checkpoint?)"));
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json state = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (state.is_discarded() || !state.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(state_path, ": not valid JSON"));
  }
  auto get_int = [&](const nlohmann::json& obj, const char* key, const std::string& path) -> absl::StatusOr<int64_t> {
    if (!obj.is_object() || !obj.contains(key) || !obj[key].is_number_integer() || obj[key].get<int64_t>() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(state_path, ": '", path, "' must be a non-negative integer"));
    }
    return obj[key].get<int64_t>();
  };
  if (state.value("format", std::string()) != kFormat) {
    return absl::InvalidArgumentError(absl::StrCat(state_path, ": 'format' must be \"", kFormat, "\""));
  }
  ROLL_ASSIGN_OR_RETURN(int64_t version, get_int(state, "version", "version"));
  if (version != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat(state_path, ": unsupported version ", version, " (this build reads ", kVersion, ")"));
  }
  ROLL_ASSIGN_OR_RETURN(int64_t step, get_int(state, "step", "step"));
  const nlohmann::json optimizer = state.contains("optimizer") ? state["optimizer"] : nlohmann::json();
  ROLL_ASSIGN_OR_RETURN(int64_t optimizer_step, get_int(optimizer, "step", "optimizer.step"));
  if (optimizer.value("type", std::string()) != "adamw") {
    return absl::InvalidArgumentError(absl::StrCat(state_path, ": 'optimizer.type' must be \"adamw\""));
  }

  // Validate every file against this model before changing anything.
  ROLL_ASSIGN_OR_RETURN(auto model_ckpt, Checkpoint::Open(dir));
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = mode_->ParameterShapes();
  std::set<std::string> expected;
  for (const auto& [name, shape] : shapes) {
    expected.insert(name);
    auto info = model_ckpt->Info(name);
    if (!info.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_ckpt->path(), ": missing tensor '", name, "' of this model"));
    }
    if (info->shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(model_ckpt->path(), ": tensor '", name, "' has shape ",
                                                     ShapeString(info->shape), ", the model's is ",
                                                     ShapeString(shape)));
    }
  }
  for (const std::string& name : model_ckpt->names()) {
    if (!expected.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_ckpt->path(), ": unexpected tensor '", name, "' (not a parameter of this model)"));
    }
  }
  ROLL_ASSIGN_OR_RETURN(strategies_internal::OptimizerFileState optimizer_state,
                        mode_->ReadOptimizerState(dir, state, state_path));
  const std::string rng_path = (root / kRngFile).string();
  ROLL_ASSIGN_OR_RETURN(auto rng_file, SafetensorsFile::Open(rng_path));
  auto rng = rng_file->Load("cpu");
  if (!rng.ok()) return Annotate(rng.status(), rng_path);
  if (rng->scalar_type() != at::kByte || rng->dim() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(rng_path, ": tensor 'cpu' must be a 1-D U8 tensor"));
  }

  ROLL_RETURN_IF_ERROR(optimizer_->LoadStateDict(optimizer_state.tensors, optimizer_step, optimizer_state.path));
  ROLL_RETURN_IF_ERROR(mode_->LoadParameters(*model_ckpt));
  {
    at::Generator gen = CpuGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    try {
      gen.set_state(*rng);
    } catch (const c10::Error& e) {
      return absl::InvalidArgumentError(
          absl::StrCat(rng_path, ": tensor 'cpu' is not a CPU generator state: ", e.what_without_backtrace()));
    }
  }
  step_ = step;
  return absl::OkStatus();
}

}  // namespace roll
