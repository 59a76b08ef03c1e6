// A worker started without a parent-death signal (as a node agent starts it)
// must still exit when its controller goes away: its heartbeat watchdog ends it.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include "controller/controller_service.h"
#include "testing/processes.h"
#include "rpc/rpc_util.h"

namespace roll {
namespace {

pid_t SpawnWorker(const std::string& controller, const std::string& token, double grace_s) {
  pid_t pid = fork();
  if (pid == 0) {
    setenv("ROLL_JOB_TOKEN", token.c_str(), 1);
    const std::string bin = testing::RollBinary();
    const std::string grace = std::to_string(grace_s);
    execl(bin.c_str(), bin.c_str(), "worker", "--type", "debug", "--cluster", "w", "--rank", "0",
          "--world-size", "1", "--controller", controller.c_str(), "--controller-grace-s", grace.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

bool ExitsWithin(pid_t pid, double seconds, int* code) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      *code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return false;
}

// The controller's registration service alone, on a free loopback port,
// expecting the token "job-token".
struct FakeController {
  FakeController() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port); }

  ControllerService service{"job-token"};
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

TEST(WorkerWatchdogTest, ExitsWhenTheControllerStopsAnswering) {
  FakeController controller;
  ASSERT_NE(controller.port, 0);
  const pid_t worker = SpawnWorker(controller.address(), "job-token", 1.0);
  auto regs = controller.service.WaitForCluster("w", {0}, absl::Seconds(30), [] { return absl::OkStatus(); });
  ASSERT_TRUE(regs.ok()) << regs.status();
  EXPECT_EQ((*regs)[0].pid, worker);
  // Alive while the controller answers.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  ASSERT_TRUE(testing::ProcessAlive(worker));
  controller.server->Shutdown(std::chrono::system_clock::now());
  int code = 0;
  EXPECT_TRUE(ExitsWithin(worker, 5.0, &code));
  EXPECT_EQ(code, 2);
}

TEST(WorkerWatchdogTest, WorkerWithTheWrongTokenCannotRegister) {
  FakeController controller;
  ASSERT_NE(controller.port, 0);
  const pid_t worker = SpawnWorker(controller.address(), "not-the-token", 5.0);
  int code = 0;
  EXPECT_TRUE(ExitsWithin(worker, 10.0, &code));
  EXPECT_EQ(code, 2);
  auto regs = controller.service.WaitForCluster("w", {0}, absl::Milliseconds(50), [] { return absl::OkStatus(); });
  EXPECT_FALSE(regs.ok());
}

}  // namespace
}  // namespace roll
