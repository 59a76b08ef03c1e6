// env_type external against the Python example server
// (examples/environments/python/guess_number.py), started by the framework
// from its command: the protocol round trip, determinism, the server's own
// option errors, a server that exits at once and one that hangs.

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "roll/envs/environment.h"

namespace roll {
namespace {

using ::testing::HasSubstr;

// Debian's interpreter, where python3-grpcio is installed.
const char kPython[] = "/usr/bin/python3";

std::string ServerCommand() {
  return std::string("command=") + kPython + " " + ROLL_SOURCE_DIR + "/examples/environments/python/guess_number.py";
}

bool PythonGrpcMissing() {
  return std::system((std::string(kPython) + " -c 'import grpc, google.protobuf' 2>/dev/null").c_str()) != 0;
}

class ExternalEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (PythonGrpcMissing()) GTEST_SKIP() << kPython << " lacks grpcio/protobuf (scripts/setup installs them)";
  }
  std::unique_ptr<Environment> Make(std::vector<std::string> options) {
    options.insert(options.begin(), ServerCommand());
    auto env = MakeEnvironment("external", options);
    EXPECT_TRUE(env.ok()) << env.status();
    return env.ok() ? std::move(*env) : nullptr;
  }
};

// Plays by bisection on the server's hints; returns the steps taken.
int Bisect(Environment* env, int max_number, std::vector<std::string>* observations) {
  int lo = 1, hi = max_number;
  for (int step = 1; step <= 10; ++step) {
    const int guess = (lo + hi) / 2;
    auto s = env->Step("I think <answer>" + std::to_string(guess) + "</answer>");
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return -1;
    observations->push_back(s->observation);
    if (s->done) {
      EXPECT_TRUE(s->success);
      EXPECT_EQ(s->reward, 1.0);
      return step;
    }
    EXPECT_EQ(s->reward, 0.0);
    if (s->observation.find("higher") != std::string::npos) {
      lo = guess + 1;
    } else {
      EXPECT_THAT(s->observation, HasSubstr("lower"));
      hi = guess - 1;
    }
  }
  return -1;
}

TEST_F(ExternalEnvTest, APythonServerPlaysOverTheProtocolAndReplaysFromItsSeed) {
  auto a = Make({"max_number=16", "max_steps=8"}), b = Make({"max_number=16", "max_steps=8"});
  ASSERT_TRUE(a && b);
  EXPECT_THAT(a->Instructions(), HasSubstr("between 1 and 16"));
  ASSERT_EQ(a->Actions().size(), 16u);
  EXPECT_EQ(a->Actions().front(), "1");
  int solved = 0;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    auto oa = a->Reset(seed), ob = b->Reset(seed);
    ASSERT_TRUE(oa.ok() && ob.ok()) << oa.status() << ob.status();
    EXPECT_EQ(*oa, *ob);
    std::vector<std::string> ha, hb;
    const int sa = Bisect(a.get(), 16, &ha), sb = Bisect(b.get(), 16, &hb);
    // Two episodes of one seed are the same episode.
    EXPECT_EQ(sa, sb);
    EXPECT_EQ(ha, hb);
    EXPECT_LE(sa, 5) << "bisection finds 1..16 in at most 5 guesses";
    solved += sa > 0;
  }
  EXPECT_EQ(solved, 6);
  // After the end, the framework refuses another step without a call.
  auto after = a->Step("<answer>1</answer>");
  EXPECT_EQ(after.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ExternalEnvTest, AnUnreadableActionIsInvalidAndCostsTheFormatPenalty) {
  auto env = Make({"max_steps=2", "format_penalty=-0.25"});
  ASSERT_TRUE(env);
  ASSERT_TRUE(env->Reset(3).ok());
  auto s = env->Step("<answer>seven</answer>");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->action_valid);
  EXPECT_EQ(s->reward, -0.25);
  EXPECT_FALSE(s->done);
  s = env->Step("<answer>99</answer>");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(s->action_valid);
  EXPECT_TRUE(s->done && s->truncated) << "max_steps=2 ends the episode";
}

TEST_F(ExternalEnvTest, OptionErrorsNameWhatIsWrong) {
  auto neither = MakeEnvironment("external", {"timeout_s=3"});
  EXPECT_EQ(neither.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(neither.status().message()), HasSubstr("exactly one of address="));
  auto bad_timeout = MakeEnvironment("external", {ServerCommand(), "timeout_s=zero"});
  EXPECT_THAT(std::string(bad_timeout.status().message()), HasSubstr("timeout_s=zero: not a number"));
  // Options the framework does not read go to the server, which names the
  // one it does not know.
  auto unknown = MakeEnvironment("external", {ServerCommand(), "max_numbr=4"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("external environment (command"));
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("unknown option max_numbr"));
}

TEST_F(ExternalEnvTest, AServerThatExitsAtOnceFailsWithItsOutput) {
  auto env = MakeEnvironment("external", {"command=echo no such environment here; exit 3", "startup_timeout_s=20"});
  ASSERT_FALSE(env.ok());
  EXPECT_EQ(env.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(env.status().message()), HasSubstr("exited"));
  EXPECT_THAT(std::string(env.status().message()), HasSubstr("no such environment here"));
}

TEST_F(ExternalEnvTest, AHangingServerIsTimedOutByName) {
  auto env = Make({"hang_on_step=2", "timeout_s=1"});
  ASSERT_TRUE(env);
  ASSERT_TRUE(env->Reset(1).ok());
  ASSERT_TRUE(env->Step("<answer>x</answer>").ok()) << "an unreadable guess never ends the episode";
  const auto start = std::chrono::steady_clock::now();
  auto s = env->Step("<answer>2</answer>");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("external environment (command"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("guess_number.py"));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("Step did not answer within 1s"));
  EXPECT_LT(took, 5.0);
}

TEST(ExternalEnvAddressTest, NothingListeningAtTheAddressIsNamed) {
  auto env = MakeEnvironment("external", {"address=unix:/nonexistent/roll-env.sock", "timeout_s=1"});
  ASSERT_FALSE(env.ok());
  EXPECT_THAT(std::string(env.status().message()), HasSubstr("external environment (address unix:/nonexistent"));
  EXPECT_THAT(std::string(env.status().message()), HasSubstr("Describe"));
}

}  // namespace
}  // namespace roll
