#include "roll/worker/rl_workers.h"

namespace roll {

void RegisterActorWorker();
void RegisterCriticWorker();
void RegisterRewardWorker();

void RegisterRlWorkers() {
  RegisterActorWorker();
  RegisterCriticWorker();
  RegisterRewardWorker();
}

}  // namespace roll
