#pragma once
// Work a process must do however it ends normally -- stop the servers it
// started, remove its temporary directories -- also where it leaves with
// _exit (the worker runtime, which must not unwind threads that still hold
// gRPC state). The hooks run once, the last added first: at std::exit, or
// when RunProcessExitHooks is called. Thread-safe.

#include <functional>

namespace roll {

void AtProcessExit(std::function<void()> hook);
// Runs the hooks not run yet (a second call does nothing).
void RunProcessExitHooks();

}  // namespace roll
