// The pipelines that ship with the library. Each registers itself
// (ROLL_REGISTER_PIPELINE, as a user's pipeline does); calling into its file
// here keeps that file, and so its registration, in the static library's
// link.

#include "roll/pipeline/pipeline.h"

namespace roll {

void LinkRlvrPipeline();     // rlvr/rlvr_pipeline.cc
void LinkAgenticPipeline();  // agentic/agentic_pipeline.cc

void RegisterBuiltinPipelines() {
  LinkRlvrPipeline();
  LinkAgenticPipeline();
}

}  // namespace roll
