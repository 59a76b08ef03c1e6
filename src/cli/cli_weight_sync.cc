// `roll bench weight-sync [--receivers N] [--size-mb M] [--buffer-mb B] [--rounds R] [--colocated] [--unflattened]
// [--mixed] [--trainer-shards S] [--tensor-parallel P] [--trainer-tensor-parallel Q]`:
// the trainer-to-generator model update (bucketed broadcast of a model's
// parameter list from rank 0, written into the receivers' parameters in
// place), next to a plain c10d broadcast of one flat tensor of the same
// size in the same run, alternating round by round. One JSON line: gb_per_s
// (model bytes / median time of one update), raw_broadcast_gb_per_s (the
// same for the raw broadcast), and their ratio. With --colocated the update
// goes through shared memory (SharedWeights), as between a trainer and the
// generators that share its CPU slots; the raw broadcast stays the reference.
// The parameters are flattened into one buffer as a worker's model is
// (FlattenParameters); --unflattened keeps each in its own allocation.
//
// Every rank is a thread of this process with its own Gloo communicator
// over loopback, as the ranks of a local job are processes on one machine.
// The parameters mimic a decoder's: per layer four square matrices and two
// wide ones plus norms, scaled to --size-mb; float32, or with --mixed the
// matrices bfloat16 and the norms float32 (a bf16 model with fp32 norms).
// With --tensor-parallel P the parameters are a real decoder's (float32,
// sized to about --size-mb) and each receiver is a generator split into P
// slices that keeps no whole copy: the update streams into its slices
// (SliceStream) from the broadcast's windows or the shared memory. With
// --trainer-tensor-parallel Q the trainer is split into Q slices and sends
// out of them the same way, window by window (or into the shared region).
// With --trainer-shards S the trainer is S fully sharded ranks, each sending
// its shard to every receiver over a group of its own; with
// --tensor-parallel P as well the receivers are split and each shard
// streams into their slices.

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <numeric>
#include <optional>
#include <thread>

#include "absl/strings/str_format.h"
#include "cli/cli.h"
#include "roll/common/cli_args.h"
#include "roll/models/hf_config.h"
#include "roll/models/tensor_parallel.h"
#include "roll/models/transformer.h"
#include "roll/strategies/communicator.h"
#include "roll/strategies/sharding.h"
#include "roll/strategies/weight_sync.h"

namespace roll {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<at::Tensor> MakeParams(int64_t bytes, int64_t seed, bool mixed) {
  // hidden h: per layer 4 h^2 + 3 * 2.75 h^2 ~ 12.25 h^2 floats; 4 layers.
  int64_t h = 64;
  while (4 * 12.25 * static_cast<double>((h + 64) * (h + 64)) * 4 <= static_cast<double>(bytes)) h += 64;
  std::vector<at::Tensor> out;
  // A generator of its own: the ranks are threads, the global one is shared.
  at::Generator gen = at::detail::createCPUGenerator(static_cast<uint64_t>(seed));
  int64_t used = 0;
  const int64_t wide = h * 11 / 4;
  while (used < bytes) {
    for (auto shape : std::vector<std::vector<int64_t>>{{h}, {h, h}, {h, h}, {h, h}, {h, h}, {h},
                                                        {wide, h}, {wide, h}, {h, wide}}) {
      at::Tensor t = at::randn(shape, gen);
      if (mixed && shape.size() == 2) t = t.to(at::kBFloat16);
      const int64_t b = static_cast<int64_t>(t.nbytes());
      if (used + b > bytes) {
        const int64_t rest = (bytes - used) / 4;
        if (rest > 0) out.push_back(at::randn({rest}, gen));
        used = bytes;
        break;
      }
      out.push_back(t);
      used += b;
    }
  }
  return out;
}

// A decoder of about `bytes` float32 parameters (4 layers, vocabulary 4096,
// hidden a multiple of 64 with 64-wide heads) that splits into `tp` slices.
absl::StatusOr<std::unique_ptr<CausalLM>> MakeModel(int64_t bytes, int tp, uint64_t seed) {
  auto numel = [](int64_t h) { return 4 * (4 * h * h + 3 * h * (h * 11 / 4 / 64 * 64)) + 2 * 4096 * h; };
  int64_t h = 64;
  while (numel(h + 64) * 4 <= bytes) h += 64;
  const int64_t heads = h / 64;
  if (heads % tp != 0) h = (heads / tp + 1) * tp * 64;
  ROLL_ASSIGN_OR_RETURN(
      ModelConfig c,
      ModelConfig::FromJson(absl::StrFormat(
          R"({"model_type": "qwen2", "hidden_size": %d, "intermediate_size": %d, "num_hidden_layers": 4,)"
          R"( "num_attention_heads": %d, "num_key_value_heads": %d, "vocab_size": 4096,)"
          R"( "max_position_embeddings": 64})",
          h, h * 11 / 4 / (64 * tp) * 64 * tp, h / 64, h / 64)));
  return CausalLM::Random(c, seed);
}

// `model` cut into `n` tensor-parallel slices, and views of them.
struct Slices {
  std::vector<std::unique_ptr<CausalLM>> owned;
  std::vector<CausalLM*> raw;
};
absl::StatusOr<Slices> Cut(const CausalLM& model, int64_t n) {
  Slices out;
  for (int64_t k = 0; k < n; ++k) {
    ROLL_ASSIGN_OR_RETURN(auto slice, model.TensorParallelSlice(static_cast<int>(k), static_cast<int>(n)));
    out.raw.push_back(slice.get());
    out.owned.push_back(std::move(slice));
  }
  return out;
}

// Each slice holds exactly its part of `whole` (name, tensor; the
// unsplit model's parameters in order).
absl::Status CheckSlices(const std::vector<CausalLM*>& slices,
                         const std::vector<std::pair<std::string, at::Tensor>>& whole) {
  for (size_t k = 0; k < slices.size(); ++k) {
    for (const auto& [name, p] : whole) {
      const at::Tensor mine = slices[k]->NamedParameters().at(name);
      const int dim = TensorParallelDim(name);
      const at::Tensor part = dim < 0 ? p : p.narrow(dim, k * mine.size(dim), mine.size(dim));
      if (!mine.equal(part)) return absl::InternalError("a slice differs from its part: " + name);
    }
  }
  return absl::OkStatus();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// The flags both modes share, checked.
struct SizeFlags {
  int64_t receivers = 1;
  double size_mb = 64, buffer_mb = 64;
  int64_t rounds = 10;
  int64_t bytes = 0;  // size_mb in bytes, a multiple of 4
};

absl::StatusOr<SizeFlags> ParseSizeFlags(const CliArgs& flags) {
  SizeFlags f;
  ROLL_ASSIGN_OR_RETURN(f.receivers, flags.GetInt("receivers", 1));
  ROLL_ASSIGN_OR_RETURN(f.size_mb, flags.GetDouble("size-mb", 64));
  ROLL_ASSIGN_OR_RETURN(f.buffer_mb, flags.GetDouble("buffer-mb", 64));
  ROLL_ASSIGN_OR_RETURN(f.rounds, flags.GetInt("rounds", 10));
  if (f.receivers < 1 || f.size_mb <= 0 || f.buffer_mb <= 0 || f.rounds < 1) {
    return absl::InvalidArgumentError("--receivers, --size-mb, --buffer-mb and --rounds must be positive");
  }
  f.bytes = static_cast<int64_t>(f.size_mb * (1 << 20)) / 4 * 4;
  return f;
}

absl::StatusOr<std::string> Run(const CliArgs& flags) {
  ROLL_ASSIGN_OR_RETURN(const SizeFlags f, ParseSizeFlags(flags));
  const int64_t receivers = f.receivers, rounds = f.rounds;
  const double buffer_mb = f.buffer_mb;
  const bool colocated = flags.Has("colocated");
  const int world = static_cast<int>(receivers + 1);
  ROLL_ASSIGN_OR_RETURN(auto store, StoreServer::Start("127.0.0.1", 0));
  std::vector<double> sync_s, raw_s;  // per round, as rank 0 saw them
  std::vector<absl::Status> status(world);
  // The sender's parameters, which every receiver must hold at the end.
  // Flattened as the workers' models are, unless --unflattened.
  const bool flat = !flags.Has("unflattened");
  const bool mixed = flags.Has("mixed");
  ROLL_ASSIGN_OR_RETURN(const int64_t tp, flags.GetInt("tensor-parallel", 1));
  ROLL_ASSIGN_OR_RETURN(const int64_t trainer_tp, flags.GetInt("trainer-tensor-parallel", 1));
  if (tp < 1 || trainer_tp < 1) {
    return absl::InvalidArgumentError("--tensor-parallel and --trainer-tensor-parallel must be >= 1");
  }
  const bool model = tp > 1 || trainer_tp > 1;  // a real decoder's parameters
  if (model && (mixed || !flat)) {
    return absl::InvalidArgumentError(
        "--tensor-parallel and --trainer-tensor-parallel take a float32 model: drop --mixed and --unflattened");
  }
  const int split = static_cast<int>(std::lcm(tp, trainer_tp));  // the model splits both ways
  std::unique_ptr<CausalLM> sender_model;
  std::vector<at::Tensor> expect;
  int64_t bytes = f.bytes;
  if (model) {
    ROLL_ASSIGN_OR_RETURN(sender_model, MakeModel(f.bytes, split, 1));
    expect = sender_model->Parameters();
    bytes = 0;
    for (const at::Tensor& p : expect) bytes += p.numel() * 4;
  } else {
    expect = MakeParams(bytes, 1, mixed);
  }
  // A tensor-parallel trainer holds only its slices and sends out of them.
  Slices trainer_slices;
  if (trainer_tp > 1) {
    ROLL_ASSIGN_OR_RETURN(trainer_slices, Cut(*sender_model, trainer_tp));
  }
  if (flat) FlattenParameters(expect);
  std::unique_ptr<SharedWeights> region;
  if (colocated) {
    ROLL_ASSIGN_OR_RETURN(region, SharedWeights::Create(expect));
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      at::set_num_threads(1);
      auto fail = [&](absl::Status s) { status[r] = std::move(s); };
      CommunicatorOptions o;
      o.store_port = store->port();
      o.store_token = store->token();
      o.group_name = "bench_weight_sync";
      o.rank = r;
      o.world_size = world;
      o.timeout = std::chrono::seconds(120);
      auto comm = CreateCommunicator(o);
      if (!comm.ok()) return fail(comm.status());
      std::vector<at::Tensor> params;
      Slices slices;  // a tensor-parallel receiver's
      if (r == 0) {
        params = expect;
      } else if (model) {
        auto whole = MakeModel(f.bytes, split, 2);
        if (!whole.ok()) return fail(whole.status());
        if (tp == 1) {
          params = (*whole)->Parameters();
        } else {  // a tensor-parallel generator keeps only its slices
          auto cut = Cut(**whole, tp);
          if (!cut.ok()) return fail(cut.status());
          slices = std::move(*cut);
        }
      } else {
        params = MakeParams(bytes, 2, mixed);
      }
      if (r > 0 && flat && tp == 1) FlattenParameters(params);
      ParameterBroadcaster broadcaster(static_cast<int64_t>(buffer_mb * (1 << 20)));
      std::unique_ptr<SharedWeights> view;  // a receiver's own mapping of the region
      if (colocated && r > 0) {
        auto opened = SharedWeights::Open(region->path());
        if (!opened.ok()) return fail(opened.status());
        view = std::move(*opened);
      }
      at::Tensor flat = r == 0 ? at::randn({bytes / 4}) : at::empty({bytes / 4});
      for (int64_t i = 0; i <= rounds; ++i) {  // round 0 warms up
        if (auto s = (*comm)->Barrier(); !s.ok()) return fail(s);
        auto t0 = Clock::now();
        if (auto s = (*comm)->Broadcast(flat, 0); !s.ok()) return fail(s);
        if (auto s = (*comm)->Barrier(); !s.ok()) return fail(s);
        auto t1 = Clock::now();
        absl::Status s;
        if (r == 0 && trainer_tp > 1) {
          // Out of the trainer's slices: into the shared region or window by window.
          SliceStream reader(trainer_slices.raw);
          auto fill = [&](int64_t offset, const at::Tensor& b) { return reader.Read(offset, b); };
          s = colocated ? region->Publish(i, [&](const at::Tensor& b) { return fill(0, b); })
                        : broadcaster.Send(**comm, reader.total_bytes(), at::TensorOptions(), fill);
        } else if (r > 0 && tp > 1) {
          // Into the slices: from the broadcast's windows or the shared region.
          SliceStream writer(slices.raw);
          auto deliver = [&](int64_t offset, const at::Tensor& b) { return writer.Write(offset, b); };
          s = colocated ? view->Read(i, absl::Seconds(60), [&](const at::Tensor& b) { return deliver(0, b); })
                        : broadcaster.Receive(**comm, writer.total_bytes(), at::TensorOptions(), deliver);
          if (s.ok()) s = writer.Finish();
        } else {
          s = !colocated ? broadcaster.Run(**comm, params)
              : r == 0   ? region->Publish(params, i)
                         : view->Read(params, i, absl::Seconds(60));
        }
        if (!s.ok()) return fail(s);
        if (auto s = (*comm)->Barrier(); !s.ok()) return fail(s);
        auto t2 = Clock::now();
        if (i > 0 && r == 0) {
          raw_s.push_back(std::chrono::duration<double>(t1 - t0).count());
          sync_s.push_back(std::chrono::duration<double>(t2 - t1).count());
        }
      }
      for (size_t k = 0; r > 0 && k < params.size(); ++k) {
        if (!params[k].equal(expect[k])) return fail(absl::InternalError("received parameters differ"));
      }
      if (!slices.raw.empty()) {
        if (auto s = CheckSlices(slices.raw, sender_model->NamedParametersOrdered()); !s.ok()) return fail(s);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& s : status) ROLL_RETURN_IF_ERROR(s);
  const double gb = static_cast<double>(bytes) / 1e9;
  const double sync = Median(sync_s), raw = Median(raw_s);
  return absl::StrFormat(
      R"({"bench": "weight-sync", "path": "%s", "receivers": %d, "size_mb": %g, "buffer_mb": %g, "rounds": %d, )"
      R"("flattened": %s, "mixed": %s, "trainer_tensor_parallel": %d, "tensor_parallel": %d, "tensors": %d, )"
      R"("sync_s": %.4f, "raw_broadcast_s": %.4f, )"
      R"("gb_per_s": %.3f, "raw_broadcast_gb_per_s": %.3f, "ratio": %.3f})",
      colocated ? "shared-memory" : "broadcast", receivers, static_cast<double>(bytes) / (1 << 20), buffer_mb,
      rounds, flat ? "true" : "false", mixed ? "true" : "false", trainer_tp, tp, expect.size(), sync, raw, gb / sync, gb / raw,
      raw / sync);
}

// --trainer-shards N: the update from a fully sharded trainer. N trainer
// threads each hold 1/N of the flattened parameters (ShardLayout's cut)
// and broadcast only their own pieces on a group of their own (trainer r
// and the receivers); each receiver takes every trainer's pieces straight
// into its parameters, as an actor_infer worker does. The raw reference is
// one broadcast of the whole model's bytes from trainer 0, as in the
// default mode; all ranks meet at a barrier of one group around each.
absl::StatusOr<std::string> RunSharded(const CliArgs& flags, int64_t shards) {
  ROLL_ASSIGN_OR_RETURN(const SizeFlags f, ParseSizeFlags(flags));
  if (shards < 2) return absl::InvalidArgumentError("--trainer-shards must be >= 2");
  const int64_t receivers = f.receivers, rounds = f.rounds;
  int64_t bytes = f.bytes;
  const double size_mb = f.size_mb, buffer_mb = f.buffer_mb;
  const int trainers = static_cast<int>(shards), total = trainers + static_cast<int>(receivers);
  // With --tensor-parallel P the parameters are a real decoder's and every
  // receiver is a generator split into P slices (SliceStream).
  ROLL_ASSIGN_OR_RETURN(const int64_t tp, flags.GetInt("tensor-parallel", 1));
  if (tp < 1) return absl::InvalidArgumentError("--tensor-parallel must be >= 1");
  ROLL_ASSIGN_OR_RETURN(const int64_t trainer_tp, flags.GetInt("trainer-tensor-parallel", 1));
  if (trainer_tp != 1) {
    return absl::InvalidArgumentError("--trainer-shards and --trainer-tensor-parallel cannot be combined");
  }
  std::unique_ptr<CausalLM> sender_model;
  std::vector<at::Tensor> expect;
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  if (tp > 1) {
    ROLL_ASSIGN_OR_RETURN(sender_model, MakeModel(bytes, static_cast<int>(tp), 1));
    for (const auto& [name, p] : sender_model->NamedParametersOrdered()) {
      expect.push_back(p.detach());
      shapes.emplace_back(name, p.sizes().vec());
    }
    bytes = 0;
    for (const at::Tensor& p : expect) bytes += p.numel() * 4;
  } else {
    expect = MakeParams(bytes, 1, /*mixed=*/false);
    for (size_t i = 0; i < expect.size(); ++i) shapes.emplace_back(absl::StrCat("p", i), expect[i].sizes().vec());
  }
  FlattenParameters(expect);
  ROLL_ASSIGN_OR_RETURN(ShardLayout layout, ShardLayout::Create(shapes, trainers));
  // A trainer's pieces of one unit, back to back in one tensor: what it
  // holds and sends (the bench's parameters form one unit).
  auto shard_of = [&](int r) {
    std::vector<at::Tensor> out;
    for (const ShardPiece& p : layout.Pieces(r)) {
      out.push_back(expect[p.param].detach().reshape({-1}).narrow(0, p.param_offset, p.numel));
    }
    return std::vector<at::Tensor>{at::cat(out)};
  };
  ROLL_ASSIGN_OR_RETURN(auto store, StoreServer::Start("127.0.0.1", 0));
  auto options = [&](const std::string& group, int rank, int world) {
    CommunicatorOptions o;
    o.store_port = store->port();
    o.store_token = store->token();
    o.group_name = group;
    o.rank = rank;
    o.world_size = world;
    o.timeout = std::chrono::seconds(120);
    return o;
  };
  std::vector<double> sync_s, raw_s;
  std::vector<absl::Status> status(total);
  std::vector<std::thread> threads;
  for (int k = 0; k < total; ++k) {
    threads.emplace_back([&, k] {
      at::set_num_threads(1);
      auto fail = [&](absl::Status s) { status[k] = std::move(s); };
      const bool trainer = k < trainers;
      const int receiver_rank = trainer ? 0 : k - trainers + 1;  // rank in the shard and raw groups
      auto all = CreateCommunicator(options("bench_sharded_all", k, total));
      if (!all.ok()) return fail(all.status());
      std::unique_ptr<Communicator> raw;
      if (!trainer || k == 0) {
        auto c = CreateCommunicator(options("bench_sharded_raw", receiver_rank, 1 + receivers));
        if (!c.ok()) return fail(c.status());
        raw = std::move(*c);
      }
      std::vector<std::unique_ptr<Communicator>> groups;
      for (int r = 0; r < trainers; ++r) {
        if (trainer && r != k) continue;
        auto c = CreateCommunicator(options(absl::StrCat("bench_sharded_", r), receiver_rank, 1 + receivers));
        if (!c.ok()) return fail(c.status());
        groups.push_back(std::move(*c));
      }
      // A trainer holds its own shard only.
      std::vector<at::Tensor> mine = trainer ? shard_of(k) : std::vector<at::Tensor>();
      std::vector<at::Tensor> params;
      std::vector<std::pair<std::string, at::Tensor>> named;
      std::optional<ShardLayout> receiver_layout;
      Slices slices;  // a tensor-parallel receiver's
      if (!trainer && tp > 1) {
        auto m = MakeModel(f.bytes, static_cast<int>(tp), 2);
        if (!m.ok()) return fail(m.status());
        auto cut = Cut(**m, tp);
        if (!cut.ok()) return fail(cut.status());
        slices = std::move(*cut);
      } else if (!trainer) {
        params = MakeParams(bytes, 2, false);
        FlattenParameters(params);
        for (size_t i = 0; i < params.size(); ++i) named.emplace_back(shapes[i].first, params[i]);
      }
      ParameterBroadcaster broadcaster(static_cast<int64_t>(buffer_mb * (1 << 20)));
      at::Tensor flat = k == 0 ? at::randn({bytes / 4}) : at::empty({bytes / 4});
      for (int64_t i = 0; i <= rounds; ++i) {  // round 0 warms up
        if (auto s = (*all)->Barrier(); !s.ok()) return fail(s);
        auto t0 = Clock::now();
        if (raw) {
          if (auto s = raw->Broadcast(flat, 0); !s.ok()) return fail(s);
        }
        if (auto s = (*all)->Barrier(); !s.ok()) return fail(s);
        auto t1 = Clock::now();
        if (trainer) {
          if (auto s = broadcaster.Run(*groups[0], mine); !s.ok()) return fail(s);
        } else {
          // What an actor_infer worker runs: each trainer's shard in place
          // (into the slices of a tensor-parallel one).
          absl::Status s = tp > 1 ? ReceiveShardedUpdateIntoSlices(broadcaster, groups, slices.raw,
                                                                                  &receiver_layout)
                                  : ReceiveShardedUpdate(broadcaster, groups, named, &receiver_layout);
          if (!s.ok()) return fail(s);
        }
        if (auto s = (*all)->Barrier(); !s.ok()) return fail(s);
        auto t2 = Clock::now();
        if (i > 0 && k == 0) {
          raw_s.push_back(std::chrono::duration<double>(t1 - t0).count());
          sync_s.push_back(std::chrono::duration<double>(t2 - t1).count());
        }
      }
      for (size_t j = 0; !trainer && j < params.size(); ++j) {
        if (!params[j].equal(expect[j])) return fail(absl::InternalError("received parameters differ"));
      }
      if (!slices.raw.empty()) {
        if (auto s = CheckSlices(slices.raw, sender_model->NamedParametersOrdered()); !s.ok()) return fail(s);
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& s : status) ROLL_RETURN_IF_ERROR(s);
  const double gb = static_cast<double>(bytes) / 1e9;
  const double sync = Median(sync_s), raw = Median(raw_s);
  return absl::StrFormat(
      R"({"bench": "weight-sync", "path": "sharded", "trainer_shards": %d, "receivers": %d, "tensor_parallel": %d, )"
      R"("size_mb": %g, "model_mb": %.1f, "buffer_mb": %g, "rounds": %d, "tensors": %d, "sync_s": %.4f, )"
      R"("raw_broadcast_s": %.4f, "gb_per_s": %.3f, "raw_broadcast_gb_per_s": %.3f, "ratio": %.3f})",
      shards, receivers, tp, size_mb, static_cast<double>(bytes) / (1 << 20), buffer_mb, rounds, expect.size(), sync,
      raw, gb / sync, gb / raw, raw / sync);
}

}  // namespace

int BenchWeightSyncCommand(const std::vector<std::string>& args) {
  auto flags = CliArgs::Parse(args, {"receivers", "size-mb", "buffer-mb", "rounds", "trainer-shards", "tensor-parallel",
                                     "trainer-tensor-parallel"},
                              {"colocated", "unflattened", "mixed"});
  if (!flags.ok()) return CliFail(flags.status());
  auto shards = flags->GetInt("trainer-shards", 0);
  if (!shards.ok()) return CliFail(shards.status());
  auto out = *shards > 0 ? RunSharded(*flags, *shards) : Run(*flags);
  if (!out.ok()) return CliFail(out.status());
  std::cout << *out << std::endl;
  return 0;
}

}  // namespace roll
