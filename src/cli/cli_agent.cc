// `roll agent`: parses its flags and runs the node agent (docs/multinode.md).

#include <iostream>

#include "cli/cli.h"
#include "roll/common/cli_args.h"
#include "roll/controller/agent.h"

namespace roll {

int AgentCommand(const std::vector<std::string>& args) {
  auto flags = CliArgs::Parse(args,
                              {"controller", "token-file", "bind", "node-rank", "log-dir", "connect-timeout-s",
                               "controller-grace-s", "tls-cert", "tls-key", "tls-ca"},
                              {});
  auto bad = [](const absl::Status& s) {
    std::cerr << "roll agent: " << s.message() << "\n";
    return 2;
  };
  if (!flags.ok()) return bad(flags.status());
  AgentOptions o;
  o.controller = flags->Get("controller", "");
  o.token_file = flags->Get("token-file", "");
  if (o.controller.empty() || o.token_file.empty()) {
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
  return RunAgent(o);
}

}  // namespace roll
