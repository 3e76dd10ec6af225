// server.hpp — the job's control plane, served by host 0: a key-value store only the job's hosts can use.
//
// It listens on the coordinator's address alone (never on every address), and serves each connection on a thread of
// its own, so no client can stall another. A connection must prove the job secret within handshake_timeout_s of
// connecting (control/protocol.hpp); a connection that fails to, sends a malformed or oversized message, or stops in
// the middle of one for message_timeout_s is dropped and logged with its peer address. Waits (kGet, kWait) block
// only their own connection.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace meshtrain::control {

struct ServerOptions {
  std::string address;  // numeric or a name of this host; the server binds to what it resolves to, nothing else
  int port = 0;         // 0: a free port (port() says which)
  std::string secret;
  double handshake_timeout_s = 5;
  double message_timeout_s = 5;
  int max_connections = 1024;  // more at once are closed on arrival, and logged
};

class ControlPlaneServer {
 public:
  // Binds and listens. UserError naming the address if it cannot (in use, or not an address of this host).
  explicit ControlPlaneServer(ServerOptions options);
  // Stops listening, ends every connection (a waiting client gets a closed connection) and joins the threads.
  ~ControlPlaneServer();
  ControlPlaneServer(const ControlPlaneServer&) = delete;
  ControlPlaneServer& operator=(const ControlPlaneServer&) = delete;

  int port() const { return port_; }
  // Connections dropped so far (refused proofs, malformed or stalled messages, over max_connections).
  int64_t dropped_connections() const { return dropped_.load(); }

 private:
  struct Connection {
    int fd = -1;
    std::string peer;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  void accept_loop();
  void serve(Connection& connection);
  // Checks the peer's proof of the secret; false (after telling it so) when it has none.
  bool admit(Connection& connection);
  // Answers one request; may block (waits) until its keys exist, its timeout, or the server stops.
  std::string answer(const std::string& payload);
  void drop(const Connection& connection, const std::string& reason);
  void reap_finished_connections();

  ServerOptions options_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> dropped_{0};
  std::thread accept_thread_;
  std::mutex connections_mutex_;
  std::list<std::unique_ptr<Connection>> connections_;

  std::mutex values_mutex_;
  std::condition_variable values_changed_;
  std::map<std::string, std::string> values_;
};

}  // namespace meshtrain::control
