#include "roll/common/exit_hooks.h"

#include <cstdlib>
#include <mutex>
#include <utility>
#include <vector>

namespace roll {
namespace {

struct Hooks {
  std::mutex mu;
  bool registered = false;
  std::vector<std::function<void()>> pending;
};

Hooks& TheHooks() {
  static auto* hooks = new Hooks();
  return *hooks;
}

}  // namespace

void AtProcessExit(std::function<void()> hook) {
  Hooks& h = TheHooks();
  std::lock_guard<std::mutex> lock(h.mu);
  if (!h.registered) {
    std::atexit([] { RunProcessExitHooks(); });
    h.registered = true;
  }
  h.pending.push_back(std::move(hook));
}

void RunProcessExitHooks() {
  std::vector<std::function<void()>> run;
  {
    Hooks& h = TheHooks();
    std::lock_guard<std::mutex> lock(h.mu);
    run.swap(h.pending);
  }
  for (auto it = run.rbegin(); it != run.rend(); ++it) (*it)();
}

}  // namespace roll
