// TLS on the control plane: a controller and its workers with a self-signed
// certificate the test generates; plaintext clients and clients that trust
// another CA are refused, the job runs over TLS.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "testing/processes.h"
#include "roll/controller/controller.h"
#include "roll/worker/debug_worker.h"
#include "rpc/rpc_util.h"
#include "rpc/store_client.h"
#include "worker.grpc.pb.h"

namespace roll {
namespace {

namespace fs = std::filesystem;

// A self-signed certificate for 127.0.0.1 (and localhost) in `dir`.
bool MakeCertificate(const std::string& dir, const std::string& name) {
  const std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
                          "-addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout " + dir + "/" + name +
                          ".key -out " + dir + "/" + name + ".pem >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

PipelineConfig TlsConfig(const std::string& dir, const std::string& runtime_extra) {
  const std::string yaml = absl::StrCat("exp_name: tls_test\noutput_dir: ", dir,
                                        "/out\nworkers:\n  worker_cls: debug\n  world_size: 2\nruntime:\n"
                                        "  worker_binary: ", testing::RollBinary(), "\n", runtime_extra);
  LoadOptions load;
  load.extra_roles = {"workers"};
  auto config = ParsePipelineConfig(yaml, "<test>", {}, load);
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// A Ping to the controller with `creds`: OK or the transport error.
grpc::Status Ping(const std::string& address, std::shared_ptr<grpc::ChannelCredentials> creds,
                  const std::string& token) {
  auto stub = rpc::Controller::NewStub(grpc::CreateChannel(address, creds));
  grpc::ClientContext ctx;
  rpc::PrepareContext(&ctx, token, absl::Seconds(5));
  rpc::PingRequest req;
  rpc::PingReply reply;
  return stub->Ping(&ctx, req, &reply);
}

grpc::Status Health(const std::string& address, std::shared_ptr<grpc::ChannelCredentials> creds,
                    const std::string& token) {
  auto stub = rpc::Worker::NewStub(grpc::CreateChannel(address, creds));
  grpc::ClientContext ctx;
  rpc::PrepareContext(&ctx, token, absl::Seconds(5));
  rpc::HealthRequest req;
  rpc::HealthReply reply;
  return stub->Health(&ctx, req, &reply);
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("tls");
    ASSERT_TRUE(MakeCertificate(dir_, "job")) << "openssl failed";
    ASSERT_TRUE(MakeCertificate(dir_, "other")) << "openssl failed";
  }
  void TearDown() override {
    ASSERT_TRUE(rpc::ConfigureTls({}).ok());  // back to plaintext for other tests
    fs::remove_all(dir_);
  }
  std::string dir_;
};

TEST_F(TlsTest, JobRunsOverTlsAndRefusesOtherClients) {
  const std::string files = absl::StrCat("  tls_cert_file: ", dir_, "/job.pem\n  tls_key_file: ", dir_, "/job.key\n");
  ControllerOptions options;
  options.load.extra_roles = {"workers"};
  auto controller = Controller::Create(TlsConfig(dir_, files), options);
  ASSERT_TRUE(controller.ok()) << controller.status();
  auto cluster = (*controller)->StartCluster<DebugApi>("workers");
  ASSERT_TRUE(cluster.ok()) << cluster.status();

  // The job itself: workers registered over TLS and answer calls.
  Batch in;
  in.SetTensor("x", at::arange(4, at::kFloat));
  auto replies = (*cluster)->Call(debug::kEcho, in).Replies();
  ASSERT_TRUE(replies.ok()) << replies.status();
  EXPECT_EQ(replies->size(), 2u);

  const std::string token = (*controller)->token();
  const std::string worker = (*cluster)->workers()[0].address;
  grpc::SslCredentialsOptions trusting;
  trusting.pem_root_certs = testing::ReadFile(dir_ + "/job.pem");
  grpc::SslCredentialsOptions other;
  other.pem_root_certs = testing::ReadFile(dir_ + "/other.pem");
  // A client that trusts the job's certificate gets through (with the token).
  EXPECT_TRUE(Ping((*controller)->address(), grpc::SslCredentials(trusting), token).ok());
  EXPECT_TRUE(Health(worker, grpc::SslCredentials(trusting), token).ok());
  // Plaintext and a client trusting another CA never reach a handler.
  for (const auto& creds : {grpc::InsecureChannelCredentials(), grpc::SslCredentials(other)}) {
    EXPECT_EQ(Ping((*controller)->address(), creds, token).error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_EQ(Health(worker, creds, token).error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  // TLS does not replace the token.
  EXPECT_EQ(Health(worker, grpc::SslCredentials(trusting), "wrong").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // The collectives' rendezvous store is a service of the controller: over
  // TLS (this process configured it) and behind the token.
  rpc::RemoteStore store((*controller)->address(), token, std::chrono::seconds(5));
  ASSERT_TRUE(store.Set("k", "v").ok());
  auto got = store.Get("k", std::chrono::seconds(1));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v");
  EXPECT_EQ(rpc::RemoteStore((*controller)->address(), "wrong", std::chrono::seconds(5)).Set("k", "x").code(),
            absl::StatusCode::kUnauthenticated);
  auto plaintext = rpc::Store::NewStub(grpc::CreateChannel((*controller)->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  rpc::PrepareContext(&ctx, token, absl::Seconds(5));
  rpc::StoreSetRequest set;
  set.set_key("k");
  rpc::StoreSetReply set_reply;
  EXPECT_EQ(plaintext->Set(&ctx, set, &set_reply).error_code(), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, BadTlsFilesAreNamed) {
  ControllerOptions options;
  options.load.extra_roles = {"workers"};
  auto missing = Controller::Create(
      TlsConfig(dir_, absl::StrCat("  tls_cert_file: ", dir_, "/nope.pem\n  tls_key_file: ", dir_, "/job.key\n")),
      options);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nope.pem' cannot be read"), std::string::npos) << missing.status();
  auto swapped = Controller::Create(
      TlsConfig(dir_, absl::StrCat("  tls_cert_file: ", dir_, "/job.key\n  tls_key_file: ", dir_, "/job.key\n")),
      options);
  ASSERT_FALSE(swapped.ok());
  EXPECT_NE(swapped.status().message().find("is not PEM"), std::string::npos) << swapped.status();
  auto partial = Controller::Create(TlsConfig(dir_, absl::StrCat("  tls_cert_file: ", dir_, "/job.pem\n")), options);
  ASSERT_FALSE(partial.ok());
  EXPECT_NE(partial.status().message().find("tls_key_file"), std::string::npos) << partial.status();
}

}  // namespace
}  // namespace roll
