// Multi-node on one machine: `roll agent` processes on loopback act as the
// other nodes. The controller waits for them, starts the workers placed on
// their node through them, and shuts them down with the job; an agent
// refuses what no controller of its job would send.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <filesystem>
#include <fstream>
#include <optional>

#include "controller/controller_service.h"
#include "testing/processes.h"
#include "roll/controller/controller.h"
#include "roll/controller/launcher.h"
#include "roll/worker/debug_worker.h"
#include "rpc/rpc_util.h"
#include "worker.grpc.pb.h"

namespace roll {
namespace {

namespace fs = std::filesystem;
constexpr char kToken[] = "0123456789abcdef0123456789abcdef";

// A port nothing listens on right now.
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

class AgentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("agent");
    token_file_ = dir_ + "/token";
    std::ofstream(token_file_) << kToken << "\n";
  }
  void TearDown() override {
    for (pid_t pid : agents_) {
      launcher_.Signal(pid, SIGKILL);
      launcher_.WaitExit(pid, 5);
    }
    fs::remove_all(dir_);
  }

  // Starts `roll agent` for the controller at `controller`; its output goes to <dir>/<name>.log.
  pid_t StartAgent(const std::string& controller, const std::string& name, const std::string& token_file,
                   std::vector<std::string> extra = {}) {
    LaunchSpec spec;
    spec.argv = {testing::RollBinary(), "agent", "--controller", controller, "--token-file", token_file,
                 "--log-dir", dir_ + "/" + name + "_logs", "--connect-timeout-s", "30", "--controller-grace-s", "2"};
    spec.argv.insert(spec.argv.end(), extra.begin(), extra.end());
    spec.log_path = dir_ + "/" + name + ".log";
    auto pid = launcher_.Launch(spec);
    EXPECT_TRUE(pid.ok()) << pid.status();
    agents_.push_back(*pid);
    return *pid;
  }
  // How the agent ended, after up to `seconds`; nullopt while it runs.
  std::optional<std::string> AgentExit(pid_t pid, double seconds) {
    launcher_.WaitExit(pid, seconds);
    return launcher_.ExitStatus(pid);
  }

  PipelineConfig TwoNodeConfig(int port) {
    const std::string yaml = absl::StrCat(
        "exp_name: agent_test\noutput_dir: ", dir_, "/out\nnum_nodes: 2\n",
        "workers:\n  worker_cls: debug\n  world_size: 3\nruntime:\n  worker_binary: ", testing::RollBinary(),
        "\n  controller_port: ", port, "\n  token_file: ", token_file_, "\n  node_timeout_s: 30\n",
        "  health_check_interval_s: 0.2\n  worker_timeout_s: 3\n");
    LoadOptions load;
    load.extra_roles = {"workers"};
    auto config = ParsePipelineConfig(yaml, "<test>", {}, load);
    EXPECT_TRUE(config.ok()) << config.status();
    return *config;
  }

  std::string dir_, token_file_;
  LocalLauncher launcher_;
  std::vector<pid_t> agents_;
};

TEST_F(AgentTest, WorkersOfAnotherNodeRunThroughItsAgentAndEndWithTheJob) {
  const int port = FreePort();
  // The agent starts first and retries until the controller listens.
  const pid_t agent = StartAgent(absl::StrCat("127.0.0.1:", port), "agent", token_file_);
  ControllerOptions options;
  options.load.extra_roles = {"workers"};
  auto controller = Controller::Create(TwoNodeConfig(port), options);
  ASSERT_TRUE(controller.ok()) << controller.status() << testing::ReadFile(dir_ + "/agent.log");
  auto cluster = (*controller)->StartCluster<DebugApi>("workers");
  ASSERT_TRUE(cluster.ok()) << cluster.status() << testing::ReadFile(dir_ + "/agent.log");

  // Workers without devices are spread over the nodes: rank 1 on node 1.
  const auto workers = (*cluster)->workers();
  ASSERT_EQ(workers.size(), 3u);
  EXPECT_EQ(workers[0].node, 0);
  EXPECT_EQ(workers[1].node, 1);
  EXPECT_EQ(workers[2].node, 0);
  EXPECT_TRUE(fs::exists(dir_ + "/agent_logs/workers_1.log"));
  EXPECT_FALSE(fs::exists(dir_ + "/out/logs/workers_1.log"));
  EXPECT_TRUE(fs::exists(dir_ + "/out/logs/workers_0.log"));
  auto replies = (*cluster)->CallEach(debug::kWhoAmI, std::vector<Batch>(3)).Replies();
  ASSERT_TRUE(replies.ok()) << replies.status();
  for (int r = 0; r < 3; ++r) {
    auto rank = (*replies)[r].Column("rank");
    ASSERT_TRUE(rank.ok()) << rank.status();
    EXPECT_EQ((**rank)[0], std::to_string(r));
  }

  // A remote worker's death is detected and named with its node.
  const pid_t remote = PidOnNode(workers[1].pid);
  ASSERT_TRUE(testing::ProcessAlive(remote));
  kill(remote, SIGKILL);
  auto after = (*cluster)->CallEach(debug::kWhoAmI, std::vector<Batch>(3)).Replies();
  ASSERT_FALSE(after.ok());
  EXPECT_NE(after.status().message().find("rank 1 (node 1 pid " + std::to_string(remote)), std::string::npos)
      << after.status();

  // The job ends: the agent ends its workers and exits cleanly.
  cluster->reset();
  controller->reset();
  auto how = AgentExit(agent, 10);
  ASSERT_TRUE(how.has_value()) << "the agent outlived its job";
  EXPECT_EQ(*how, "exited with code 0") << testing::ReadFile(dir_ + "/agent.log");
  EXPECT_NE(testing::ReadFile(dir_ + "/agent.log").find("the controller ended the job"), std::string::npos);
}

TEST_F(AgentTest, ControllerNamesTheNodesThatNeverRegistered) {
  ControllerOptions options;
  options.load.extra_roles = {"workers"};
  PipelineConfig config = TwoNodeConfig(FreePort());
  config.runtime.node_timeout_s = 0.5;
  auto controller = Controller::Create(config, options);
  ASSERT_FALSE(controller.ok());
  EXPECT_EQ(controller.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(controller.status().message().find("nodes 1 of num_nodes=2 did not register within 500ms "
                                               "(runtime.node_timeout_s)"),
            std::string::npos)
      << controller.status();
}

TEST_F(AgentTest, MultiNodeJobNeedsATokenFile) {
  PipelineConfig config = TwoNodeConfig(FreePort());
  config.runtime.token_file.clear();
  ControllerOptions options;
  options.load.extra_roles = {"workers"};
  auto controller = Controller::Create(config, options);
  ASSERT_FALSE(controller.ok());
  EXPECT_NE(controller.status().message().find("runtime.token_file"), std::string::npos) << controller.status();
}

// A stand-in controller: its registration service only.
class FakeController {
 public:
  FakeController() : service_(kToken) {
    service_.ExpectNodes(2);
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(&service_);
    server_ = b.BuildAndStart();
  }
  ~FakeController() { Stop(); }
  void Stop() {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
    server_.reset();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  ControllerService& service() { return service_; }

 private:
  ControllerService service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

grpc::Status Launch(rpc::Agent::Stub& stub, const std::string& token, std::vector<std::string> argv,
                    std::map<std::string, std::string> env, const std::string& log_name, pid_t* pid = nullptr) {
  rpc::LaunchRequest req;
  for (auto& a : argv) req.add_argv(a);
  for (auto& [k, v] : env) (*req.mutable_env())[k] = v;
  req.set_log_name(log_name);
  rpc::LaunchReply reply;
  grpc::ClientContext ctx;
  rpc::PrepareContext(&ctx, token, absl::Seconds(10));
  grpc::Status s = stub.Launch(&ctx, req, &reply);
  if (pid != nullptr) *pid = static_cast<pid_t>(reply.pid());
  return s;
}

TEST_F(AgentTest, AgentRefusesWhatItsControllerWouldNeverSend) {
  FakeController fake;
  const pid_t agent = StartAgent(fake.address(), "agent", token_file_);
  auto nodes = fake.service().WaitForNodes(absl::Seconds(20), "test");
  ASSERT_TRUE(nodes.ok()) << nodes.status() << testing::ReadFile(dir_ + "/agent.log");
  const NodeRegistration& node = nodes->at(1);
  EXPECT_EQ(node.node_address, "127.0.0.1");
  EXPECT_GE(node.cpu_cores, 1);
  auto stub = rpc::Agent::NewStub(rpc::MakeChannel(node.agent_address));

  const std::vector<std::string> worker = {"roll",    "worker", "--type", "debug",
                                           "--cluster", "w",    "--rank", "0"};
  EXPECT_EQ(Launch(*stub, "wrong-token", worker, {}, "w.log").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  // Only `roll worker`, logs inside its log directory, a worker's variables.
  EXPECT_EQ(Launch(*stub, kToken, {"sh", "-c", "true", "", "", "", "", ""}, {}, "w.log").error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Launch(*stub, kToken, worker, {}, "../w.log").error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  grpc::Status env = Launch(*stub, kToken, worker, {{"LD_PRELOAD", "x.so"}}, "w.log");
  EXPECT_EQ(env.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(env.error_message().find("LD_PRELOAD"), std::string::npos) << env.error_message();
  // Processes it did not start are not its to signal or watch.
  {
    rpc::SignalRequest req;
    req.set_pid(getpid());
    req.set_signal(SIGKILL);
    rpc::SignalReply reply;
    grpc::ClientContext ctx;
    rpc::PrepareContext(&ctx, kToken, absl::Seconds(5));
    EXPECT_EQ(stub->Signal(&ctx, req, &reply).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  // A second agent cannot take the same node; one with another token is refused.
  const std::string other_token = dir_ + "/other_token";
  std::ofstream(other_token) << "fedcba9876543210fedcba9876543210\n";
  const pid_t twin = StartAgent(fake.address(), "twin", token_file_, {"--node-rank", "1"});
  const pid_t stranger = StartAgent(fake.address(), "stranger", other_token);
  EXPECT_EQ(AgentExit(twin, 20).value_or("running"), "exited with code 1");
  EXPECT_NE(testing::ReadFile(dir_ + "/twin.log").find("node 1 is registered already"), std::string::npos)
      << testing::ReadFile(dir_ + "/twin.log");
  EXPECT_EQ(AgentExit(stranger, 20).value_or("running"), "exited with code 1");
  EXPECT_NE(testing::ReadFile(dir_ + "/stranger.log").find("token"), std::string::npos) << testing::ReadFile(dir_ + "/stranger.log");

  // Losing its controller for longer than the grace period ends the agent.
  EXPECT_FALSE(AgentExit(agent, 0).has_value());
  fake.Stop();
  EXPECT_EQ(AgentExit(agent, 15).value_or("running"), "exited with code 2");
  EXPECT_NE(testing::ReadFile(dir_ + "/agent.log").find("unreachable"), std::string::npos) << testing::ReadFile(dir_ + "/agent.log");
}

TEST_F(AgentTest, AgentEndsItsWorkersWhenTheJobEnds) {
  FakeController fake;
  const pid_t agent = StartAgent(fake.address(), "agent", token_file_);
  auto nodes = fake.service().WaitForNodes(absl::Seconds(20), "test");
  ASSERT_TRUE(nodes.ok()) << nodes.status() << testing::ReadFile(dir_ + "/agent.log");
  auto stub = rpc::Agent::NewStub(rpc::MakeChannel(nodes->at(1).agent_address));
  // A real worker, started the way the controller starts one (it registers
  // with and pings the stand-in controller).
  pid_t worker = 0;
  grpc::Status launched = Launch(*stub, kToken,
                                 {"roll", "worker", "--type", "debug", "--cluster", "w", "--rank", "0",
                                  "--world-size", "1", "--controller", fake.address(), "--controller-grace-s", "30"},
                                 {{"ROLL_JOB_TOKEN", kToken}}, "w_0.log", &worker);
  ASSERT_TRUE(launched.ok()) << launched.error_message();
  auto regs = fake.service().WaitForCluster("w", {0}, absl::Seconds(20), [] { return absl::OkStatus(); });
  ASSERT_TRUE(regs.ok()) << regs.status() << testing::ReadFile(dir_ + "/agent_logs/w_0.log");
  EXPECT_EQ(regs->at(0).pid, worker);
  EXPECT_TRUE(testing::ProcessAlive(worker));

  // The controller ends the job: the agent ends the worker (long before the
  // worker's own 30 s watchdog would), then exits cleanly.
  {
    grpc::ClientContext ctx;
    rpc::PrepareContext(&ctx, kToken, absl::Seconds(5));
    rpc::ShutdownReply reply;
    ASSERT_TRUE(stub->Shutdown(&ctx, rpc::ShutdownRequest(), &reply).ok());
  }
  EXPECT_EQ(AgentExit(agent, 15).value_or("running"), "exited with code 0") << testing::ReadFile(dir_ + "/agent.log");
  EXPECT_TRUE(testing::WaitGone(worker, 1)) << "the agent's worker outlived it";
}

TEST_F(AgentTest, AgentNeedsAReadableToken) {
  const pid_t agent = StartAgent("127.0.0.1:1", "agent", dir_ + "/missing");
  EXPECT_EQ(AgentExit(agent, 10).value_or("running"), "exited with code 1");
  EXPECT_NE(testing::ReadFile(dir_ + "/agent.log").find("--token-file: cannot read"), std::string::npos)
      << testing::ReadFile(dir_ + "/agent.log");
}

}  // namespace
}  // namespace roll
