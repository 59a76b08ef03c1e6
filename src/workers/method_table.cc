#include "absl/strings/str_join.h"
#include "roll/worker/worker.h"

namespace roll {

void MethodTable::Add(const MethodSpec& method, MethodFn fn) {
  methods_[std::string(method.name)] = std::move(fn);
}

const MethodFn* MethodTable::Find(std::string_view name) const {
  auto it = methods_.find(name);
  return it == methods_.end() ? nullptr : &it->second;
}

std::vector<std::string> MethodTable::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, fn] : methods_) names.push_back(name);
  return names;
}

WorkerRegistry& WorkerRegistry::Global() {
  static WorkerRegistry* registry = new WorkerRegistry;
  return *registry;
}

void WorkerRegistry::Register(std::string type, WorkerFactory factory) {
  std::lock_guard<std::mutex> lock(mu_);
  factories_[std::move(type)] = std::move(factory);
}

absl::StatusOr<std::unique_ptr<Worker>> WorkerRegistry::Create(std::string_view type) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = factories_.find(type);
  if (it == factories_.end()) {
    std::vector<std::string> known;
    for (const auto& [name, f] : factories_) known.push_back(name);
    return absl::NotFoundError(absl::StrCat("unknown worker type '", Sv(type), "' (registered: ",
                                            absl::StrJoin(known, ", "), ")"));
  }
  return it->second();
}

std::vector<std::string> WorkerRegistry::Types() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (const auto& [name, f] : factories_) names.push_back(name);
  return names;
}

}  // namespace roll
