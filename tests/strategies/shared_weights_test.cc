// SharedWeights: the model update between processes on one device of a
// node. Parameters of any dtype arrive whole; a version that never comes is
// a timeout naming it; parameters on a GPU are staged through host memory.

#include <torch/torch.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "roll/strategies/weight_sync.h"


namespace roll {
namespace {

using ::testing::HasSubstr;

std::vector<at::Tensor> Params(const at::TensorOptions& on, int seed) {
  torch::manual_seed(seed);
  return {torch::randn({64, 32}, on), torch::randn({32}, on).to(at::kBFloat16), torch::randn({7}, on)};
}

void ExpectEqual(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(a[k].cpu().equal(b[k].cpu())) << "parameter " << k;
}

TEST(SharedWeightsTest, ReceiversReadThePublishedVersion) {
  const std::vector<at::Tensor> sent = Params(at::kCPU, 1);
  auto region = SharedWeights::Create(sent);
  ASSERT_TRUE(region.ok()) << region.status();
  auto view = SharedWeights::Open((*region)->path());
  ASSERT_TRUE(view.ok()) << view.status();
  std::vector<at::Tensor> got = Params(at::kCPU, 2);
  auto early = (*view)->Read(got, 0, absl::Milliseconds(50));
  EXPECT_EQ(early.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(early.message(), HasSubstr("version 0 was not published"));
  ASSERT_TRUE((*region)->Publish(sent, 0).ok());
  ASSERT_TRUE((*view)->Read(got, 0, absl::Seconds(5)).ok());
  ExpectEqual(got, sent);
  std::vector<at::Tensor> wrong = {torch::zeros({3})};
  EXPECT_THAT((*view)->Read(wrong, 0, absl::Seconds(1)).message(), HasSubstr("the parameters hold 12 bytes"));
}

TEST(SharedWeightsTest, CudaParametersAreStagedThroughHostMemory) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA LibTorch and a CUDA device";
  const std::vector<at::Tensor> sent = Params(at::kCUDA, 1);
  auto region = SharedWeights::Create(sent);
  ASSERT_TRUE(region.ok()) << region.status();
  auto view = SharedWeights::Open((*region)->path());
  ASSERT_TRUE(view.ok()) << view.status();
  ASSERT_TRUE((*region)->Publish(sent, 3).ok());
  std::vector<at::Tensor> got = Params(at::kCUDA, 2);
  ASSERT_TRUE((*view)->Read(got, 3, absl::Seconds(5)).ok());
  for (const at::Tensor& t : got) EXPECT_TRUE(t.is_cuda()) << "the receiver's parameters stay on the GPU";
  ExpectEqual(got, sent);
}

}  // namespace
}  // namespace roll
