#pragma once
// An environment of a registered type for a test, or a test failure.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "roll/envs/environment.h"

namespace roll::testing {

// MakeEnvironment(type, options); a failure of the calling test (and null)
// when the type or an option is refused.
inline std::unique_ptr<Environment> Env(const std::string& type, const std::vector<std::string>& options) {
  auto env = MakeEnvironment(type, options);
  EXPECT_TRUE(env.ok()) << env.status();
  return env.ok() ? *std::move(env) : nullptr;
}

}  // namespace roll::testing
