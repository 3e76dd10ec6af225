// client.cpp — connecting to the control plane with retries, the client's half of the handshake, requests.
#include "meshtrain/control/client.hpp"

#include "meshtrain/control/protocol.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

namespace meshtrain::control {
namespace {

// One connection attempt to every address `address` resolves to; -1 with `error` set if none accepted.
int try_connect(const std::string& address, int port, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* results = nullptr;
  const int rc = ::getaddrinfo(address.c_str(), std::to_string(port).c_str(), &hints, &results);
  if (rc != 0) {
    error = fmt::format("{} does not resolve: {}", address, ::gai_strerror(rc));
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = results; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      error = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(results);
  if (fd >= 0) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

}  // namespace

ControlPlaneClient::ControlPlaneClient(ClientOptions options) : options_(std::move(options)) { connect(); }

ControlPlaneClient::~ControlPlaneClient() {
  if (fd_ >= 0) ::close(fd_);
}

void ControlPlaneClient::connect() {
  const auto deadline = Clock::now() + to_ms(options_.connect_timeout_s);
  std::string error;
  while ((fd_ = try_connect(options_.address, options_.port, error)) < 0) {
    if (Clock::now() >= deadline)
      throw ControlPlaneError(fmt::format("cannot reach the job's control plane at {}:{} within {} s: {}",
                                          options_.address, options_.port, options_.connect_timeout_s, error));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string where = fmt::format("the job's control plane at {}:{}", options_.address, options_.port);
  const auto handshake_deadline = Clock::now() + to_ms(options_.reply_timeout_s);
  const auto keep_going = [] { return true; };
  try {
    std::optional<std::string> greeting =
        read_frame(fd_, handshake_deadline, to_ms(options_.reply_timeout_s), keep_going);
    if (!greeting || greeting->size() != kGreeting.size() + kNonceBytes ||
        greeting->compare(0, kGreeting.size(), kGreeting) != 0)
      throw UserError(fmt::format("{} is not a meshtrain control plane (another program holds the port?)", where));
    const std::string server_nonce = greeting->substr(kGreeting.size());
    const std::string client_nonce = random_bytes(kNonceBytes);
    write_frame(fd_, client_nonce + to_string(client_proof(options_.secret, server_nonce, client_nonce)),
                handshake_deadline);
    std::optional<std::string> verdict =
        read_frame(fd_, handshake_deadline, to_ms(options_.reply_timeout_s), keep_going);
    if (!verdict || verdict->empty() || static_cast<uint8_t>((*verdict)[0]) != kAccepted)
      throw UserError(fmt::format("{} refused this host: it holds another job secret (every host must be given the "
                                  "same one: --secret-file or MESHTRAIN_JOB_SECRET)", where));
    if (!same_digest(to_digest(verdict->substr(1)), server_proof(options_.secret, server_nonce, client_nonce)))
      throw UserError(
          fmt::format("{} could not prove it knows the job secret: it is not this job's coordinator", where));
  } catch (const ProtocolError& e) {
    ::close(fd_);
    fd_ = -1;
    throw ControlPlaneError(fmt::format("{}: the handshake failed: {}", where, e.what()));
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

std::string ControlPlaneClient::round_trip(const std::string& request, std::chrono::milliseconds extra_wait) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) throw ControlPlaneError("the connection to the job's control plane is closed");
  const auto reply_timeout = to_ms(options_.reply_timeout_s) + extra_wait;
  try {
    write_frame(fd_, request, Clock::now() + reply_timeout);
    std::optional<std::string> reply =
        read_frame(fd_, Clock::now() + reply_timeout, reply_timeout, [] { return true; });
    if (!reply) throw ProtocolError("the coordinator closed the connection");
    return *reply;
  } catch (const ProtocolError& e) {
    // The connection's state is unknown after a failed exchange: later requests fail instead of reading its tail.
    ::close(fd_);
    fd_ = -1;
    throw ControlPlaneError(fmt::format("the job's control plane at {}:{}: {}", options_.address, options_.port,
                                        e.what()));
  }
}

void ControlPlaneClient::set(const std::string& key, const std::string& value) {
  Request request = make_request(Op::kSet, {key});
  request.value = value;
  ReplyReader(round_trip(encode(request), {})).finish();
}

std::optional<std::string> ControlPlaneClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  Request request = make_request(Op::kGet, {key});
  request.timeout_ms = static_cast<uint64_t>(timeout.count());
  ReplyReader reply(round_trip(encode(request), timeout.count() == 0 ? std::chrono::hours(24 * 365) : timeout));
  if (reply.status() == Status::kTimedOut) return std::nullopt;
  std::string value = reply.bytes();
  reply.finish();
  return value;
}

int64_t ControlPlaneClient::add(const std::string& key, int64_t delta) {
  Request request = make_request(Op::kAdd, {key});
  request.number = delta;
  ReplyReader reply(round_trip(encode(request), {}));
  const int64_t value = reply.number();
  reply.finish();
  return value;
}

std::string ControlPlaneClient::compare_set(const std::string& key, const std::string& expected,
                                            const std::string& desired) {
  Request request = make_request(Op::kCompareSet, {key});
  request.value = desired;
  request.expected = expected;
  ReplyReader reply(round_trip(encode(request), {}));
  std::string value = reply.bytes();
  reply.finish();
  return value;
}

bool ControlPlaneClient::remove(const std::string& key) {
  ReplyReader reply(round_trip(encode(make_request(Op::kDelete, {key})), {}));
  const bool existed = reply.number() != 0;
  reply.finish();
  return existed;
}

bool ControlPlaneClient::check(const std::vector<std::string>& keys) {
  ReplyReader reply(round_trip(encode(make_request(Op::kCheck, keys)), {}));
  const bool all = reply.number() != 0;
  reply.finish();
  return all;
}

int64_t ControlPlaneClient::key_count() {
  ReplyReader reply(round_trip(encode(make_request(Op::kNumKeys)), {}));
  const int64_t count = reply.number();
  reply.finish();
  return count;
}

bool ControlPlaneClient::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  Request request = make_request(Op::kWait, keys);
  request.timeout_ms = static_cast<uint64_t>(timeout.count());
  ReplyReader reply(round_trip(encode(request), timeout.count() == 0 ? std::chrono::hours(24 * 365) : timeout));
  reply.finish();
  return reply.status() == Status::kOk;
}

}  // namespace meshtrain::control
