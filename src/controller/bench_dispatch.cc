#include "controller/bench_dispatch.h"

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

}  // namespace

absl::StatusOr<std::string> RunDispatchBench(const DispatchBenchOptions& o) {
  if (o.workers < 1 || o.calls < 10 || o.payload_calls < 1) {
    return absl::InvalidArgumentError("bench dispatch: need --workers >= 1, --calls >= 10");
  }
  const std::string out_dir =
      (std::filesystem::temp_directory_path() / absl::StrCat("roll-bench-dispatch-", getpid())).string();
  const std::string yaml = absl::StrCat("exp_name: bench_dispatch\noutput_dir: ", out_dir,
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
      ours.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    for (int i = 0; i < block; ++i) {
      auto t0 = Clock::now();
      ROLL_RETURN_IF_ERROR(raw_call());
      base.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
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
  std::error_code ec;
  std::filesystem::remove_all(out_dir, ec);
  return j.dump();
}

}  // namespace roll
