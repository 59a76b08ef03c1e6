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
#include "strategies/train_internal.h"

namespace roll {
namespace {

namespace fs = std::filesystem;

constexpr char kStateFile[] = "trainer_state.json";
constexpr char kOptimizerFile[] = "optimizer.safetensors";
constexpr char kRngFile[] = "rng_state.safetensors";
constexpr char kFormat[] = "roll-trainer-state";
constexpr int kVersion = 1;

std::string ShapeString(at::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

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

}  // namespace

absl::Status TrainStrategy::Save(const std::string& dir) { return Save(dir, SaveOptions{}); }

absl::Status TrainStrategy::Save(const std::string& dir, const SaveOptions& model_options) {
  absl::Status s;
  if (!distributed() || communicator_->rank() == 0) {
    try {
      s = SaveImpl(dir, model_options);
    } catch (const c10::Error& e) {
      s = absl::InternalError(absl::StrCat("saving checkpoint ", dir, ": ", e.what_without_backtrace()));
    } catch (const std::exception& e) {
      s = absl::InternalError(absl::StrCat("saving checkpoint ", dir, ": ", e.what()));
    }
  }
  if (!distributed()) return s;
  // Rank 0 tells the others whether the checkpoint is complete.
  at::Tensor ok = torch::tensor({s.ok() ? 1.0f : 0.0f});
  ROLL_RETURN_IF_ERROR(Annotate(communicator_->Broadcast(ok, 0), "saving checkpoint: broadcasting the outcome"));
  if (!s.ok()) return s;
  if (ok.item<float>() != 1.0f) {
    return absl::InternalError(absl::StrCat("saving checkpoint ", dir, " failed on rank 0"));
  }
  return absl::OkStatus();
}

absl::Status TrainStrategy::SaveImpl(const std::string& dir, const SaveOptions& model_options) {
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
  const fs::path tmp(tmpl);
  auto fail = [&](const absl::Status& st) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    return st;
  };

  absl::Status s = model_->SavePretrained(tmp.string(), model_options);
  if (!s.ok()) return fail(s);
  s = SaveSafetensors((tmp / kOptimizerFile).string(), optimizer_->StateDict());
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
  s = WriteDurably((tmp / kStateFile).string(), state.dump(2) + "\n");
  if (!s.ok()) return fail(s);
  s = FsyncPath(tmp.string(), true);
  if (!s.ok()) return fail(s);
  s = SwapIntoPlace(tmp, target);
  if (!s.ok()) return fail(s);
  return FsyncPath(parent.string(), true);
}

absl::Status TrainStrategy::Load(const std::string& dir) {
  try {
    absl::Status s = LoadImpl(dir);
    for (const at::Tensor& p : params_) {
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
  const auto named = model_->NamedParametersOrdered();
  std::set<std::string> expected;
  for (const auto& [name, p] : named) {
    expected.insert(name);
    auto info = model_ckpt->Info(name);
    if (!info.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_ckpt->path(), ": missing tensor '", name, "' of this model"));
    }
    if (info->shape != std::vector<int64_t>(p.sizes().begin(), p.sizes().end())) {
      return absl::InvalidArgumentError(absl::StrCat(model_ckpt->path(), ": tensor '", name, "' has shape ",
                                                     ShapeString(info->shape), ", the model's is ",
                                                     ShapeString(p.sizes())));
    }
  }
  for (const std::string& name : model_ckpt->names()) {
    if (!expected.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_ckpt->path(), ": unexpected tensor '", name, "' (not a parameter of this model)"));
    }
  }
  const std::string optimizer_path = (root / kOptimizerFile).string();
  ROLL_ASSIGN_OR_RETURN(auto optimizer_file, SafetensorsFile::Open(optimizer_path));
  std::map<std::string, at::Tensor> optimizer_state;
  for (const std::string& name : optimizer_file->names()) {
    ROLL_ASSIGN_OR_RETURN(optimizer_state[name], optimizer_file->Load(name));
  }
  const std::string rng_path = (root / kRngFile).string();
  ROLL_ASSIGN_OR_RETURN(auto rng_file, SafetensorsFile::Open(rng_path));
  auto rng = rng_file->Load("cpu");
  if (!rng.ok()) return Annotate(rng.status(), rng_path);
  if (rng->scalar_type() != at::kByte || rng->dim() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(rng_path, ": tensor 'cpu' must be a 1-D U8 tensor"));
  }

  ROLL_RETURN_IF_ERROR(optimizer_->LoadStateDict(optimizer_state, optimizer_step, optimizer_path));
  for (const auto& [name, p] : named) {
    at::Tensor target = p;
    ROLL_RETURN_IF_ERROR(model_ckpt->LoadInto(name, target));
  }
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
