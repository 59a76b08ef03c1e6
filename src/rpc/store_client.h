#pragma once
// The rendezvous store of the job's collectives, client side, and a
// standalone host for it (benches, tests). Free of gRPC headers so that
// LibTorch code (the communicator) can include it without gRPC's compile
// flags. The service itself: store_service.h. Private to the library.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace roll::rpc {

// The longest a server holds one waiting call; clients ask again until
// their own timeout. Bounds what a client that vanished mid-wait leaves.
inline constexpr std::chrono::seconds kStoreMaxPark{5};

// Client of the store at `address` ("host:port") presenting `token`. Every
// call is bounded: plain operations by `timeout`, waits by the timeout they
// are given. Errors name the store's address: Unavailable when it cannot be
// reached or does not answer, DeadlineExceeded ("timed out") only when a
// wait ran out, Unauthenticated for a wrong token. Thread-safe.
class RemoteStore {
 public:
  RemoteStore(std::string address, std::string token, std::chrono::milliseconds timeout);
  ~RemoteStore();
  RemoteStore(RemoteStore&&) noexcept;

  const std::string& address() const;

  absl::Status Set(const std::string& key, const std::string& value);
  // The value the key holds afterwards (c10d's compareSet: set when the key
  // holds `expected`, or is absent and `expected` is empty).
  absl::StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                         const std::string& desired);
  // Waits until the key exists.
  absl::StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds timeout);
  // Adds to the decimal integer the key holds (0 when absent).
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  // Whether every key exists now.
  absl::StatusOr<bool> Check(const std::vector<std::string>& keys);
  // Waits until every key exists.
  absl::Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // Whether the key existed.
  absl::StatusOr<bool> Delete(const std::string& key);
  absl::StatusOr<int64_t> NumKeys();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A gRPC server with only the store service, listening on host:port (only
// there; port 0 picks a free one, a port in use is an error) and guarded by
// `token` (empty: a fresh random one), over TLS when the process configured
// it. Destroying it releases waiting clients and stops the server.
class StoreHost {
 public:
  static absl::StatusOr<std::unique_ptr<StoreHost>> Start(const std::string& host, int port, std::string token);
  ~StoreHost();
  int port() const;
  const std::string& token() const;

 private:
  struct Impl;
  explicit StoreHost(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace roll::rpc
