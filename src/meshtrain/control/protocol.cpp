// protocol.cpp — request and reply encoding, the handshake's proofs, frames over sockets with deadlines.
#include "meshtrain/control/protocol.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace meshtrain::control {
namespace {

void put_u32(std::string& out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void put_u64(std::string& out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void put_string(std::string& out, const std::string& value) {
  put_u32(out, static_cast<uint32_t>(value.size()));
  out += value;
}

// Reads fields from a payload; every read checks the bounds.
class FieldReader {
 public:
  FieldReader(const std::string& payload, size_t offset) : payload_(payload), offset_(offset) {}

  uint64_t u64(int bytes) {
    need(static_cast<size_t>(bytes), "a number");
    uint64_t value = 0;
    for (int i = 0; i < bytes; ++i)
      value |= static_cast<uint64_t>(static_cast<uint8_t>(payload_[offset_ + i])) << (8 * i);
    offset_ += static_cast<size_t>(bytes);
    return value;
  }

  std::string string(const char* what, size_t max_bytes) {
    const uint64_t length = u64(4);
    if (length > max_bytes)
      throw ProtocolError(fmt::format("{} of {} bytes, more than the {} allowed", what, length, max_bytes));
    need(length, what);
    std::string value = payload_.substr(offset_, length);
    offset_ += length;
    return value;
  }

  void finish() const {
    if (offset_ != payload_.size())
      throw ProtocolError(fmt::format("{} bytes left over after the message", payload_.size() - offset_));
  }

 private:
  void need(size_t bytes, const char* what) const {
    if (payload_.size() - offset_ < bytes) throw ProtocolError(fmt::format("the message ends inside {}", what));
  }

  const std::string& payload_;
  size_t offset_;
};

std::string proof_message(const char* side, const std::string& server_nonce, const std::string& client_nonce) {
  std::string message = side;
  message.push_back('\0');
  return message + server_nonce + client_nonce;
}

int milliseconds_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

// Waits until `fd` is readable (true) or `deadline` passes (false).
bool wait_readable(int fd, int timeout_ms) {
  pollfd entry{fd, POLLIN, 0};
  while (true) {
    const int rc = ::poll(&entry, 1, timeout_ms);
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) throw ProtocolError(fmt::format("poll: {}", std::strerror(errno)));
  }
}

// Reads exactly `size` bytes by `deadline`. Returns false if the peer closed before the first byte and
// `close_ok_at_start`.
bool read_exact(int fd, char* data, size_t size, Clock::time_point deadline, bool close_ok_at_start) {
  size_t done = 0;
  while (done < size) {
    if (!wait_readable(fd, milliseconds_until(deadline)))
      throw ProtocolError(fmt::format("stalled: {} of {} bytes of a message came within its deadline", done, size));
    const ssize_t n = ::recv(fd, data + done, size - done, 0);
    if (n == 0) {
      if (done == 0 && close_ok_at_start) return false;
      throw ProtocolError("the peer closed the connection in the middle of a message");
    }
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw ProtocolError(fmt::format("recv: {}", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

Request make_request(Op op, std::vector<std::string> keys) {
  Request request;
  request.op = op;
  request.keys = std::move(keys);
  return request;
}

std::string encode(const Request& request) {
  std::string out;
  out.push_back(static_cast<char>(request.op));
  switch (request.op) {
    case Op::kSet: put_string(out, request.keys.at(0)); put_string(out, request.value); break;
    case Op::kGet: put_u64(out, request.timeout_ms); put_string(out, request.keys.at(0)); break;
    case Op::kAdd: put_string(out, request.keys.at(0)); put_u64(out, static_cast<uint64_t>(request.number)); break;
    case Op::kCompareSet:
      put_string(out, request.keys.at(0));
      put_string(out, request.expected);
      put_string(out, request.value);
      break;
    case Op::kDelete: put_string(out, request.keys.at(0)); break;
    case Op::kNumKeys: break;
    case Op::kWait: put_u64(out, request.timeout_ms); [[fallthrough]];
    case Op::kCheck:
      put_u32(out, static_cast<uint32_t>(request.keys.size()));
      for (const std::string& key : request.keys) put_string(out, key);
      break;
  }
  return out;
}

Request decode_request(const std::string& payload) {
  if (payload.empty()) throw ProtocolError("an empty request");
  Request request;
  const auto op = static_cast<uint8_t>(payload[0]);
  if (op < static_cast<uint8_t>(Op::kSet) || op > static_cast<uint8_t>(Op::kWait))
    throw ProtocolError(fmt::format("unknown request {}", op));
  request.op = static_cast<Op>(op);
  FieldReader in(payload, 1);
  auto key = [&] { request.keys.push_back(in.string("a key", kMaxKeyBytes)); };
  auto value = [&] { return in.string("a value", kMaxFrameBytes); };
  switch (request.op) {
    case Op::kSet: key(); request.value = value(); break;
    case Op::kGet: request.timeout_ms = in.u64(8); key(); break;
    case Op::kAdd: key(); request.number = static_cast<int64_t>(in.u64(8)); break;
    case Op::kCompareSet: key(); request.expected = value(); request.value = value(); break;
    case Op::kDelete: key(); break;
    case Op::kNumKeys: break;
    case Op::kWait: request.timeout_ms = in.u64(8); [[fallthrough]];
    case Op::kCheck: {
      const uint64_t count = in.u64(4);
      if (count > kMaxKeysPerRequest)
        throw ProtocolError(fmt::format("{} keys in one request, more than the {} allowed", count, kMaxKeysPerRequest));
      for (uint64_t i = 0; i < count; ++i) key();
      break;
    }
  }
  in.finish();
  return request;
}

ReplyWriter& ReplyWriter::bytes(const std::string& value) {
  put_string(bytes_, value);
  return *this;
}

ReplyWriter& ReplyWriter::number(int64_t value) {
  put_u64(bytes_, static_cast<uint64_t>(value));
  return *this;
}

ReplyReader::ReplyReader(std::string payload) : payload_(std::move(payload)) {
  if (payload_.empty()) throw ProtocolError("an empty reply");
  const auto status = static_cast<uint8_t>(payload_[0]);
  if (status > static_cast<uint8_t>(Status::kTimedOut)) throw ProtocolError(fmt::format("unknown status {}", status));
  status_ = static_cast<Status>(status);
}

std::string ReplyReader::bytes() {
  FieldReader in(payload_, offset_);
  std::string value = in.string("a value", kMaxFrameBytes);
  offset_ += 4 + value.size();
  return value;
}

int64_t ReplyReader::number() {
  FieldReader in(payload_, offset_);
  const auto value = static_cast<int64_t>(in.u64(8));
  offset_ += 8;
  return value;
}

void ReplyReader::finish() const { FieldReader(payload_, offset_).finish(); }

Digest client_proof(const std::string& secret, const std::string& server_nonce, const std::string& client_nonce) {
  return hmac_sha256(secret, proof_message("client", server_nonce, client_nonce));
}

Digest server_proof(const std::string& secret, const std::string& server_nonce, const std::string& client_nonce) {
  return hmac_sha256(secret, proof_message("server", server_nonce, client_nonce));
}

std::string to_string(const Digest& digest) { return std::string(digest.begin(), digest.end()); }

Digest to_digest(const std::string& bytes) {
  if (bytes.size() != Digest().size()) throw ProtocolError(fmt::format("a proof of {} bytes, not 32", bytes.size()));
  Digest digest{};
  std::copy(bytes.begin(), bytes.end(), digest.begin());
  return digest;
}

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

void write_frame(int fd, const std::string& payload, Clock::time_point deadline) {
  std::string frame;
  put_u32(frame, static_cast<uint32_t>(payload.size()));
  frame += payload;
  size_t done = 0;
  while (done < frame.size()) {
    pollfd entry{fd, POLLOUT, 0};
    const int rc = ::poll(&entry, 1, milliseconds_until(deadline));
    if (rc == 0) throw ProtocolError("stalled: the peer stopped reading");
    if (rc < 0) {
      if (errno == EINTR) continue;
      throw ProtocolError(fmt::format("poll: {}", std::strerror(errno)));
    }
    const ssize_t n = ::send(fd, frame.data() + done, frame.size() - done, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw ProtocolError(fmt::format("send: {}", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
}

std::optional<std::string> read_frame(int fd, std::optional<Clock::time_point> first_byte_deadline,
                                      std::chrono::milliseconds message_timeout,
                                      const std::function<bool()>& keep_going) {
  // Wait for the first byte in short slices, so that keep_going() is asked now and then.
  constexpr int kSliceMs = 200;
  while (true) {
    if (!keep_going()) return std::nullopt;
    int slice = kSliceMs;
    if (first_byte_deadline) {
      slice = std::min(slice, milliseconds_until(*first_byte_deadline));
      if (slice == 0 && Clock::now() >= *first_byte_deadline)
        throw ProtocolError("stalled: no message came within its deadline");
    }
    if (wait_readable(fd, slice)) break;
  }
  const Clock::time_point deadline = Clock::now() + message_timeout;
  char header[4];
  if (!read_exact(fd, header, sizeof header, deadline, true)) return std::nullopt;
  uint32_t length = 0;
  for (int i = 0; i < 4; ++i) length |= static_cast<uint32_t>(static_cast<uint8_t>(header[i])) << (8 * i);
  if (length > kMaxFrameBytes)
    throw ProtocolError(fmt::format("a message of {} bytes, more than the {} allowed", length, kMaxFrameBytes));
  std::string payload(length, '\0');
  read_exact(fd, payload.data(), length, deadline, false);
  return payload;
}

std::string peer_name(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return "an unknown peer";
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<sockaddr*>(&address), length, host, sizeof host, port, sizeof port,
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "an unknown peer";
  return address.ss_family == AF_INET6 ? fmt::format("[{}]:{}", host, port) : fmt::format("{}:{}", host, port);
}

}  // namespace meshtrain::control
