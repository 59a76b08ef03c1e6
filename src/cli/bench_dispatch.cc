#include "cli/bench_dispatch.h"

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>

#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>
#include <nlohmann/json.hpp>

#include "roll/controller/controller.h"
#include "roll/controller/environment_client.h"
#include "roll/worker/debug_worker.h"
#include "rpc/rpc_util.h"
#include "worker.grpc.pb.h"

namespace roll {
namespace {

using Clock = std::chrono::steady_clock;

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(q * (v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

// Fan-out of one Echo to every worker over the plain callback API.
class RawFanout {
 public:
  explicit RawFanout(const std::vector<WorkerInfo>& workers) {
    for (const auto& w : workers) stubs_.push_back(rpc::BenchRaw::NewStub(rpc::MakeChannel(w.address)));
  }

  absl::Status Run(const rpc::RawEcho& req) {
    const size_t n = stubs_.size();
    std::vector<grpc::ClientContext> ctx(n);
    std::vector<rpc::RawEcho> reply(n);
    std::mutex m;
    std::condition_variable cv;
    size_t remaining = n;
    grpc::Status failed;
    for (size_t i = 0; i < n; ++i) {
      ctx[i].set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      stubs_[i]->async()->Echo(&ctx[i], &req, &reply[i], [&](grpc::Status s) {
        std::lock_guard<std::mutex> lock(m);
        if (!s.ok()) failed = s;
        if (--remaining == 0) cv.notify_one();
      });
    }
    std::unique_lock<std::mutex> lock(m);
    cv.wait(lock, [&] { return remaining == 0; });
    return rpc::FromGrpc(failed);
  }

 private:
  std::vector<std::unique_ptr<rpc::BenchRaw::Stub>> stubs_;
};

// A scratch output directory for a bench's job, removed with it.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag)
      : path_((std::filesystem::temp_directory_path() / absl::StrCat("roll-bench-", tag, "-", getpid())).string()) {}
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

double Micros(Clock::time_point since) { return std::chrono::duration<double, std::micro>(Clock::now() - since).count(); }

}  // namespace

absl::StatusOr<std::string> RunEnvStepBench(const EnvStepBenchOptions& o) {
  if (o.workers < 1 || o.workers > 64 || o.episodes < 1 || o.episodes > 100000 || o.rounds < 10 ||
      o.rounds > 90000) {
    return absl::InvalidArgumentError(
        "bench env-step: need --workers in [1, 64], --episodes in [1, 100000], --rounds in [10, 90000]");
  }
  ScratchDir out("env-step");
  // Left and Up from the start corner never move: episodes run for good.
  const std::string yaml = absl::StrCat(
      "exp_name: bench_env_step\noutput_dir: ", out.path(),
      "\ntrain_env_manager:\n  worker_cls: environment\n  world_size: ", o.workers,
      "\n  env_type: frozen_lake\n  env_options: [size=8, max_steps=100000]\nruntime:\n  log_level: warn\n");
  ROLL_ASSIGN_OR_RETURN(PipelineConfig config, ParsePipelineConfig(yaml, "<bench env-step>"));
  setenv("ROLL_BENCH_RAW", "1", 1);
  ROLL_ASSIGN_OR_RETURN(auto controller, Controller::Create(config));
  ROLL_ASSIGN_OR_RETURN(auto cluster, controller->StartCluster<EnvironmentApi>("train_env_manager"));
  RawFanout raw(cluster->workers());
  EnvironmentClient client(cluster.get());
  std::vector<EpisodeStart> starts;
  for (int i = 0; i < o.episodes; ++i) starts.push_back({absl::StrCat("bench", i), static_cast<uint64_t>(i)});
  ROLL_RETURN_IF_ERROR(client.Reset(starts).status());
  std::vector<EnvAction> left, up;
  for (const EpisodeStart& e : starts) {
    left.push_back({e.key, "<answer>Left</answer>"});
    up.push_back({e.key, "<answer>Up</answer>"});
  }
  const std::vector<Batch> empty(o.workers);
  rpc::RawEcho raw_empty;
  std::vector<double> step, noop, base;
  double step_s = 0;
  for (int round = 0; round < o.rounds + 20; ++round) {
    const bool warm = round >= 20;
    auto t0 = Clock::now();
    ROLL_RETURN_IF_ERROR(client.Step(round % 2 ? up : left).status());
    if (warm) {
      step.push_back(Micros(t0));
      step_s += step.back() / 1e6;
    }
    t0 = Clock::now();
    ROLL_RETURN_IF_ERROR(cluster->CallEach(environment::kClose, empty).Wait());
    if (warm) noop.push_back(Micros(t0));
    t0 = Clock::now();
    ROLL_RETURN_IF_ERROR(raw.Run(raw_empty));
    if (warm) base.push_back(Micros(t0));
  }
  nlohmann::json j;
  j["bench"] = "env-step";
  j["workers"] = o.workers;
  j["episodes"] = o.episodes;
  j["rounds"] = o.rounds;
  j["step_p50_us"] = Percentile(step, 0.5);
  j["step_p99_us"] = Percentile(step, 0.99);
  j["env_steps_per_s"] = o.episodes * static_cast<double>(o.rounds) / step_s;
  j["noop_p50_us"] = Percentile(noop, 0.5);
  j["raw_grpc_p50_us"] = Percentile(base, 0.5);
  j["step_over_raw"] = Percentile(step, 0.5) / Percentile(base, 0.5);
  ROLL_RETURN_IF_ERROR(cluster->Shutdown());
  return j.dump();
}

absl::StatusOr<std::string> RunDispatchBench(const DispatchBenchOptions& o) {
  if (o.workers < 1 || o.calls < 10 || o.payload_calls < 1) {
    return absl::InvalidArgumentError("bench dispatch: need --workers >= 1, --calls >= 10");
  }
  ScratchDir out("dispatch");
  const std::string yaml = absl::StrCat("exp_name: bench_dispatch\noutput_dir: ", out.path(),
                                        "\nrollout_batch_size: 1\nbench:\n  worker_cls: debug\n  world_size: ",
                                        o.workers, "\nruntime:\n  log_level: warn\n");
  LoadOptions load;
  load.extra_roles = {"bench"};
  ROLL_ASSIGN_OR_RETURN(PipelineConfig config, ParsePipelineConfig(yaml, "<bench dispatch>", {}, load));
  setenv("ROLL_BENCH_RAW", "1", 1);
  ControllerOptions copts;
  copts.load = load;
  ROLL_ASSIGN_OR_RETURN(auto controller, Controller::Create(config, copts));
  ROLL_ASSIGN_OR_RETURN(auto cluster, controller->StartCluster<DebugApi>("bench"));
  RawFanout raw(cluster->workers());

  const Batch empty;
  rpc::RawEcho raw_empty;
  auto runtime_call = [&]() -> absl::Status { return cluster->Call(debug::kNoop, empty).Wait(); };
  auto raw_call = [&]() -> absl::Status { return raw.Run(raw_empty); };
  for (int i = 0; i < 200; ++i) {
    ROLL_RETURN_IF_ERROR(runtime_call());
    ROLL_RETURN_IF_ERROR(raw_call());
  }
  // Alternate blocks of both so that drift in machine load hits both alike.
  std::vector<double> ours, base;
  const int block = 50;
  for (int done = 0; done < o.calls; done += block) {
    for (int i = 0; i < block; ++i) {
      auto t0 = Clock::now();
      ROLL_RETURN_IF_ERROR(runtime_call());
      ours.push_back(Micros(t0));
    }
    for (int i = 0; i < block; ++i) {
      auto t0 = Clock::now();
      ROLL_RETURN_IF_ERROR(raw_call());
      base.push_back(Micros(t0));
    }
  }

  Batch payload;
  payload.SetTensor("x", at::rand({o.payload_bytes / 4}).view({1, -1}));
  rpc::RawEcho raw_payload;
  raw_payload.set_payload(std::string(o.payload_bytes, 'x'));
  raw_payload.set_discard(true);
  double ours_s = 0, base_s = 0;
  for (int i = 0; i < o.payload_calls; ++i) {
    auto t0 = Clock::now();
    ROLL_RETURN_IF_ERROR(cluster->Call(debug::kNoop, payload).Wait());
    auto t1 = Clock::now();
    ROLL_RETURN_IF_ERROR(raw.Run(raw_payload));
    auto t2 = Clock::now();
    ours_s += std::chrono::duration<double>(t1 - t0).count();
    base_s += std::chrono::duration<double>(t2 - t1).count();
  }
  const double mb = static_cast<double>(o.payload_bytes) * o.workers * o.payload_calls / 1e6;

  nlohmann::json j;
  j["bench"] = "dispatch";
  j["workers"] = o.workers;
  j["calls"] = o.calls;
  j["p50_us"] = Percentile(ours, 0.5);
  j["p99_us"] = Percentile(ours, 0.99);
  j["raw_grpc_p50_us"] = Percentile(base, 0.5);
  j["raw_grpc_p99_us"] = Percentile(base, 0.99);
  j["p50_over_raw"] = Percentile(ours, 0.5) / Percentile(base, 0.5);
  j["payload_mb"] = o.payload_bytes / 1e6;
  j["fanout_mb_per_s"] = mb / ours_s;
  j["raw_grpc_fanout_mb_per_s"] = mb / base_s;
  ROLL_RETURN_IF_ERROR(cluster->Shutdown());
  return j.dump();
}

}  // namespace roll
