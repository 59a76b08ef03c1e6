#include "roll/scheduler/device_mapping.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <string>
#include <thread>

namespace roll {
namespace {

PipelineConfig Parse(const std::string& yaml) {
  auto cfg = ParsePipelineConfig("exp_name: t\n" + yaml, "test.yaml");
  EXPECT_TRUE(cfg.ok()) << cfg.status();
  return cfg.ok() ? *cfg : PipelineConfig();
}

std::string Error(const std::string& yaml, int host_cores = 8) {
  auto m = DeviceMapping::Build(Parse(yaml), host_cores);
  return m.ok() ? "ok" : std::string(m.status().message());
}

TEST(DeviceMappingTest, ColocatedAndDisjointClustersOnOneNode) {
  const PipelineConfig cfg = Parse(R"y(
num_gpus_per_node: 4
actor_train: {worker_cls: actor, device_mapping: "list(range(0,4))", num_gpus_per_worker: 2}
actor_infer: {worker_cls: actor, device_mapping: [0, 1, 2, 3]}
reference: {worker_cls: actor, device_mapping: [3]}
rewards:
  math: {worker_cls: reward, world_size: 2}
)y");
  auto m = DeviceMapping::Build(cfg, 8);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->workers().size(), 2u + 4u + 1u + 2u);
  const WorkerPlacement* t1 = m->Find("actor_train", 1);
  ASSERT_NE(t1, nullptr);
  EXPECT_EQ(t1->devices, (std::vector<int>{2, 3}));
  EXPECT_EQ(t1->node, 0);
  EXPECT_EQ(t1->threads, 2) << "two CPU slots of one thread";
  EXPECT_EQ(t1->colocated_with,
            (std::vector<std::string>{"actor_infer:2", "actor_infer:3", "reference:0"}));
  EXPECT_EQ(m->Find("actor_infer", 0)->colocated_with, (std::vector<std::string>{"actor_train:0"}));
  EXPECT_EQ(m->ColocatedClusters("actor_train"), (std::vector<std::string>{"actor_infer", "reference"}));
  EXPECT_EQ(m->ColocatedClusters("rewards.math"), std::vector<std::string>{});
  const WorkerPlacement* r = m->Find("rewards.math", 1);
  ASSERT_NE(r, nullptr);
  EXPECT_TRUE(r->devices.empty());
  EXPECT_EQ(r->threads, 4) << "no device: the host's cores over the cluster's workers";
  EXPECT_EQ(m->Find("actor_train", 2), nullptr);

  const std::string table = m->Table();
  EXPECT_NE(table.find("1 node(s) x 4 cpu device(s)"), std::string::npos) << table;
  EXPECT_NE(table.find("actor_train      1     0  2,3"), std::string::npos) << table;
  EXPECT_NE(table.find("actor_infer:2 actor_infer:3 reference:0"), std::string::npos) << table;
}

TEST(DeviceMappingTest, DevicesMapToNodesAndSlotsCarryTheirThreads) {
  const PipelineConfig cfg = Parse(R"y(
num_nodes: 2
num_gpus_per_node: 2
cpu_threads_per_slot: 3
actor_train: {worker_cls: actor, device_mapping: [0, 1, 2, 3], num_gpus_per_worker: 2}
actor_infer: {worker_cls: actor, device_mapping: [3]}
rewards:
  math: {worker_cls: reward, world_size: 3}
)y");
  auto m = DeviceMapping::Build(cfg, 2);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->Find("actor_train", 0)->node, 0);
  EXPECT_EQ(m->Find("actor_train", 1)->node, 1);
  EXPECT_EQ(m->Find("actor_train", 1)->local_devices, (std::vector<int>{0, 1}));
  EXPECT_EQ(m->Find("actor_train", 1)->threads, 6);
  EXPECT_EQ(m->Find("actor_infer", 0)->node, 1);
  EXPECT_EQ(m->Find("actor_infer", 0)->local_devices, std::vector<int>{1});
  // Deviceless workers are spread over the nodes.
  EXPECT_EQ(m->Find("rewards.math", 0)->node, 0);
  EXPECT_EQ(m->Find("rewards.math", 1)->node, 1);
  EXPECT_EQ(m->Find("rewards.math", 2)->node, 0);
}

TEST(DeviceMappingTest, CpuSlotsDeriveFromTheHostCores) {
  const std::string yaml = "cpu_threads_per_slot: 2\nactor_train: {worker_cls: actor, device_mapping: [0, 3]}\n";
  // 8 cores / 2 threads = 4 slots: index 3 exists.
  EXPECT_EQ(Error(yaml, 8), "ok");
  // 4 cores: 2 slots, index 3 does not.
  EXPECT_EQ(Error(yaml, 4),
            "actor_train.device_mapping: device 3 is beyond the job's 2 devices (num_nodes=1 x "
            "num_gpus_per_node=2, derived from 4 cores)");
}

TEST(DeviceMappingTest, HostCoresAreTheCoresThisProcessMayRunOn) {
  // A job bound to one core (taskset, a cgroup cpuset, a Slurm binding) must
  // not size its slots and threads by the whole machine's cores.
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  EXPECT_EQ(HostCores(), CPU_COUNT(&all));
  EXPECT_LE(HostCores(), static_cast<int>(std::thread::hardware_concurrency()));
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const int bound = HostCores();
  ASSERT_EQ(sched_setaffinity(0, sizeof(all), &all), 0);
  EXPECT_EQ(bound, 1);
}

TEST(DeviceMappingTest, ImpossiblePlacementsAreClearErrors) {
  EXPECT_EQ(Error("num_gpus_per_node: 4\nactor_infer: {worker_cls: actor, device_mapping: [0, 9]}\n"),
            "actor_infer.device_mapping: device 9 is beyond the job's 4 devices (num_nodes=1 x "
            "num_gpus_per_node=4)");
  EXPECT_EQ(Error("num_nodes: 2\nnum_gpus_per_node: 4\n"
                  "actor_train: {worker_cls: actor, device_mapping: [2, 3, 4, 5], num_gpus_per_worker: 4}\n"),
            "actor_train rank 0: devices [2, 3, 4, 5] span nodes 0 and 1; a worker must sit on one node "
            "(num_gpus_per_worker=4, num_gpus_per_node=4)");
  EXPECT_EQ(Error("device_type: cuda\nactor_train: {worker_cls: actor, device_mapping: [0]}\n"),
            "device_type cuda needs num_gpus_per_node (the GPUs of each node)");
}

}  // namespace
}  // namespace roll
