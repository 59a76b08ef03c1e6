// `roll agent`: parses its flags and runs the node agent (docs/multinode.md).

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "cli/cli.h"
#include "roll/common/cli_args.h"
#include "roll/controller/agent.h"
#include "roll/controller/slurm.h"

namespace roll {

namespace {

// `--slurm`: the agent is a task of the job step `roll run` started with
// srun. Its node rank is its node's place in the allocation, its address
// that of the node (or of --bind-interface), and the token comes in the
// step's environment, which the agent then removes from its own (its
// workers get the token the usual way).
absl::Status FromSlurm(const CliArgs& flags, AgentOptions* o) {
  ROLL_ASSIGN_OR_RETURN(std::optional<SlurmAllocation> slurm, ReadSlurmAllocation());
  if (!slurm) return absl::FailedPreconditionError("--slurm: not inside a Slurm job (SLURM_JOB_ID is not set)");
  if (slurm->node == 0) {
    return absl::FailedPreconditionError(absl::StrCat("--slurm: this is node 0 of Slurm job ", slurm->job_id, " (",
                                                      slurm->host, "), where roll run runs the controller"));
  }
  o->node_rank = slurm->node;
  // --bind, when given, is in o->bind already.
  if (!flags.Has("bind")) {
    ROLL_ASSIGN_OR_RETURN(o->bind, SlurmNodeAddress(*slurm, flags.Get("bind-interface", "")));
  }
  o->log_dir = (std::filesystem::path(o->log_dir) / absl::StrCat("node", slurm->node)).string();
  if (o->token_file.empty()) {
    const char* token = std::getenv(kSlurmTokenEnv);
    if (token == nullptr || *token == '\0') {
      return absl::FailedPreconditionError(
          absl::StrCat("--slurm: no --token-file and no ", kSlurmTokenEnv, " in the environment"));
    }
    o->token = token;
    unsetenv(kSlurmTokenEnv);
  }
  return absl::OkStatus();
}

}  // namespace

int AgentCommand(const std::vector<std::string>& args) {
  auto flags = CliArgs::Parse(args,
                              {"controller", "token-file", "bind", "bind-interface", "node-rank", "log-dir",
                               "connect-timeout-s", "controller-grace-s", "tls-cert", "tls-key", "tls-ca"},
                              {"slurm"});
  auto bad = [](const absl::Status& s) {
    std::cerr << "roll agent: " << s.message() << "\n";
    return 2;
  };
  if (!flags.ok()) return bad(flags.status());
  AgentOptions o;
  o.controller = flags->Get("controller", "");
  o.token_file = flags->Get("token-file", "");
  const bool slurm = flags->Has("slurm");
  if (o.controller.empty() || (o.token_file.empty() && !slurm)) {
    return bad(absl::InvalidArgumentError("--controller HOST:PORT and --token-file FILE are required"));
  }
  o.bind = flags->Get("bind", o.bind);
  o.log_dir = flags->Get("log-dir", o.log_dir);
  o.tls_cert_file = flags->Get("tls-cert", "");
  o.tls_key_file = flags->Get("tls-key", "");
  o.tls_ca_file = flags->Get("tls-ca", "");
  auto node = flags->GetInt("node-rank", -1);
  auto connect = flags->GetDouble("connect-timeout-s", o.connect_timeout_s);
  auto grace = flags->GetDouble("controller-grace-s", o.controller_grace_s);
  for (const absl::Status& s : {node.status(), connect.status(), grace.status()}) {
    if (!s.ok()) return bad(s);
  }
  if (*connect <= 0 || *grace <= 0) return bad(absl::InvalidArgumentError("timeouts must be > 0"));
  o.node_rank = static_cast<int>(*node);
  o.connect_timeout_s = *connect;
  o.controller_grace_s = *grace;
  if (slurm) {
    if (flags->Has("node-rank")) return bad(absl::InvalidArgumentError("--slurm takes the node rank from Slurm: drop --node-rank"));
    if (absl::Status s = FromSlurm(*flags, &o); !s.ok()) return bad(s);
  } else if (flags->Has("bind-interface")) {
    if (flags->Has("bind")) return bad(absl::InvalidArgumentError("--bind and --bind-interface exclude each other"));
    auto address = InterfaceAddress(flags->Get("bind-interface"));
    if (!address.ok()) return bad(address.status());
    o.bind = *address;
  }
  return RunAgent(o);
}

}  // namespace roll
