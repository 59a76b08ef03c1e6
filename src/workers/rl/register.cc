#include "roll/worker/rl_workers.h"

namespace roll {

void RegisterActorWorker();
void RegisterCriticWorker();
void RegisterRewardWorker();
void RegisterEnvironmentWorker();

void RegisterRlWorkers() {
  RegisterActorWorker();
  RegisterCriticWorker();
  RegisterRewardWorker();
  RegisterEnvironmentWorker();
}

}  // namespace roll
