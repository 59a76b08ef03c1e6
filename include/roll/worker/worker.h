#pragma once
// The worker API: what a user writes to add a worker type.
//
//   struct ScorerApi {
//     static constexpr std::string_view kType = "scorer";
//   };
//   inline constexpr roll::Method<ScorerApi> kScore{"score", roll::Dispatch::kDataParallel};
//
//   class ScorerWorker : public roll::Worker {
//    public:
//     absl::Status Initialize(const roll::WorkerContext& ctx) override;
//     void RegisterMethods(roll::MethodTable& table) override {
//       table.Bind(kScore, this, &ScorerWorker::Score);
//     }
//     absl::StatusOr<roll::Batch> Score(const roll::Batch& in);
//   };
//   ROLL_REGISTER_WORKER(ScorerApi, ScorerWorker);
//
// The worker runtime constructs one instance per process, calls Initialize
// once, then runs every method on a single executor thread, in arrival order:
// a worker's state needs no locks, and collectives are issued in the same order
// on every rank. Health checks are answered while a method runs.

#include <functional>
#include <mutex>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "roll/common/batch.h"
#include "roll/common/config.h"
#include "roll/common/status.h"
#include "roll/scheduler/dispatch.h"

namespace roll {

// What a worker knows about its place in the job. Valid for the worker's life.
struct WorkerContext {
  std::string cluster;   // role section name, e.g. "actor_train"
  int rank = 0;
  int world_size = 1;
  // Address of this worker's node: its server binds there, and peers on
  // other nodes reach its collectives there.
  std::string host = "127.0.0.1";
  // host:port of the controller, which also hosts the rendezvous store of
  // the job's collectives, and the job token its services want.
  std::string controller;
  std::string token;
  const PipelineConfig* config = nullptr;  // the whole resolved config
  const WorkerConfig* role = nullptr;      // this cluster's section
};

using MethodFn = std::function<absl::StatusOr<Batch>(const Batch&)>;

// Name -> bound member function. Filled by Worker::RegisterMethods.
class MethodTable {
 public:
  template <class Api, class W>
  void Bind(const Method<Api>& method, W* self, absl::StatusOr<Batch> (W::*fn)(const Batch&)) {
    Add(method, [self, fn](const Batch& in) { return (self->*fn)(in); });
  }
  void Add(const MethodSpec& method, MethodFn fn);
  // nullptr when unknown.
  const MethodFn* Find(std::string_view name) const;
  std::vector<std::string> Names() const;

 private:
  std::map<std::string, MethodFn, std::less<>> methods_;
};

class Worker {
 public:
  virtual ~Worker() = default;
  // Called once before any method, on the executor thread.
  virtual absl::Status Initialize(const WorkerContext& ctx) { return absl::OkStatus(); }
  virtual void RegisterMethods(MethodTable& table) = 0;
};

using WorkerFactory = std::function<std::unique_ptr<Worker>()>;

// Process-wide registry of worker types by name. Thread-safe.
class WorkerRegistry {
 public:
  static WorkerRegistry& Global();
  void Register(std::string type, WorkerFactory factory);
  absl::StatusOr<std::unique_ptr<Worker>> Create(std::string_view type) const;
  std::vector<std::string> Types() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, WorkerFactory, std::less<>> factories_;
};

template <class Api, class W>
void RegisterWorkerType() {
  WorkerRegistry::Global().Register(std::string(Api::kType), [] { return std::make_unique<W>(); });
}

// Registers W under Api::kType at static-initialization time. Use it in a
// translation unit of the executable (static libraries drop unreferenced TUs).
#define ROLL_REGISTER_WORKER(Api, W)                                  \
  static const bool ROLL_CONCAT_(roll_registered_worker_, __LINE__) = \
      (::roll::RegisterWorkerType<Api, W>(), true)

// Runs this process as a worker when argv is `<binary> worker ...`; returns the
// process exit code. Executables that define their own worker types call it
// first thing in main (see examples/custom_pipeline), so the controller can
// start them as their own workers.
int RunWorkerMain(int argc, char** argv);
// True when argv names the `worker` subcommand.
bool IsWorkerInvocation(int argc, char** argv);

}  // namespace roll
