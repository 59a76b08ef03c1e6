#pragma once
// Forking ranks as real processes in tests: the parent hosts the store (as
// the controller does) and each child reports back through a pipe.

#include <unistd.h>

#include <exception>
#include <functional>
#include <string>

#include "absl/strings/str_cat.h"

namespace roll::testing {

struct Child {
  pid_t pid = -1;
  int read_fd = -1;
};

// Forks a child running `body`; its return value becomes the exit code and
// the text it appends to `report` comes back to the parent.
Child Spawn(const std::function<int(std::string* report)>& body) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string report;
    int code = 1;
    try {
      code = body(&report);
    } catch (const std::exception& e) {
      report += absl::StrCat("uncaught exception: ", e.what());
    }
    size_t off = 0;
    while (off < report.size()) {
      ssize_t n = write(fds[1], report.data() + off, report.size() - off);
      if (n <= 0) break;
      off += n;
    }
    close(fds[1]);
    _exit(code);
  }
  close(fds[1]);
  return {pid, fds[0]};
}

}  // namespace roll::testing
