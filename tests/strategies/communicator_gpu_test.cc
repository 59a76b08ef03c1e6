// The communicator contract against the nccl backend, one rank per CUDA
// device. Skips without ROLL_WITH_NCCL or without a CUDA device.
//
// Device buffers come from the CUDA runtime, not LibTorch, so the test runs
// with a LibTorch built without CUDA: tensors are wrapped around cudaMalloc'd
// memory and copied with cudaMemcpy.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "roll/strategies/communicator.h"

#ifdef ROLL_WITH_NCCL
#include <cuda_runtime.h>

#include "strategies/communicator_contract.h"
#endif

namespace roll {
namespace {

#ifdef ROLL_WITH_NCCL

int CudaDevices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

at::Tensor ToDevice(const at::Tensor& cpu, int device) {
  at::Tensor src = cpu.contiguous();
  const size_t bytes = src.numel() * src.element_size();
  cudaSetDevice(device);
  void* ptr = nullptr;
  if (cudaMalloc(&ptr, bytes == 0 ? 1 : bytes) != cudaSuccess) return at::Tensor();
  cudaMemcpy(ptr, src.data_ptr(), bytes, cudaMemcpyHostToDevice);
  const c10::Device where(c10::kCUDA, static_cast<c10::DeviceIndex>(device));
  return at::for_blob(ptr, src.sizes())
      .deleter([](void* p) { cudaFree(p); })
      .options(src.options().device(where))
      .target_device(where)
      .make_tensor();
}

at::Tensor ToCpu(const at::Tensor& dev) {
  at::Tensor out = at::empty(dev.sizes(), dev.options().device(c10::kCPU));
  cudaSetDevice(dev.device().index());
  cudaMemcpy(out.data_ptr(), dev.data_ptr(), out.numel() * out.element_size(),
             cudaMemcpyDeviceToHost);
  return out;
}

comm_test::CommBackend NcclBackend() {
  comm_test::CommBackend b;
  b.name = "nccl";
  b.max_ranks = CudaDevices();  // NCCL allows one rank per device in a group.
  b.to_device = ToDevice;
  b.to_cpu = ToCpu;
  b.configure = [](CommunicatorOptions& o) { o.cuda_device = o.rank; };
  return b;
}

using comm_test::CommunicatorContractTest;
INSTANTIATE_TEST_SUITE_P(Nccl, CommunicatorContractTest, ::testing::Values(NcclBackend()),
                         comm_test::PrintBackend);

// Options for an nccl group on `server`'s store, rank 0 on device 0.
CommunicatorOptions NcclOptions(const StoreServer& server, const std::string& group, int world_size,
                                std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  CommunicatorOptions o;
  o.backend = "nccl";
  o.store_port = server.port();
  o.store_token = server.token();
  o.group_name = group;
  o.rank = 0;
  o.world_size = world_size;
  o.timeout = timeout;
  return o;
}

TEST(NcclCommunicatorTest, RejectsCpuTensorsAndMissingDevices) {
  const int devices = CudaDevices();
  if (devices == 0) GTEST_SKIP() << "no CUDA device";
  auto server = StoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  CommunicatorOptions o = NcclOptions(**server, "gpu_solo", 1);
  auto comm = CreateCommunicator(o);
  ASSERT_TRUE(comm.ok()) << comm.status();
  at::Tensor cpu = torch::ones({4});
  absl::Status s = (*comm)->AllReduce(cpu, ReduceOp::kSum);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("cuda:0"), std::string::npos) << s;

  o.group_name = "gpu_missing";
  o.cuda_device = devices;  // One past the last.
  auto missing = CreateCommunicator(o);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument) << missing.status();
}

// CI builds the NCCL path wherever NCCL and the CUDA runtime are installed,
// GPU or not: without a device the backend refuses clearly.
TEST(NcclCommunicatorTest, WithoutADeviceTheBackendSaysSo) {
  if (CudaDevices() > 0) GTEST_SKIP() << "this machine has a CUDA device";
  auto server = StoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  auto comm = CreateCommunicator(NcclOptions(**server, "gpu_none", 1));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition) << comm.status();
  EXPECT_NE(comm.status().message().find("group 'gpu_none'"), std::string::npos) << comm.status();
  EXPECT_NE(comm.status().message().find("needs a CUDA device"), std::string::npos) << comm.status();
}

TEST(NcclCommunicatorTest, MissingPeerTimesOut) {
  if (CudaDevices() == 0) GTEST_SKIP() << "no CUDA device";
  auto server = StoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status();
  auto comm = CreateCommunicator(NcclOptions(**server, "gpu_lonely", 2, std::chrono::seconds(2)));
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
  EXPECT_NE(comm.status().message().find("group 'gpu_lonely'"), std::string::npos);
}

#else

TEST(NcclCommunicatorTest, SkippedWithoutNccl) {
  GTEST_SKIP() << "built without ROLL_WITH_NCCL";
}

#endif

}  // namespace
}  // namespace roll
