#include "roll/strategies/offload.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "roll/strategies/optimizer.h"

namespace roll {
namespace {

// Parameters laid out as a flattened model's are: views of one buffer, one
// of them appearing twice (a tied weight), leaves that require grad.
struct FlatParams {
  at::Tensor flat;
  std::vector<at::Tensor> params;
};

FlatParams MakeFlat(c10::Device device = c10::kCPU) {
  torch::NoGradGuard no_grad;
  FlatParams f;
  f.flat = torch::randn({10 * 8 + 8 + 3 * 4}, torch::TensorOptions().device(device));
  std::vector<at::Tensor> parts = {f.flat.narrow(0, 0, 80).view({10, 8}), f.flat.narrow(0, 80, 8),
                                   f.flat.narrow(0, 88, 12).view({3, 4})};
  for (at::Tensor& p : parts) {
    at::Tensor leaf = at::empty({0});
    leaf.set_data(p);
    leaf.set_requires_grad(true);
    f.params.push_back(leaf);
  }
  f.params.push_back(f.params[0]);  // tied
  f.flat = at::Tensor();            // only the views keep the buffer alive
  return f;
}

TEST(TensorOffloaderTest, OffloadFreesAndOnloadRestoresValuesLayoutAndObjects) {
  FlatParams f = MakeFlat();
  std::vector<at::Tensor> before;
  std::vector<const void*> impls;
  for (const at::Tensor& p : f.params) {
    before.push_back(p.detach().clone());
    impls.push_back(p.unsafeGetTensorImpl());
  }
  const char* base = static_cast<const char*>(f.params[0].storage().data());
  const int64_t offset1 = static_cast<const char*>(f.params[1].data_ptr()) - base;
  const int64_t version = f.params[1]._version();

  TensorOffloader off;
  ASSERT_TRUE(off.Offload(f.params).ok());
  EXPECT_TRUE(off.offloaded());
  EXPECT_EQ(off.offloaded_bytes(), 100 * 4) << "one buffer, the tie counted once";
  for (const at::Tensor& p : f.params) {
    EXPECT_EQ(p.numel(), 0);
    EXPECT_EQ(p.storage().nbytes(), 0u);
    EXPECT_TRUE(p.requires_grad());
  }
  EXPECT_EQ(off.Offload(f.params).code(), absl::StatusCode::kFailedPrecondition);

  ASSERT_TRUE(off.Onload().ok());
  EXPECT_FALSE(off.offloaded());
  EXPECT_EQ(off.offloaded_bytes(), 0);
  for (size_t i = 0; i < f.params.size(); ++i) {
    EXPECT_EQ(f.params[i].unsafeGetTensorImpl(), impls[i]) << i;
    EXPECT_TRUE(f.params[i].requires_grad()) << i;
    EXPECT_TRUE(at::equal(f.params[i].detach(), before[i])) << i;
  }
  // Still views of one buffer, at the same offsets.
  const c10::StorageImpl* storage = f.params[0].storage().unsafeGetStorageImpl();
  for (const at::Tensor& p : f.params) EXPECT_EQ(p.storage().unsafeGetStorageImpl(), storage);
  const char* fresh = static_cast<const char*>(f.params[0].storage().data());
  EXPECT_EQ(static_cast<const char*>(f.params[1].data_ptr()) - fresh, offset1);
  EXPECT_GT(f.params[1]._version(), version) << "caches keyed by version must see new memory";
  EXPECT_TRUE(off.Onload().ok()) << "nothing offloaded: a no-op";
}

// The GPU path (host memory instead of a spill file). Runs with a CUDA
// LibTorch on a machine with a GPU (scripts/gpu-test); skips elsewhere.
TEST(TensorOffloaderTest, CudaTensorsLeaveTheirDeviceAndComeBackToIt) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA LibTorch and a CUDA device";
  const c10::Device gpu(c10::kCUDA, 0);
  FlatParams f = MakeFlat(gpu);
  std::vector<at::Tensor> before;
  for (const at::Tensor& p : f.params) before.push_back(p.detach().cpu());
  TensorOffloader off;
  ASSERT_TRUE(off.Offload(f.params).ok());
  EXPECT_EQ(off.offloaded_bytes(), 100 * 4);
  for (const at::Tensor& p : f.params) {
    EXPECT_EQ(p.storage().nbytes(), 0u);
    EXPECT_EQ(p.device(), gpu);
  }
  ASSERT_TRUE(off.Onload().ok());
  const c10::StorageImpl* storage = f.params[0].storage().unsafeGetStorageImpl();
  for (size_t i = 0; i < f.params.size(); ++i) {
    EXPECT_EQ(f.params[i].device(), gpu) << i;
    EXPECT_EQ(f.params[i].storage().unsafeGetStorageImpl(), storage) << i;
    EXPECT_TRUE(at::equal(f.params[i].detach().cpu(), before[i])) << i;
  }
}

TEST(TensorOffloaderTest, ResidentMemoryDropsByTheOffloadedSize) {
  at::Tensor big = torch::rand({16 << 20});  // 64 MB, every page touched
  const double sum = big.sum().item<double>();
  const int64_t resident = ResidentBytes();
  ASSERT_GT(resident, 0);
  TensorOffloader off;
  ASSERT_TRUE(off.Offload({big}).ok());
  const int64_t offloaded = ResidentBytes();
  EXPECT_LT(offloaded, resident - (48 << 20)) << resident << " -> " << offloaded;
  ASSERT_TRUE(off.Onload().ok());
  EXPECT_GE(ResidentBytes(), offloaded + (48 << 20));
  EXPECT_EQ(big.sum().item<double>(), sum);
}

TEST(TensorOffloaderTest, AFailedOffloadLeavesEveryTensorInPlaceAndNamesTheDirectory) {
  at::Tensor t = torch::arange(10, at::kFloat);
  TensorOffloader off("/nonexistent/spill");
  absl::Status s = off.Offload({t});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("/nonexistent/spill"), std::string::npos) << s;
  EXPECT_FALSE(off.offloaded());
  EXPECT_TRUE(at::equal(t, torch::arange(10, at::kFloat)));
}

// A spill file on a tmpfs keeps its bytes in memory (as shared memory, which
// VmRSS does not show), so an offload there frees nothing: the offloader
// says so (workers log a warning), and by default it avoids a temporary
// directory that is one.
TEST(TensorOffloaderTest, SpillDirectoriesInMemoryAreRecognizedAndAvoidedByDefault) {
  if (!IsMemoryFileSystem("/dev/shm")) GTEST_SKIP() << "/dev/shm is not a tmpfs here";
  if (access("/var/tmp", W_OK | X_OK) != 0 || IsMemoryFileSystem("/var/tmp")) {
    GTEST_SKIP() << "no writable, disk-backed /var/tmp here";
  }
  EXPECT_TRUE(TensorOffloader("/dev/shm").spill_in_memory());
  EXPECT_FALSE(TensorOffloader("/var/tmp").spill_in_memory());

  const char* old_tmpdir = getenv("TMPDIR");
  const std::string saved = old_tmpdir != nullptr ? old_tmpdir : "";
  setenv("TMPDIR", "/dev/shm", 1);
  EXPECT_EQ(DefaultSpillDirectory(), "/var/tmp");
  TensorOffloader by_default;
  EXPECT_EQ(by_default.spill_dir(), "/var/tmp");
  EXPECT_FALSE(by_default.spill_in_memory());
  // An explicit directory is kept, tmpfs or not.
  EXPECT_EQ(TensorOffloader("/dev/shm").spill_dir(), "/dev/shm");
  // A disk-backed temporary directory stays the default.
  setenv("TMPDIR", "/var/tmp", 1);
  EXPECT_EQ(DefaultSpillDirectory(), "/var/tmp");
  if (old_tmpdir != nullptr) {
    setenv("TMPDIR", saved.c_str(), 1);
  } else {
    unsetenv("TMPDIR");
  }
}

// An optimizer whose parameters and moments went off and came back takes
// the same next update as one that never moved.
TEST(TensorOffloaderTest, TrainingGoesOnAsIfNothingMoved) {
  auto run = [](bool offload) {
    torch::manual_seed(1);
    FlatParams f = MakeFlat();
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (size_t i = 0; i < 3; ++i) named.emplace_back("p" + std::to_string(i), f.params[i]);
    AdamWOptions o;
    o.weight_decay = 0.1;
    auto opt = AdamW::Create(named, o);
    EXPECT_TRUE(opt.ok());
    TensorOffloader off;
    for (int step = 0; step < 3; ++step) {
      at::Tensor loss = (f.params[0].sum(1) * f.params[0].sum(1)).sum() + f.params[1].pow(3).sum() +
                        f.params[2].abs().sum();
      loss.backward();
      EXPECT_TRUE((*opt)->Step(1e-2).ok());
      for (size_t i = 0; i < 3; ++i) f.params[i].mutable_grad() = at::Tensor();
      if (offload) {
        std::vector<at::Tensor> state(f.params.begin(), f.params.end());
        for (const auto& [k, v] : (*opt)->StateDict()) state.push_back(v);
        EXPECT_TRUE(off.Offload(state).ok());
        EXPECT_TRUE(off.Onload().ok());
      }
    }
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < 3; ++i) out.push_back(f.params[i].detach().clone());
    return out;
  };
  std::vector<at::Tensor> a = run(false), b = run(true);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << i;
}

}  // namespace
}  // namespace roll
