// The pipelines that ship with the library, registered by name.

#include <mutex>

#include "roll/pipeline/pipeline.h"

namespace roll {

void RegisterRlvrPipeline();     // rlvr/rlvr_pipeline.cc
void RegisterAgenticPipeline();  // agentic/agentic_pipeline.cc

void RegisterBuiltinPipelines() {
  static std::once_flag once;
  std::call_once(once, [] {
    RegisterRlvrPipeline();
    RegisterAgenticPipeline();
  });
}

}  // namespace roll
