#pragma once
// Reading files in tests: one implementation for every suite.

#include <fstream>
#include <iterator>
#include <string>

namespace roll::testing {

// The whole file at `path`, bytes as they are; empty when it cannot be read.
inline std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

}  // namespace roll::testing
