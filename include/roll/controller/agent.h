#pragma once
// The node agent (`roll agent`): the per-node process of a multi-node job. It registers its
// node (address, cores, CUDA devices) with the controller, starts the
// workers the controller places on the node, reports how they end, and
// ends them all -- then itself -- when the controller shuts the job down or
// stays unreachable for longer than the grace period. docs/multinode.md.

#include <string>
#include <vector>

#include "roll/common/status.h"

namespace roll {

struct AgentOptions {
  std::string controller;       // host:port of the controller
  std::string token_file;       // the job token (runtime.token_file)
  std::string token;            // the token itself, when token_file is empty (a Slurm step's environment)
  std::string bind = "127.0.0.1";  // this node's address: the agent's and its workers' servers bind here
  int node_rank = -1;           // -1: the lowest free node rank
  std::string log_dir = "roll-agent-logs";
  double connect_timeout_s = 300;   // to reach the controller the first time
  double controller_grace_s = 10;   // then: unreachable this long ends the agent
  std::string tls_cert_file, tls_key_file, tls_ca_file;
};

// Runs until the job ends; the process exit code (0: shut down by the
// controller, 1: an error, 2: the controller was lost).
int RunAgent(const AgentOptions& options);

}  // namespace roll
