// FlattenParameters moves a model's parameters into one buffer so the model
// update sends them in one transfer; the parameters must stay the same
// objects with the same values, and keep training.

#include <torch/torch.h>

#include <gtest/gtest.h>

#include "workers/rl/rl_common.h"

namespace roll {
namespace {

using rl_internal::FlattenParameters;

const uint8_t* Begin(const at::Tensor& t) { return static_cast<const uint8_t*>(t.data_ptr()); }

TEST(FlattenParametersTest, KeepsObjectsAndValuesAndPutsThemBackToBack) {
  torch::manual_seed(0);
  at::Tensor w = torch::randn({8, 4}).requires_grad_(true);
  at::Tensor b = torch::randn({4}).requires_grad_(true);
  at::Tensor v = torch::randn({4, 8}).requires_grad_(true);
  const at::Tensor w0 = w.detach().clone(), b0 = b.detach().clone(), v0 = v.detach().clone();
  const void* w_impl = w.unsafeGetTensorImpl();
  at::Tensor alias = w;  // another handle, as a tied weight or an optimizer holds it

  FlattenParameters({w, b, v, alias});

  EXPECT_EQ(w.unsafeGetTensorImpl(), w_impl);
  EXPECT_TRUE(w.equal(w0));
  EXPECT_TRUE(b.equal(b0));
  EXPECT_TRUE(v.equal(v0));
  EXPECT_TRUE(w.requires_grad() && w.is_leaf());
  // In the order given; the tie (last in the list) takes no slot of its own,
  // else w would have moved behind v.
  EXPECT_EQ(Begin(b), Begin(w) + w.nbytes());
  EXPECT_EQ(Begin(v), Begin(b) + b.nbytes());
  EXPECT_TRUE(w.storage().is_alias_of(v.storage()));
}

TEST(FlattenParametersTest, FlattenedParametersTrainInPlace) {
  torch::manual_seed(1);
  at::Tensor w = torch::randn({3, 5}).requires_grad_(true);
  at::Tensor b = torch::randn({5}).requires_grad_(true);
  FlattenParameters({w, b});
  torch::optim::AdamW opt({w, b}, torch::optim::AdamWOptions(0.1));
  const at::Tensor x = torch::randn({2, 3});
  auto loss = [&] { return (x.matmul(w) + b).pow(2).sum(); };
  const double before = loss().item<double>();
  for (int i = 0; i < 5; ++i) {
    opt.zero_grad();
    at::Tensor l = loss();
    l.backward();
    ASSERT_TRUE(w.grad().defined() && b.grad().defined());
    opt.step();
  }
  EXPECT_LT(loss().item<double>(), before);
  // The update wrote into the shared buffer: still back to back.
  EXPECT_EQ(Begin(b), Begin(w) + w.nbytes());
}

TEST(FlattenParametersTest, MixedDtypesAreLeftAlone) {
  at::Tensor a = torch::ones({4});
  at::Tensor h = torch::ones({4}, torch::kBFloat16);
  const void* a_ptr = a.data_ptr();
  FlattenParameters({a, h});
  EXPECT_EQ(a.data_ptr(), a_ptr);
}

}  // namespace
}  // namespace roll
