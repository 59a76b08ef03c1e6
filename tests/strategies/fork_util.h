#pragma once
// Forking ranks as real processes in tests: a StoreProcess hosts the store
// (as the controller does) and each child reports back through a pipe.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <exception>
#include <functional>
#include <memory>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "roll/strategies/communicator.h"

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

// A StoreServer in a process of its own. The parent of forked ranks must
// not start gRPC itself: a forked child cannot use the gRPC state (threads,
// locks) it inherits, so the ranks and the store each start theirs fresh.
// The store process ends with this object (or with the parent).
class StoreProcess {
 public:
  // nullptr when the child could not start its server (the reason on stderr).
  static std::unique_ptr<StoreProcess> Start() {
    int out[2], hold[2];
    if (pipe(out) != 0 || pipe(hold) != 0) return nullptr;
    const pid_t pid = fork();
    if (pid == 0) {
      close(out[0]);
      close(hold[1]);
      auto server = StoreServer::Start("127.0.0.1", 0);
      std::string line = server.ok() ? absl::StrCat((*server)->port(), " ", (*server)->token(), "\n") : "0 -\n";
      if (write(out[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) _exit(1);
      close(out[1]);
      char c;
      while (read(hold[0], &c, 1) > 0) {
      }  // EOF: the parent is done or gone.
      _exit(server.ok() ? 0 : 1);
    }
    close(out[1]);
    close(hold[0]);
    std::string text;
    char buf[128];
    ssize_t n;
    while ((n = read(out[0], buf, sizeof(buf))) > 0) text.append(buf, n);
    close(out[0]);
    auto p = std::unique_ptr<StoreProcess>(new StoreProcess(pid, hold[1]));
    std::istringstream in(text);
    in >> p->port_ >> p->token_;
    if (p->port_ <= 0) return nullptr;
    return p;
  }

  ~StoreProcess() {
    close(hold_fd_);
    int status = 0;
    waitpid(pid_, &status, 0);
  }

  int port() const { return port_; }
  const std::string& token() const { return token_; }

 private:
  StoreProcess(pid_t pid, int hold_fd) : pid_(pid), hold_fd_(hold_fd) {}
  pid_t pid_;
  int hold_fd_;
  int port_ = 0;
  std::string token_;
};

}  // namespace roll::testing
