// The Slurm allocation as `roll run` and `roll agent --slurm` read it, from
// a made-up environment and a fake scontrol. The real cluster runs in
// tests/multinode/slurm_test.sh.

#include "roll/controller/slurm.h"

#include <unistd.h>

#include <map>

#include <gtest/gtest.h>

#include "absl/strings/str_join.h"

namespace roll {
namespace {

struct FakeSlurm {
  std::map<std::string, std::string> env = {
      {"SLURM_JOB_ID", "4242"},
      {"SLURM_JOB_NUM_NODES", "3"},
      {"SLURM_JOB_NODELIST", "gpu[07-09]"},
      {"SLURMD_NODENAME", "gpu07"},
      {"SLURM_CPUS_ON_NODE", "96"},
  };
  std::map<std::string, std::string> node_addr = {
      {"gpu07", "10.1.0.7"}, {"gpu08", "10.1.0.8"}, {"gpu09", "10.1.0.9"}};
  std::vector<std::string> calls;

  EnvLookup Env() {
    return [this](const std::string& name) -> std::optional<std::string> {
      auto it = env.find(name);
      if (it == env.end()) return std::nullopt;
      return it->second;
    };
  }
  CommandRunner Run() {
    return [this](const std::vector<std::string>& argv) -> absl::StatusOr<std::string> {
      calls.push_back(absl::StrJoin(argv, " "));
      if (argv.size() == 4 && argv[1] == "show" && argv[2] == "hostnames") {
        if (argv[3] != "gpu[07-09]") return absl::UnavailableError("unknown list");
        return std::string("gpu07\ngpu08\ngpu09\n");
      }
      if (argv.size() == 5 && argv[1] == "show" && argv[2] == "node") {
        auto it = node_addr.find(argv[4]);
        if (it == node_addr.end()) return absl::UnavailableError("Node " + argv[4] + " not found");
        return "NodeName=" + argv[4] + " Arch=x86_64 CoresPerSocket=1 NodeAddr=" + it->second +
               " NodeHostName=" + argv[4] + " State=ALLOCATED\n";
      }
      return absl::UnavailableError("unexpected command");
    };
  }
};

TEST(SlurmTest, OutsideSlurmThereIsNoAllocation) {
  FakeSlurm slurm;
  slurm.env.clear();
  auto a = ReadSlurmAllocation(slurm.Env(), slurm.Run());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_FALSE(a->has_value());
  EXPECT_TRUE(slurm.calls.empty());
}

TEST(SlurmTest, ReadsTheAllocationFromTheEnvironmentAndScontrol) {
  FakeSlurm slurm;
  slurm.env["SLURMD_NODENAME"] = "gpu08";
  slurm.env["SLURM_GPUS_ON_NODE"] = "8";
  auto a = ReadSlurmAllocation(slurm.Env(), slurm.Run());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(a->has_value());
  EXPECT_EQ((*a)->job_id, "4242");
  EXPECT_EQ((*a)->hosts, (std::vector<std::string>{"gpu07", "gpu08", "gpu09"}));
  EXPECT_EQ((*a)->num_nodes(), 3);
  EXPECT_EQ((*a)->host, "gpu08");
  EXPECT_EQ((*a)->node, 1);
  EXPECT_EQ((*a)->gpus_per_node, 8);
  EXPECT_EQ((*a)->cpus_per_node, 96);
  EXPECT_EQ((*a)->step_tasks, 0);
  auto address = SlurmNodeAddress(**a, "", slurm.Run());
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(*address, "10.1.0.8");
}

TEST(SlurmTest, MalformedAllocationsAreNamed) {
  {
    FakeSlurm slurm;
    slurm.env["SLURM_JOB_NUM_NODES"] = "2";
    auto a = ReadSlurmAllocation(slurm.Env(), slurm.Run());
    ASSERT_FALSE(a.ok());
    EXPECT_NE(a.status().message().find("SLURM_JOB_NUM_NODES=2"), std::string::npos) << a.status();
    EXPECT_NE(a.status().message().find("3 hosts"), std::string::npos) << a.status();
  }
  {
    FakeSlurm slurm;
    slurm.env["SLURMD_NODENAME"] = "login1";
    auto a = ReadSlurmAllocation(slurm.Env(), slurm.Run());
    ASSERT_FALSE(a.ok());
    EXPECT_NE(a.status().message().find("'login1'"), std::string::npos) << a.status();
  }
  {
    FakeSlurm slurm;
    slurm.env.erase("SLURM_JOB_NODELIST");
    auto a = ReadSlurmAllocation(slurm.Env(), slurm.Run());
    ASSERT_FALSE(a.ok());
    EXPECT_NE(a.status().message().find("SLURM_JOB_NODELIST"), std::string::npos) << a.status();
  }
  {
    FakeSlurm slurm;
    slurm.env["SLURM_GPUS_ON_NODE"] = "eight";
    auto a = ReadSlurmAllocation(slurm.Env(), slurm.Run());
    ASSERT_FALSE(a.ok());
    EXPECT_NE(a.status().message().find("SLURM_GPUS_ON_NODE='eight'"), std::string::npos) << a.status();
  }
  {
    FakeSlurm slurm;
    slurm.node_addr.erase("gpu07");
    auto a = ReadSlurmAllocation(slurm.Env(), slurm.Run());
    ASSERT_TRUE(a.ok() && a->has_value()) << a.status();
    auto address = SlurmNodeAddress(**a, "", slurm.Run());
    ASSERT_FALSE(address.ok());
    EXPECT_NE(address.status().message().find("gpu07"), std::string::npos) << address.status();
  }
}

SlurmAllocation Allocation(int nodes, int node = 0) {
  SlurmAllocation a;
  a.job_id = "77";
  for (int i = 0; i < nodes; ++i) a.hosts.push_back("n" + std::to_string(i));
  a.node = node;
  a.host = a.hosts[node];
  return a;
}

TEST(SlurmTest, TheConfigTakesNodeCountAndAddressFromTheAllocation) {
  PipelineConfig config;
  ASSERT_TRUE(ApplySlurmAllocation(Allocation(2), "10.0.0.1", &config).ok());
  EXPECT_EQ(config.num_nodes, 2);
  EXPECT_EQ(config.runtime.bind_address, "10.0.0.1");

  // An address the config names stays; a bind_interface replaces it.
  PipelineConfig named;
  named.runtime.bind_address = "192.168.5.5";
  ASSERT_TRUE(ApplySlurmAllocation(Allocation(2), "10.0.0.1", &named).ok());
  EXPECT_EQ(named.runtime.bind_address, "192.168.5.5");
  named.runtime.bind_interface = "ib0";
  ASSERT_TRUE(ApplySlurmAllocation(Allocation(2), "10.9.0.1", &named).ok());
  EXPECT_EQ(named.runtime.bind_address, "10.9.0.1");

  // A one-node allocation changes nothing.
  PipelineConfig single;
  ASSERT_TRUE(ApplySlurmAllocation(Allocation(1), "10.0.0.1", &single).ok());
  EXPECT_EQ(single.num_nodes, 1);
  EXPECT_EQ(single.runtime.bind_address, "127.0.0.1");
}

TEST(SlurmTest, ConfigsThatDisagreeWithTheAllocationAreRefused) {
  PipelineConfig config;
  config.num_nodes = 3;
  absl::Status s = ApplySlurmAllocation(Allocation(2), "10.0.0.1", &config);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("num_nodes: the config says 3"), std::string::npos) << s;
  EXPECT_NE(s.message().find("has 2 nodes"), std::string::npos) << s;

  PipelineConfig matching;
  matching.num_nodes = 2;
  EXPECT_TRUE(ApplySlurmAllocation(Allocation(2), "10.0.0.1", &matching).ok());

  PipelineConfig gpus;
  gpus.device_type = DeviceType::kCuda;
  gpus.num_gpus_per_node = 8;
  SlurmAllocation four = Allocation(2);
  four.gpus_per_node = 4;
  s = ApplySlurmAllocation(four, "10.0.0.1", &gpus);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("num_gpus_per_node: the config says 8"), std::string::npos) << s;
  EXPECT_NE(s.message().find("4 GPUs"), std::string::npos) << s;

  PipelineConfig other;
  s = ApplySlurmAllocation(Allocation(2, 1), "10.0.0.2", &other);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("first node (n0); this is node 1 (n1)"), std::string::npos) << s;

  SlurmAllocation step = Allocation(2);
  step.step_tasks = 2;
  s = ApplySlurmAllocation(step, "10.0.0.1", &other);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("SLURM_STEP_NUM_TASKS=2"), std::string::npos) << s;
}

TEST(SlurmTest, TheAgentStepRunsOneAgentOnEachOtherNodeWithoutTheTokenInItsArguments) {
  SlurmAllocation a = Allocation(4);
  a.cpus_per_node = 32;
  a.gpus_per_node = 8;
  RuntimeConfig rt;
  rt.controller_grace_s = 7;
  rt.bind_interface = "ib0";
  const std::vector<std::string> argv = SlurmAgentStep(a, "/opt/roll/bin/roll", "10.0.0.1:29400", rt, "/out/logs");
  const std::string line = absl::StrJoin(argv, " ");
  EXPECT_EQ(argv[0], "srun");
  for (const char* part : {"--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--relative=1", "--kill-on-bad-exit=1",
                           "--cpus-per-task=32", "--gres=gpu:8",
                           "/opt/roll/bin/roll agent --slurm --controller 10.0.0.1:29400 --log-dir /out/logs "
                           "--controller-grace-s 7 --bind-interface ib0"}) {
    EXPECT_NE(line.find(part), std::string::npos) << part << " not in: " << line;
  }
  EXPECT_EQ(line.find("token"), std::string::npos) << line;
}

TEST(SlurmTest, InterfaceAddresses) {
  auto lo = InterfaceAddress("lo");
  ASSERT_TRUE(lo.ok()) << lo.status();
  EXPECT_EQ(*lo, "127.0.0.1");
  auto none = InterfaceAddress("nosuchif0");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("'nosuchif0'"), std::string::npos) << none.status();
  EXPECT_NE(none.status().message().find("lo"), std::string::npos) << none.status();
}

TEST(SlurmTest, RunCommandOutputReturnsOutputOrNamesTheFailure) {
  auto out = RunCommandOutput({"echo", "node0", "node1"});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "node0 node1\n");
  auto failed = RunCommandOutput({"sh", "-c", "echo no such node >&2; exit 3"});
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.status().message().find("exit code 3"), std::string::npos) << failed.status();
  EXPECT_NE(failed.status().message().find("no such node"), std::string::npos) << failed.status();
  auto missing = RunCommandOutput({"roll-no-such-command"});
  EXPECT_FALSE(missing.ok());
  auto sh = FindOnPath("sh");
  ASSERT_TRUE(sh.ok()) << sh.status();
  EXPECT_EQ(access(sh->c_str(), X_OK), 0) << *sh;
  auto none = FindOnPath("roll-no-such-command");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("not on PATH"), std::string::npos) << none.status();
}

}  // namespace
}  // namespace roll
