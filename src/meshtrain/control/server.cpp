// server.cpp — the control plane's listener, its per-connection threads and the store they share.
#include "meshtrain/control/server.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/common/log.hpp"
#include "meshtrain/control/protocol.hpp"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace meshtrain::control {
namespace {

// Listens on the first address `address` resolves to that this host can bind. UserError if none.
int listen_on(const std::string& address, int port, int* bound_port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* results = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(address.c_str(), service.c_str(), &hints, &results);
  MT_USER_CHECK(rc == 0, "the job's coordinator address {} does not resolve: {}", address, ::gai_strerror(rc));
  std::string last_error = "no address";
  int fd = -1;
  for (addrinfo* a = results; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
      last_error = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(results);
  MT_USER_CHECK(fd >= 0, "cannot serve the job's control plane at {}:{}: {} (is the port in use, or is {} not an "
                "address of this host?)", address, port, last_error, address);
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  char service_out[NI_MAXSERV];
  ::getnameinfo(reinterpret_cast<sockaddr*>(&bound), length, nullptr, 0, service_out, sizeof service_out,
                NI_NUMERICSERV);
  *bound_port = std::atoi(service_out);
  return fd;
}

}  // namespace

ControlPlaneServer::ControlPlaneServer(ServerOptions options) : options_(std::move(options)) {
  listen_fd_ = listen_on(options_.address, options_.port, &port_);
  accept_thread_ = std::thread([this] { accept_loop(); });
}

ControlPlaneServer::~ControlPlaneServer() {
  stopping_.store(true);
  {
    std::lock_guard<std::mutex> lock(values_mutex_);
    values_changed_.notify_all();
  }
  accept_thread_.join();
  std::lock_guard<std::mutex> lock(connections_mutex_);
  for (auto& connection : connections_) ::shutdown(connection->fd, SHUT_RDWR);
  for (auto& connection : connections_) {
    connection->thread.join();
    ::close(connection->fd);
  }
  ::close(listen_fd_);
}

void ControlPlaneServer::accept_loop() {
  while (!stopping_.load()) {
    pollfd entry{listen_fd_, POLLIN, 0};
    if (::poll(&entry, 1, 200) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    reap_finished_connections();
    auto connection = std::make_unique<Connection>();
    connection->fd = fd;
    connection->peer = peer_name(fd);
    std::lock_guard<std::mutex> lock(connections_mutex_);
    if (static_cast<int>(connections_.size()) >= options_.max_connections) {
      drop(*connection, fmt::format("{} connections are open already", connections_.size()));
      ::close(fd);
      continue;
    }
    Connection& ref = *connection;
    connections_.push_back(std::move(connection));
    ref.thread = std::thread([this, &ref] {
      serve(ref);
      ref.done.store(true);
    });
  }
}

void ControlPlaneServer::reap_finished_connections() {
  std::lock_guard<std::mutex> lock(connections_mutex_);
  for (auto it = connections_.begin(); it != connections_.end();) {
    if ((*it)->done.load()) {
      (*it)->thread.join();
      ::close((*it)->fd);
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void ControlPlaneServer::drop(const Connection& connection, const std::string& reason) {
  // The first drops are logged one by one; past that, every 1000th, so a flood cannot fill the log.
  const int64_t count = dropped_.fetch_add(1) + 1;
  if (count <= 20 || count % 1000 == 0)
    log::warning("control plane: dropped the connection from {}: {} ({} dropped so far)", connection.peer, reason,
                 count);
}

bool ControlPlaneServer::admit(Connection& connection) {
  const Clock::time_point deadline = Clock::now() + to_ms(options_.handshake_timeout_s);
  const std::string server_nonce = random_bytes(kNonceBytes);
  write_frame(connection.fd, kGreeting + server_nonce, deadline);
  std::optional<std::string> answer =
      read_frame(connection.fd, deadline, to_ms(options_.handshake_timeout_s), [this] { return !stopping_.load(); });
  if (!answer) return false;
  if (answer->size() != 2 * kNonceBytes)
    throw ProtocolError(fmt::format("a handshake answer of {} bytes, not {}", answer->size(), 2 * kNonceBytes));
  const std::string client_nonce = answer->substr(0, kNonceBytes);
  if (!same_digest(to_digest(answer->substr(kNonceBytes)), client_proof(options_.secret, server_nonce, client_nonce))) {
    write_frame(connection.fd, std::string(1, static_cast<char>(kRefused)), deadline);
    throw ProtocolError("it does not know the job secret");
  }
  write_frame(connection.fd,
              std::string(1, static_cast<char>(kAccepted)) +
                  to_string(server_proof(options_.secret, server_nonce, client_nonce)),
              deadline);
  return true;
}

void ControlPlaneServer::serve(Connection& connection) {
  const auto keep_going = [this] { return !stopping_.load(); };
  try {
    if (!admit(connection)) return;
    while (true) {
      std::optional<std::string> payload =
          read_frame(connection.fd, std::nullopt, to_ms(options_.message_timeout_s), keep_going);
      if (!payload) return;
      write_frame(connection.fd, answer(*payload), Clock::now() + to_ms(options_.message_timeout_s));
    }
  } catch (const std::exception& e) {
    if (!stopping_.load()) drop(connection, e.what());
  }
}

std::string ControlPlaneServer::answer(const std::string& payload) {
  const Request request = decode_request(payload);
  std::unique_lock<std::mutex> lock(values_mutex_);
  const auto all_present = [&] {
    for (const std::string& key : request.keys)
      if (values_.count(key) == 0) return false;
    return true;
  };
  // Waits until the request's keys exist; false on its timeout. A server that stops answers no more: the waiting
  // client sees its connection close.
  const auto wait_for_keys = [&] {
    const auto ready = [&] { return stopping_.load() || all_present(); };
    if (request.timeout_ms == 0)
      values_changed_.wait(lock, ready);
    else
      values_changed_.wait_for(lock, std::chrono::milliseconds(request.timeout_ms), ready);
    if (stopping_.load()) throw ProtocolError("the control plane is stopping");
    return all_present();
  };
  switch (request.op) {
    case Op::kSet:
      values_[request.keys[0]] = request.value;
      values_changed_.notify_all();
      return ReplyWriter(Status::kOk).take();
    case Op::kGet:
      if (!wait_for_keys()) return ReplyWriter(Status::kTimedOut).take();
      return ReplyWriter(Status::kOk).bytes(values_[request.keys[0]]).take();
    case Op::kAdd: {
      int64_t value = 0;
      auto it = values_.find(request.keys[0]);
      if (it != values_.end()) {
        try {
          value = std::stoll(it->second);
        } catch (const std::exception&) {
          throw ProtocolError(
              fmt::format("add to a key of {} bytes that does not hold a number", request.keys[0].size()));
        }
      }
      value += request.number;
      values_[request.keys[0]] = std::to_string(value);
      values_changed_.notify_all();
      return ReplyWriter(Status::kOk).number(value).take();
    }
    case Op::kCompareSet: {
      // As c10d's TCPStore: a missing key is set when `expected` is empty; otherwise `expected` is returned unchanged.
      auto it = values_.find(request.keys[0]);
      if (it == values_.end()) {
        if (!request.expected.empty()) return ReplyWriter(Status::kOk).bytes(request.expected).take();
        it = values_.emplace(request.keys[0], request.value).first;
        values_changed_.notify_all();
      } else if (it->second == request.expected) {
        it->second = request.value;
        values_changed_.notify_all();
      }
      return ReplyWriter(Status::kOk).bytes(it->second).take();
    }
    case Op::kDelete: return ReplyWriter(Status::kOk).number(values_.erase(request.keys[0])).take();
    case Op::kCheck: return ReplyWriter(Status::kOk).number(all_present() ? 1 : 0).take();
    case Op::kNumKeys: return ReplyWriter(Status::kOk).number(static_cast<int64_t>(values_.size())).take();
    case Op::kWait: return ReplyWriter(wait_for_keys() ? Status::kOk : Status::kTimedOut).take();
  }
  throw ProtocolError("unreachable request");
}

}  // namespace meshtrain::control
