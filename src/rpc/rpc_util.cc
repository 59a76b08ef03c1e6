#include "rpc/rpc_util.h"

#include <chrono>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "worker.grpc.pb.h"

namespace roll::rpc {
namespace {

struct TlsState {
  bool enabled = false;
  std::string cert, key, ca;  // PEM text
};
TlsState& Tls() {
  static TlsState* s = new TlsState;
  return *s;
}

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what, const char* marker) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::InvalidArgumentError(absl::StrCat("TLS ", what, " file '", path, "' cannot be read"));
  std::stringstream ss;
  ss << f.rdbuf();
  std::string text = ss.str();
  if (text.find(marker) == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS ", what, " file '", path, "' is not PEM (no '", marker, "' line)"));
  }
  return text;
}

}  // namespace

absl::Status ConfigureTls(const TlsFiles& files) {
  TlsState& t = Tls();
  if (files.cert.empty() && files.key.empty() && files.ca.empty()) {
    t = TlsState();
    return absl::OkStatus();
  }
  if (files.cert.empty() || files.key.empty()) {
    return absl::InvalidArgumentError(
        "TLS needs both runtime.tls_cert_file and runtime.tls_key_file (runtime.tls_ca_file defaults to the "
        "certificate)");
  }
  TlsState next;
  auto cert = ReadPem(files.cert, "certificate", "-----BEGIN CERTIFICATE-----");
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(files.key, "key", "PRIVATE KEY-----");
  if (!key.ok()) return key.status();
  auto ca = ReadPem(files.ca.empty() ? files.cert : files.ca, "CA", "-----BEGIN CERTIFICATE-----");
  if (!ca.ok()) return ca.status();
  next.enabled = true;
  next.cert = *std::move(cert);
  next.key = *std::move(key);
  next.ca = *std::move(ca);
  t = std::move(next);
  return absl::OkStatus();
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials() {
  const TlsState& t = Tls();
  if (!t.enabled) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o;
  o.pem_root_certs = t.ca;
  o.pem_key_cert_pairs.push_back({t.key, t.cert});
  return grpc::SslServerCredentials(o);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials() {
  const TlsState& t = Tls();
  if (!t.enabled) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = t.ca;
  return grpc::SslCredentials(o);
}

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

bool HasToken(const grpc::CallbackServerContext* ctx, std::string_view token) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(kTokenKey);
  if (it == md.end()) return false;
  const grpc::string_ref& got = it->second;
  if (got.size() != token.size() || token.empty()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < token.size(); ++i) {
    diff |= static_cast<unsigned char>(got.data()[i] ^ token[i]);
  }
  return diff == 0;
}

grpc::Status TokenRefused() {
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "missing or wrong job token (x-roll-token)");
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, -1);
  args.SetInt(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, -1);
  // Reconnect fast: a restarted peer should be reachable again quickly.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Distinct channels to distinct workers must not share one TCP connection.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(address, ChannelCredentials(), args);
}

void PrepareContext(grpc::ClientContext* ctx, std::string_view token, absl::Duration timeout) {
  ctx->AddMetadata(kTokenKey, std::string(token));
  if (timeout != absl::InfiniteDuration()) {
    ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMicroseconds(timeout));
  }
}

std::string RandomToken() {
  std::random_device rd;
  std::string token;
  static constexpr char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 32; ++i) token.push_back(kHex[rd() % 16]);
  return token;
}

void ConfigureServerBuilder(grpc::ServerBuilder* builder) {
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder->SetMaxReceiveMessageSize(-1);
  builder->SetMaxSendMessageSize(-1);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
}

absl::Status WatchController(const std::string& controller, std::string_view token, const std::string& cluster,
                             int rank, double grace_s,
                             const std::function<bool(std::chrono::milliseconds)>& wait_stop) {
  auto stub = rpc::Controller::NewStub(MakeChannel(controller));
  const auto period = std::chrono::milliseconds(static_cast<int64_t>(std::min(0.5, grace_s / 4) * 1000));
  auto last_ok = std::chrono::steady_clock::now();
  while (!wait_stop(period)) {
    grpc::ClientContext ctx;
    PrepareContext(&ctx, token, absl::Seconds(std::max(0.2, grace_s / 2)));
    PingRequest req;
    req.set_cluster(cluster);
    req.set_rank(rank);
    PingReply reply;
    grpc::Status s = stub->Ping(&ctx, req, &reply);
    if (s.ok()) {
      last_ok = std::chrono::steady_clock::now();
    } else if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      return FromGrpc(s);
    } else if (std::chrono::steady_clock::now() - last_ok > std::chrono::duration<double>(grace_s)) {
      return absl::UnavailableError(absl::StrCat("controller ", controller, " unreachable for more than ", grace_s,
                                                 " s: ", s.error_message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace roll::rpc
