// The rendezvous store over the control plane: c10d-style semantics (waiting
// gets, counters, compare-and-set), waits longer than one server park, the
// job token on every method, malformed requests refused, a closed store
// releasing its waiters, and a server that listens only where it was bound.

#include "rpc/store_service.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <gtest/gtest.h>

#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "rpc/rpc_util.h"

namespace roll::rpc {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

constexpr char kToken[] = "0123456789abcdef0123456789abcdef";

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

class StoreServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_ = std::make_unique<StoreService>(kToken);
    grpc::ServerBuilder builder;
    ConfigureServerBuilder(&builder);
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_ != nullptr);
    ASSERT_GT(port_, 0);
  }
  void TearDown() override {
    service_->Close();
    server_->Shutdown(std::chrono::system_clock::now() + milliseconds(500));
  }

  std::string Address() const { return absl::StrCat("127.0.0.1:", port_); }
  RemoteStore Client(const std::string& token = kToken) const { return RemoteStore(Address(), token, seconds(5)); }

  std::unique_ptr<StoreService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(StoreServiceTest, SetGetAddDeleteAndCount) {
  RemoteStore store = Client();
  ASSERT_TRUE(store.Set("a", std::string("x\0y", 3)).ok());
  auto a = store.Get("a", seconds(1));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, std::string("x\0y", 3));  // values are bytes
  EXPECT_EQ(*store.Add("n", 2), 2);
  EXPECT_EQ(*store.Add("n", 5), 7);
  EXPECT_EQ(*store.Add("n", -7), 0);
  EXPECT_EQ(*store.NumKeys(), 2);
  EXPECT_TRUE(*store.Check({"a", "n"}));
  EXPECT_FALSE(*store.Check({"a", "missing"}));
  EXPECT_TRUE(*store.Delete("a"));
  EXPECT_FALSE(*store.Delete("a"));
  EXPECT_EQ(*store.NumKeys(), 1);
  // A counter only adds to integers.
  ASSERT_TRUE(store.Set("text", "abc").ok());
  auto bad = store.Add("text", 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("'text'"), std::string::npos) << bad.status();
}

TEST_F(StoreServiceTest, CompareSetFollowsC10dSemantics) {
  RemoteStore store = Client();
  // Absent and nothing expected: set.
  EXPECT_EQ(*store.CompareSet("k", "", "one"), "one");
  // Wrong expectation: unchanged, the current value comes back.
  EXPECT_EQ(*store.CompareSet("k", "zero", "two"), "one");
  EXPECT_EQ(*store.CompareSet("k", "one", "two"), "two");
  // A compare-and-set that sets wakes a parked wait.
  auto waiter = std::async(std::launch::async, [this] { return Client().Get("cas", seconds(10)); });
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(*store.CompareSet("cas", "", "v"), "v");
  auto woken = waiter.get();
  ASSERT_TRUE(woken.ok()) << woken.status();
  EXPECT_EQ(*woken, "v");
  EXPECT_EQ(*store.Get("k", seconds(1)), "two");
  // Absent with an expectation: nothing is set.
  EXPECT_EQ(*store.CompareSet("other", "x", "y"), "x");
  EXPECT_FALSE(*store.Check({"other"}));
}

TEST_F(StoreServiceTest, GetAndWaitReturnAsSoonAsAnotherClientWrites) {
  RemoteStore store = Client();
  auto writer = std::async(std::launch::async, [this] {
    std::this_thread::sleep_for(milliseconds(300));
    RemoteStore other = Client();
    EXPECT_TRUE(other.Set("late", "v").ok());
    std::this_thread::sleep_for(milliseconds(300));
    EXPECT_TRUE(other.Add("later", 1).ok());
  });
  const auto start = Clock::now();
  auto got = store.Get("late", seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v");
  EXPECT_TRUE(store.Wait({"late", "later"}, seconds(10)).ok());
  EXPECT_LT(SecondsSince(start), 2.0);
  writer.get();
}

TEST_F(StoreServiceTest, WaitsLongerThanOneParkKeepWaiting) {
  RemoteStore store = Client();
  const auto park = std::chrono::duration<double>(kStoreMaxPark).count();
  auto writer = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(std::chrono::duration<double>(park + 0.5));
    EXPECT_TRUE(Client().Set("slow", "1").ok());
  });
  const auto start = Clock::now();
  EXPECT_TRUE(store.Wait({"slow"}, seconds(30)).ok());
  EXPECT_GE(SecondsSince(start), park);
  writer.get();
}

TEST_F(StoreServiceTest, WaitTimesOutNamingStoreAndKeys) {
  RemoteStore store = Client();
  ASSERT_TRUE(store.Set("here", "1").ok());
  const auto start = Clock::now();
  absl::Status s = store.Wait({"here", "never"}, milliseconds(600));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find(Address()), std::string::npos) << s;
  EXPECT_NE(s.message().find("never"), std::string::npos) << s;
  EXPECT_NE(s.message().find("timed out"), std::string::npos) << s;
  auto got = store.Get("never", milliseconds(300));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded) << got.status();
  const double took = SecondsSince(start);
  EXPECT_GE(took, 0.85);
  EXPECT_LT(took, 3.0);
}

TEST_F(StoreServiceTest, EveryMethodWantsTheToken) {
  for (const std::string& token : {std::string(), std::string(32, 'f')}) {
    RemoteStore store = Client(token);
    std::vector<absl::Status> got = {
        store.Set("k", "v"),
        store.CompareSet("k", "", "v").status(),
        store.Get("k", milliseconds(100)).status(),
        store.Add("k", 1).status(),
        store.Check({"k"}).status(),
        store.Wait({"k"}, milliseconds(100)),
        store.Delete("k").status(),
        store.NumKeys().status(),
    };
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].code(), absl::StatusCode::kUnauthenticated) << "method " << i << ": " << got[i];
    }
  }
  // Nothing was written by the refused calls.
  EXPECT_EQ(*Client().NumKeys(), 0);
}

TEST_F(StoreServiceTest, MalformedRequestsAreRefused) {
  auto stub = rpc::Store::NewStub(MakeChannel(Address()));
  auto call = [&](auto method, auto request, auto reply) {
    grpc::ClientContext ctx;
    PrepareContext(&ctx, kToken, absl::Seconds(5));
    return (stub.get()->*method)(&ctx, request, &reply);
  };
  rpc::StoreGetRequest get;
  get.set_key("");
  EXPECT_EQ(call(&rpc::Store::Stub::Get, get, rpc::StoreValueReply()).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  get.set_key("k");
  get.set_wait_s(-1);
  EXPECT_EQ(call(&rpc::Store::Stub::Get, get, rpc::StoreValueReply()).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  get.set_wait_s(std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(call(&rpc::Store::Stub::Get, get, rpc::StoreValueReply()).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  rpc::StoreWaitRequest wait;
  wait.add_keys("ok");
  wait.add_keys("");
  EXPECT_EQ(call(&rpc::Store::Stub::Wait, wait, rpc::StoreBoolReply()).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  rpc::StoreSetRequest set;
  EXPECT_EQ(call(&rpc::Store::Stub::Set, set, rpc::StoreSetReply()).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // The store still serves.
  EXPECT_TRUE(Client().Set("k", "v").ok());
}

TEST_F(StoreServiceTest, ClosingReleasesParkedWaitsAndRefusesLaterCalls) {
  auto waiter = std::async(std::launch::async, [this] { return Client().Wait({"never"}, seconds(30)); });
  std::this_thread::sleep_for(milliseconds(300));
  const auto start = Clock::now();
  service_->Close();
  absl::Status s = waiter.get();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LT(SecondsSince(start), 2.0);
  EXPECT_EQ(Client().Set("k", "v").code(), absl::StatusCode::kUnavailable);
}

TEST_F(StoreServiceTest, AnUnreachableStoreIsUnavailableAtOnce) {
  RemoteStore store("127.0.0.1:1", kToken, seconds(5));
  const auto start = Clock::now();
  absl::Status s = store.Set("k", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("store at 127.0.0.1:1"), std::string::npos) << s;
  EXPECT_LT(SecondsSince(start), 3.0);
}

// The first IPv4 address of this machine that is not loopback; empty if none.
std::string OtherLocalAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN];
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) == nullptr) continue;
    if (std::string(text).rfind("127.", 0) != 0) found = text;
  }
  freeifaddrs(list);
  return found;
}

TEST(StoreHostTest, ListensOnlyOnTheAddressItWasBoundTo) {
  const std::string other = OtherLocalAddress();
  if (other.empty()) GTEST_SKIP() << "this machine has no IPv4 address besides loopback";
  auto host = StoreHost::Start("127.0.0.1", 0, "");
  ASSERT_TRUE(host.ok()) << host.status();
  const int port = (*host)->port();
  EXPECT_EQ((*host)->token().size(), 32u) << "an empty token asks for a fresh one";
  RemoteStore elsewhere(absl::StrCat(other, ":", port), (*host)->token(), seconds(2));
  EXPECT_EQ(elsewhere.Set("k", "v").code(), absl::StatusCode::kUnavailable) << "reached through " << other;
  RemoteStore here(absl::StrCat("127.0.0.1:", port), (*host)->token(), seconds(2));
  EXPECT_TRUE(here.Set("k", "v").ok());
  // A second host on a port in use is refused (not shared).
  EXPECT_FALSE(StoreHost::Start("127.0.0.1", port, "").ok());
}

}  // namespace
}  // namespace roll::rpc
