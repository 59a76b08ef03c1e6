#pragma once
// Helpers shared by every gRPC client and server of roll-cpp: the job token,
// status conversion and channel construction. Private to the library.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace roll::rpc {

// Metadata key that carries the per-job token on every call.
inline constexpr char kTokenKey[] = "x-roll-token";

// absl and gRPC share the canonical code numbering.
grpc::Status ToGrpc(const absl::Status& s);
absl::Status FromGrpc(const grpc::Status& s);

// True when the server-side context carries `token`. Compares in constant time.
bool HasToken(const grpc::CallbackServerContext* ctx, std::string_view token);
// The refusal every handler sends for a missing or wrong token.
grpc::Status TokenRefused();

// Transport security of this process's control plane. Without TLS (the
// default) channels and servers are plaintext and the job token alone
// guards every call. With TLS, servers present `cert`/`key` and clients
// trust only `ca` (the certificate itself when self-signed). Set once at
// start-up, before any channel or server exists; read-only afterwards.
struct TlsFiles {
  std::string cert, key, ca;  // PEM files; all empty: no TLS
};
// Reads the three files; InvalidArgument naming a missing or non-PEM file,
// or a partial set.
absl::Status ConfigureTls(const TlsFiles& files);
// The environment variables that carry the files to worker processes.
inline constexpr char kTlsCertEnv[] = "ROLL_TLS_CERT";
inline constexpr char kTlsKeyEnv[] = "ROLL_TLS_KEY";
inline constexpr char kTlsCaEnv[] = "ROLL_TLS_CA";
// Credentials for a server's listening port / a client channel.
std::shared_ptr<grpc::ServerCredentials> ServerCredentials();
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials();

// A channel to `address` with keepalive and no proxy, over TLS when
// configured; one per peer, created once.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address);
// Attaches the token and a deadline `timeout` from now.
void PrepareContext(grpc::ClientContext* ctx, std::string_view token, absl::Duration timeout);

// A fresh job token: 32 hex digits from the system's random device.
std::string RandomToken();

// Server builder defaults shared by workers and the controller (a port
// that another process listens on already is an error, not shared).
void ConfigureServerBuilder(grpc::ServerBuilder* builder);

// The heartbeat of a process that must not outlive its controller (workers,
// node agents): pings `controller` as (`cluster`, `rank`) every
// min(0.5 s, grace_s / 4). Between pings it calls `wait_stop(period)`,
// which waits up to that long and returns true once the caller wants the
// watch to end. Returns OK then; Unauthenticated when the controller refuses
// `token`; Unavailable ("controller H:P unreachable for more than G s: ...")
// when no ping succeeded for longer than `grace_s`.
absl::Status WatchController(const std::string& controller, std::string_view token, const std::string& cluster,
                             int rank, double grace_s,
                             const std::function<bool(std::chrono::milliseconds)>& wait_stop);

}  // namespace roll::rpc
