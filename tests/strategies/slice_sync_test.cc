// The model update of a tensor-parallel generator from a replicated
// trainer: the whole model's bytes (a broadcast's windows, or the shared
// memory of colocated processes) go straight into the generator's slices,
// which then hold exactly their part; no whole copy exists on that side.
// Also: the broadcast's windows depend on the byte total only, so a sender
// and a receiver may lay their parameters out differently.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "roll/models/hf_config.h"
#include "roll/models/transformer.h"
#include "roll/strategies/communicator.h"
#include "roll/strategies/weight_sync.h"
#include "strategies/sync_test_util.h"

namespace roll {
namespace {

using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

std::unique_ptr<CausalLM> Model(uint64_t seed, c10::ScalarType dtype) {
  return testing::SyncTestModel(seed, dtype, /*kv_heads=*/4, /*vocab=*/52);
}

std::vector<CausalLM*> Raw(const std::vector<std::unique_ptr<CausalLM>>& slices) {
  std::vector<CausalLM*> out;
  for (const auto& s : slices) out.push_back(s.get());
  return out;
}

// `model` cut into `n` slices; the whole model's names and shapes read back
// from them are the model's.
std::vector<std::unique_ptr<CausalLM>> Slices(const CausalLM& model, int n) {
  std::vector<std::unique_ptr<CausalLM>> out;
  for (int r = 0; r < n; ++r) {
    auto s = model.TensorParallelSlice(r, n);
    EXPECT_TRUE(s.ok()) << s.status();
    out.push_back(std::move(*s));
  }
  Shapes shapes;
  for (const auto& [name, p] : model.NamedParametersOrdered()) shapes.emplace_back(name, p.sizes().vec());
  EXPECT_EQ(WholeShapes(Raw(out)), shapes);
  return out;
}

// Every slice holds exactly its part of `want` (name -> whole tensor).
void ExpectParts(const std::vector<std::unique_ptr<CausalLM>>& slices, const std::map<std::string, at::Tensor>& want,
                 const std::string& what) {
  for (size_t r = 0; r < slices.size(); ++r) {
    const auto named = slices[r]->NamedParametersOrdered();
    ASSERT_EQ(named.size(), want.size());
    for (const auto& [name, t] : named) {
      const int dim = TensorParallelDim(name);
      const at::Tensor whole = want.at(name);
      const at::Tensor part = dim < 0 ? whole : whole.narrow(dim, r * t.size(dim), t.size(dim));
      EXPECT_EQ(t.scalar_type(), part.scalar_type()) << what << " slice " << r << " " << name;
      EXPECT_TRUE(torch::equal(t, part)) << what << " slice " << r << " " << name;
    }
  }
}

std::map<std::string, at::Tensor> Values(const CausalLM& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, p] : model.NamedParametersOrdered()) out[name] = p.detach().clone();
  return out;
}

// Rank `rank` of group `group` over `store` (the ranks are threads here).
absl::StatusOr<std::unique_ptr<Communicator>> Join(const StoreServer& store, const std::string& group, int rank,
                                                   int world) {
  CommunicatorOptions o;
  o.store_port = store.port();
  o.store_token = store.token();
  o.group_name = group;
  o.rank = rank;
  o.world_size = world;
  o.timeout = std::chrono::seconds(60);
  return CreateCommunicator(o);
}

class SliceSyncTest : public ::testing::TestWithParam<c10::ScalarType> {};

TEST_P(SliceSyncTest, ABroadcastLandsInEverySplitAndInAnotherLayout) {
  const c10::ScalarType dtype = GetParam();
  auto store = StoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(store.ok()) << store.status();
  // The trainer's model, flattened into one buffer as loaded models are.
  auto trainer = Model(7, dtype);
  FlattenParameters(trainer->Parameters());
  const std::map<std::string, at::Tensor> want = Values(*trainer);
  // Receivers: a whole model kept as separate tensors (another layout), and
  // generators split in 2 and in 4 that keep only their slices.
  constexpr int kReceivers = 3;
  auto whole = Model(100, dtype);
  std::vector<std::unique_ptr<CausalLM>> two, four;
  {
    auto m = Model(101, dtype);
    two = Slices(*m, 2);
    four = Slices(*Model(102, dtype), 4);
  }
  std::vector<absl::Status> status(1 + kReceivers);
  std::vector<int64_t> windows(1 + kReceivers, 0);
  std::vector<std::thread> ranks;
  for (int r = 0; r <= kReceivers; ++r) {
    ranks.emplace_back([&, r] {
      auto comm = Join(**store, "slice_sync", r, 1 + kReceivers);
      if (!comm.ok()) {
        status[r] = comm.status();
        return;
      }
      // Windows of 4 KiB: many of them, most cutting through a parameter.
      ParameterBroadcaster broadcaster(4 * 4096);
      if (r <= 1) {
        status[r] = broadcaster.Run(**comm, (r == 0 ? trainer : whole)->Parameters());
        return;
      }
      const std::vector<std::unique_ptr<CausalLM>>& slices = r == 2 ? two : four;
      SliceStream writer(Raw(slices));
      status[r] = broadcaster.Receive(**comm, writer.total_bytes(), slices[0]->Parameters()[0].options(),
                                      [&](int64_t offset, const at::Tensor& bytes) {
                                        ++windows[r];
                                        EXPECT_LE(bytes.numel(), broadcaster.chunk_bytes());
                                        return writer.Write(offset, bytes);
                                      });
      if (status[r].ok()) status[r] = writer.Finish();
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r <= kReceivers; ++r) ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  for (const auto& [name, t] : Values(*whole)) EXPECT_TRUE(torch::equal(t, want.at(name))) << name;
  ExpectParts(two, want, "tp 2");
  ExpectParts(four, want, "tp 4");
  int64_t bytes = 0;
  for (const at::Tensor& p : trainer->Parameters()) bytes += p.numel() * static_cast<int64_t>(p.element_size());
  EXPECT_EQ(windows[2], (bytes + 4095) / 4096);
  EXPECT_EQ(windows[3], windows[2]);
}

TEST_P(SliceSyncTest, ASplitTrainerSendsOutOfItsSlicesToEveryKindOfGenerator) {
  const c10::ScalarType dtype = GetParam();
  auto store = StoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(store.ok()) << store.status();
  // The trainer keeps only its two slices; the reference values are the
  // model they were cut from.
  auto whole_trainer = Model(17, dtype);
  const std::map<std::string, at::Tensor> want = Values(*whole_trainer);
  std::vector<std::unique_ptr<CausalLM>> trainer = Slices(*whole_trainer, 2);
  whole_trainer.reset();
  auto whole = Model(110, dtype);  // a generator of one piece
  FlattenParameters(whole->Parameters());
  std::vector<std::unique_ptr<CausalLM>> four = Slices(*Model(111, dtype), 4);
  std::vector<absl::Status> status(3);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      auto comm = Join(**store, "slice_send", r, 3);
      if (!comm.ok()) {
        status[r] = comm.status();
        return;
      }
      ParameterBroadcaster broadcaster(4 * 4096);
      if (r == 0) {
        SliceStream reader(Raw(trainer));
        status[r] = broadcaster.Send(**comm, reader.total_bytes(), at::TensorOptions(),
                                     [&](int64_t offset, const at::Tensor& b) { return reader.Read(offset, b); });
      } else if (r == 1) {
        status[r] = broadcaster.Run(**comm, whole->Parameters());
      } else {
        SliceStream writer(Raw(four));
        status[r] = broadcaster.Receive(**comm, writer.total_bytes(), at::TensorOptions(),
                                        [&](int64_t offset, const at::Tensor& b) { return writer.Write(offset, b); });
        if (status[r].ok()) status[r] = writer.Finish();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 3; ++r) ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  for (const auto& [name, t] : Values(*whole)) EXPECT_TRUE(torch::equal(t, want.at(name))) << name;
  ExpectParts(four, want, "tp 2 -> tp 4");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SliceSyncTest, ::testing::Values(at::kFloat, at::kBFloat16),
                         [](const auto& info) { return std::string(c10::toString(info.param)); });

TEST(SliceStreamTest, ElementsCutBetweenPiecesOfAMixedDtypeStreamArriveWhole) {
  // A model whose norms are bf16 and the rest fp32: parameters of 2- and
  // 4-byte elements back to back, so pieces of odd sizes cut elements.
  auto model = Model(3, at::kFloat);
  std::vector<std::unique_ptr<CausalLM>> slices = Slices(*Model(4, at::kFloat), 2);
  std::map<std::string, at::Tensor> want;
  std::vector<at::Tensor> stream;
  for (const auto& [name, p] : model->NamedParametersOrdered()) {
    const bool half = name.find("norm") != std::string::npos;
    want[name] = half ? p.detach().to(at::kBFloat16) : p.detach().clone();
    stream.push_back(want[name].contiguous().view({-1}).view(at::kByte));
    if (half) {
      for (const auto& s : slices) {
        at::Tensor t = s->NamedParameters().at(name);
        t.set_data(at::zeros(t.sizes(), t.options().dtype(at::kBFloat16)));
      }
    }
  }
  const at::Tensor bytes = at::cat(stream);
  SliceStream writer(Raw(slices));
  ASSERT_EQ(writer.total_bytes(), bytes.numel());
  const int64_t sizes[] = {1, 3, 777, 2, 5, 4093};
  int64_t off = 0;
  for (int i = 0; off < bytes.numel(); ++i) {
    const int64_t n = std::min(sizes[i % 6], bytes.numel() - off);
    ASSERT_TRUE(writer.Write(off, bytes.narrow(0, off, n)).ok());
    off += n;
  }
  ASSERT_TRUE(writer.Finish().ok());
  ExpectParts(slices, want, "mixed");
  // Read back in pieces of other odd sizes, the stream comes out as it went in.
  at::Tensor out = at::zeros_like(bytes);
  const int64_t read_sizes[] = {4095, 2, 1, 13, 3};
  off = 0;
  for (int i = 0; off < out.numel(); ++i) {
    const int64_t n = std::min(read_sizes[i % 5], out.numel() - off);
    ASSERT_TRUE(writer.Read(off, out.narrow(0, off, n)).ok());
    off += n;
  }
  EXPECT_TRUE(torch::equal(out, bytes));
  EXPECT_FALSE(writer.Read(bytes.numel() - 2, at::zeros({4}, at::kByte)).ok());
}

TEST(SliceStreamTest, SegmentsOfParametersInAnyOrderLandWhereTheyBelong) {
  // A fully sharded trainer rank's shard: parts of parameters, not in the
  // model's order, cut anywhere (also inside a split row).
  auto trainer = Model(11, at::kFloat);
  const std::map<std::string, at::Tensor> want = Values(*trainer);
  auto receiver = Model(12, at::kFloat);
  std::map<std::string, at::Tensor> expect = Values(*receiver);
  std::vector<std::unique_ptr<CausalLM>> slices = Slices(*receiver, 2);
  const auto named = trainer->NamedParametersOrdered();
  std::vector<SliceStream::Segment> segments;
  std::vector<at::Tensor> stream;
  for (size_t i = named.size(); i-- > 0;) {
    if (i % 2 == 1) continue;  // every other parameter, last first
    const int64_t numel = named[i].second.numel();
    const int64_t first = numel / 3, n = std::max<int64_t>(1, numel / 2 - 1);
    segments.push_back({i, first, n});
    stream.push_back(want.at(named[i].first).view({-1}).narrow(0, first, n).view(at::kByte));
    expect[named[i].first].view({-1}).narrow(0, first, n).copy_(want.at(named[i].first).view({-1}).narrow(0, first, n));
  }
  const at::Tensor bytes = at::cat(stream);
  SliceStream shard(Raw(slices), segments);
  ASSERT_EQ(shard.total_bytes(), bytes.numel());
  for (int64_t off = 0; off < bytes.numel(); off += 37) {
    ASSERT_TRUE(shard.Write(off, bytes.narrow(0, off, std::min<int64_t>(37, bytes.numel() - off))).ok());
  }
  ASSERT_TRUE(shard.Finish().ok());
  // The segments hold the trainer's values, everything else the receiver's.
  ExpectParts(slices, expect, "segments");
  at::Tensor out = at::zeros_like(bytes);
  ASSERT_TRUE(shard.Read(0, out).ok());
  EXPECT_TRUE(torch::equal(out, bytes));
}

TEST(SliceStreamTest, AShortLongOrOutOfOrderStreamIsAnError) {
  std::vector<std::unique_ptr<CausalLM>> slices = Slices(*Model(5, at::kFloat), 2);
  SliceStream writer(Raw(slices));
  const at::Tensor bytes = at::zeros({writer.total_bytes() + 200}, at::kByte);
  ASSERT_TRUE(writer.Write(0, bytes.narrow(0, 0, 100)).ok());
  EXPECT_FALSE(writer.Finish().ok());
  absl::Status gap = writer.Write(200, bytes.narrow(0, 0, 8));
  EXPECT_EQ(gap.code(), absl::StatusCode::kInternal) << gap;
  absl::Status too_long = writer.Write(100, bytes.narrow(0, 100, writer.total_bytes()));
  EXPECT_EQ(too_long.code(), absl::StatusCode::kInvalidArgument) << too_long;
  EXPECT_NE(too_long.message().find(std::to_string(writer.total_bytes())), std::string::npos) << too_long;
}

TEST(SliceStreamTest, SharedMemoryFromAColocatedTrainerLandsInTheSlices) {
  auto trainer = Model(8, at::kBFloat16);
  const std::map<std::string, at::Tensor> want = Values(*trainer);
  auto sender = SharedWeights::Create(trainer->Parameters());
  ASSERT_TRUE(sender.ok()) << sender.status();
  auto receiver = SharedWeights::Open((*sender)->path());
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  ASSERT_TRUE((*sender)->Publish(trainer->Parameters(), 3).ok());
  std::vector<std::unique_ptr<CausalLM>> slices = Slices(*Model(9, at::kBFloat16), 2);
  SliceStream writer(Raw(slices));
  absl::Status s = (*receiver)->Read(3, absl::Seconds(5), [&](const at::Tensor& region) {
    ROLL_RETURN_IF_ERROR(writer.Write(0, region));
    return writer.Finish();
  });
  ASSERT_TRUE(s.ok()) << s;
  ExpectParts(slices, want, "shared");
  // A version never published times out, naming it.
  absl::Status late = (*receiver)->Read(4, absl::Milliseconds(50), [](const at::Tensor&) { return absl::OkStatus(); });
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded) << late;
  EXPECT_NE(late.message().find("version 4"), std::string::npos) << late;
}

}  // namespace
}  // namespace roll
