// client.hpp — one connection to the job's control plane (control/server.hpp), admitted by the job secret.
//
// Safe to share between threads: requests are sent one at a time, in the order they take the client's lock (a
// waiting request holds the connection until it is answered). Errors of the transport or the protocol are
// ControlPlaneError; a refused secret is a UserError that says so.
#pragma once

#include "meshtrain/common/error.hpp"

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace meshtrain::control {

class ControlPlaneError : public Error {
 public:
  explicit ControlPlaneError(const std::string& message) : Error(message) {}
};

struct ClientOptions {
  std::string address;
  int port = 0;
  std::string secret;
  double connect_timeout_s = 60;  // keeps trying to connect (host 0 may not be listening yet) for this long
  double reply_timeout_s = 60;    // a reply must come within this (plus the wait's own timeout for waits)
};

class ControlPlaneClient {
 public:
  // Connects and proves the secret. ControlPlaneError if the server cannot be reached within connect_timeout_s;
  // UserError if it refuses the proof or cannot prove the secret itself.
  explicit ControlPlaneClient(ClientOptions options);
  ~ControlPlaneClient();
  ControlPlaneClient(const ControlPlaneClient&) = delete;
  ControlPlaneClient& operator=(const ControlPlaneClient&) = delete;

  void set(const std::string& key, const std::string& value);
  // The value once `key` exists; nullopt after `timeout` (zero: no limit).
  std::optional<std::string> get(const std::string& key, std::chrono::milliseconds timeout);
  int64_t add(const std::string& key, int64_t delta);
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired);
  bool remove(const std::string& key);
  bool check(const std::vector<std::string>& keys);
  int64_t key_count();
  // True once every key exists; false after `timeout` (zero: no limit).
  bool wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

 private:
  void connect();
  std::string round_trip(const std::string& request, std::chrono::milliseconds extra_wait);

  ClientOptions options_;
  std::mutex mutex_;
  int fd_ = -1;
};

}  // namespace meshtrain::control
