// FlattenParameters moves a model's parameters into one buffer so the model
// update sends them in one transfer; the parameters must stay the same
// objects with the same values, and keep training. LoadRoleModel honours
// model_args.fp32_lm_head.

#include <torch/torch.h>

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <thread>

#include "roll/models/transformer.h"
#include "roll/strategies/communicator.h"
#include "roll/strategies/weight_sync.h"
#include "workers/rl/worker_setup.h"

namespace roll {
namespace {


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

// A bf16 model with a float32 head (or float32 norms): one buffer for all,
// each parameter at a multiple of its element size.
TEST(FlattenParametersTest, MixedDtypesShareOneBufferEachAligned) {
  torch::manual_seed(2);
  at::Tensor a = torch::randn({4}).requires_grad_(true);
  at::Tensor h = torch::randn({3}).to(torch::kBFloat16).requires_grad_(true);  // 6 bytes
  at::Tensor c = torch::randn({2, 3}).requires_grad_(true);
  at::Tensor d = torch::randn({5}).to(torch::kBFloat16).requires_grad_(true);
  const at::Tensor a0 = a.detach().clone(), h0 = h.detach().clone(), c0 = c.detach().clone(),
                   d0 = d.detach().clone();
  FlattenParameters({a, h, c, d});
  EXPECT_TRUE(a.equal(a0) && h.equal(h0) && c.equal(c0) && d.equal(d0));
  EXPECT_EQ(h.scalar_type(), torch::kBFloat16);
  EXPECT_EQ(c.scalar_type(), torch::kFloat);
  EXPECT_TRUE(a.storage().is_alias_of(h.storage()) && a.storage().is_alias_of(c.storage()) &&
              a.storage().is_alias_of(d.storage()));
  EXPECT_EQ(Begin(h), Begin(a) + a.nbytes());
  // h ends at byte 22; c (float32) starts at the next multiple of 4.
  EXPECT_EQ(Begin(c), Begin(a) + 24);
  EXPECT_EQ(Begin(d), Begin(c) + c.nbytes());
  EXPECT_TRUE(a.requires_grad() && h.requires_grad() && h.is_leaf());
  // They still train: a step writes into the shared buffer.
  torch::optim::SGD opt({a, h, c, d}, torch::optim::SGDOptions(0.1));
  (a.sum() + h.to(torch::kFloat).sum() + c.sum() + d.to(torch::kFloat).sum()).backward();
  opt.step();
  EXPECT_TRUE(a.allclose(a0 - 0.1));
  EXPECT_TRUE(c.allclose(c0 - 0.1));
  EXPECT_EQ(Begin(d), Begin(c) + c.nbytes());
}

// The model update of a flattened mixed-dtype model: the receiver, flattened
// the same way, ends with the sender's values in every parameter (the
// alignment gap splits the buffer into two transfers).
TEST(FlattenParametersTest, AMixedDtypeModelUpdatesOverTheBroadcaster) {
  auto make = [](int seed) {
    torch::manual_seed(seed);
    std::vector<at::Tensor> p = {torch::randn({64, 32}), torch::randn({33}).to(torch::kBFloat16),
                                 torch::randn({16, 8}), torch::randn({40}).to(torch::kBFloat16)};
    FlattenParameters(p);
    return p;
  };
  const std::vector<at::Tensor> sent = make(1);
  auto store = StoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<std::vector<at::Tensor>> params = {sent, make(2)};
  std::vector<absl::Status> status(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      CommunicatorOptions o;
      o.store_port = (*store)->port();
      o.store_token = (*store)->token();
      o.group_name = "mixed_dtype_update";
      o.rank = r;
      o.world_size = 2;
      o.timeout = std::chrono::seconds(60);
      auto comm = CreateCommunicator(o);
      if (!comm.ok()) {
        status[r] = comm.status();
        return;
      }
      // Buffers smaller than the model: small parameters are packed.
      ParameterBroadcaster broadcaster(1024);
      status[r] = broadcaster.Run(**comm, params[r]);
    });
  }
  for (auto& t : ranks) t.join();
  ASSERT_TRUE(status[0].ok() && status[1].ok()) << status[0] << status[1];
  for (size_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(params[1][i].scalar_type(), sent[i].scalar_type());
    EXPECT_TRUE(params[1][i].equal(sent[i])) << "parameter " << i;
  }
}

// A model comes out of its checkpoint already in one buffer (the checkpoint
// is read straight into it), so FlattenParameters has nothing to copy: on a
// GPU a second copy would briefly double the model's device memory.
TEST(FlattenParametersTest, ALoadedModelIsFlatAlreadyAndIsNotCopied) {
  auto c = ModelConfig::FromJson(R"({"model_type": "qwen2", "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 50,
    "max_position_embeddings": 64})");
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string dir = ::testing::TempDir() + "/roll_flat_load_" + std::to_string(getpid());
  std::vector<at::Tensor> saved;
  {
    auto model = CausalLM::Random(*c, 3);
    ASSERT_TRUE(model.ok()) << model.status();
    for (const at::Tensor& p : (*model)->Parameters()) saved.push_back(p.detach().clone());
    ASSERT_TRUE((*model)->SavePretrained(dir).ok());
  }
  auto loaded = CausalLM::FromPretrained(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const std::vector<at::Tensor> params = (*loaded)->Parameters();
  ASSERT_EQ(params.size(), saved.size());
  const c10::StorageImpl* storage = params.front().storage().unsafeGetStorageImpl();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(params[i].equal(saved[i])) << i;
    EXPECT_TRUE(params[i].is_leaf() && !params[i].is_view()) << i;
    EXPECT_EQ(params[i].storage().unsafeGetStorageImpl(), storage) << i;
    if (i > 0) EXPECT_EQ(Begin(params[i]), Begin(params[i - 1]) + params[i - 1].nbytes()) << i;
  }
  const void* data = params.front().data_ptr();
  FlattenParameters(params);
  EXPECT_EQ(params.front().data_ptr(), data) << "copied into a second buffer";
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(params[i].equal(saved[i])) << i;
  std::filesystem::remove_all(dir);
}

TEST(FlattenParametersTest, ParametersOnDifferentDevicesOrNotContiguousAreLeftAlone) {
  at::Tensor a = torch::ones({4});
  at::Tensor t = torch::ones({3, 2}).t();  // not contiguous
  const void* a_ptr = a.data_ptr();
  FlattenParameters({a, t});
  EXPECT_EQ(a.data_ptr(), a_ptr);
}

// model_args.fp32_lm_head reaches the model the worker loads: a bf16
// model's logits come out in float32 (ScaleRL's FP32 LM head).
TEST(LoadRoleModelTest, Fp32LmHeadGivesFloat32LogitsFromABf16Model) {
  ModelConfig c;
  c.model_type = "qwen2";
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  c.vocab_size = 24;
  c.max_position_embeddings = 64;
  ModelOptions o;
  o.dtype = at::kBFloat16;
  auto model = CausalLM::Random(c, 0, o);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string dir = (std::filesystem::temp_directory_path() / ("roll-fp32-head-" + std::to_string(getpid()))).string();
  ASSERT_TRUE((*model)->SavePretrained(dir).ok());
  WorkerConfig role;
  role.name = "actor_train";
  role.model_args.model_name_or_path = dir;
  role.model_args.dtype = DType::kBf16;
  const at::Tensor ids = torch::tensor({{1, 2, 3}}, torch::kLong);
  for (bool fp32 : {false, true}) {
    role.model_args.fp32_lm_head = fp32;
    auto loaded = LoadRoleModel(role, DeviceType::kCpu, /*trainable=*/false, /*value_head=*/false, 0);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ((*loaded)->options().fp32_logits, fp32);
    torch::NoGradGuard g;
    auto logits = (*loaded)->Forward(ids);
    ASSERT_TRUE(logits.ok()) << logits.status();
    EXPECT_EQ(logits->scalar_type(), fp32 ? at::kFloat : at::kBFloat16);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace roll
