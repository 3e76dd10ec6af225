// protocol.hpp — the control plane's wire protocol: frames, the secret handshake, requests and replies.
//
// Every message is a frame: a 4-byte little-endian payload length (at most kMaxFrameBytes), then the payload. A
// connection opens with a mutual challenge-response (neither side sends the secret):
//   server -> client   kGreeting + server nonce (32 bytes)
//   client -> server   client nonce (32) + HMAC(secret, "client" 0 server-nonce client-nonce)
//   server -> client   kAccepted + HMAC(secret, "server" 0 server-nonce client-nonce), or kRefused and a close
// then requests, each answered in order. A request is an op byte then its fields; a string field is a 4-byte length
// and its bytes. A reply is a status byte (kOk, kTimedOut) and the op's result. Anything malformed is a
// ProtocolError; the server drops that connection.
#pragma once

#include "meshtrain/common/error.hpp"
#include "meshtrain/control/secret.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace meshtrain::control {

constexpr size_t kMaxFrameBytes = 8u << 20;  // a frame's payload
constexpr size_t kMaxKeyBytes = 4096;
constexpr size_t kMaxKeysPerRequest = 4096;
constexpr size_t kNonceBytes = 32;
inline const std::string kGreeting = "meshtrain-control-plane/1";
constexpr uint8_t kAccepted = 0;
constexpr uint8_t kRefused = 1;

class ProtocolError : public Error {
 public:
  explicit ProtocolError(const std::string& message) : Error(message) {}
};

enum class Op : uint8_t {
  kSet = 1,         // key, value                      -> (nothing)
  kGet = 2,         // timeout_ms, key                 -> value, once the key exists (kTimedOut otherwise)
  kAdd = 3,         // key, delta                      -> the new value (a missing key counts as 0)
  kCompareSet = 4,  // key, expected, desired          -> the value that stands afterwards
  kDelete = 5,      // key                             -> 1 if it existed
  kCheck = 6,       // keys                            -> 1 if all exist
  kNumKeys = 7,     //                                 -> the number of keys
  kWait = 8,        // timeout_ms, keys                -> (nothing), once all exist (kTimedOut otherwise)
};

enum class Status : uint8_t { kOk = 0, kTimedOut = 1 };

struct Request {
  Op op = Op::kSet;
  std::vector<std::string> keys;  // one key, except kCheck / kWait
  std::string value;              // kSet: the value; kCompareSet: the desired value
  std::string expected;           // kCompareSet
  int64_t number = 0;             // kAdd: the delta
  uint64_t timeout_ms = 0;        // kGet, kWait: 0 waits without a limit
};

// A request of `op` on `keys`, its other fields empty.
Request make_request(Op op, std::vector<std::string> keys = {});

std::string encode(const Request& request);
// ProtocolError when `payload` is not a well-formed request (unknown op, a field past the end, bytes left over, a key
// longer than kMaxKeyBytes, more than kMaxKeysPerRequest keys).
Request decode_request(const std::string& payload);

// A reply's fields, in the order the op gives them.
class ReplyWriter {
 public:
  explicit ReplyWriter(Status status) { bytes_.push_back(static_cast<char>(status)); }
  ReplyWriter& bytes(const std::string& value);
  ReplyWriter& number(int64_t value);
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

class ReplyReader {
 public:
  explicit ReplyReader(std::string payload);  // ProtocolError if empty or the status is unknown
  Status status() const { return status_; }
  std::string bytes();
  int64_t number();
  void finish() const;  // ProtocolError if bytes are left over

 private:
  std::string payload_;
  size_t offset_ = 1;
  Status status_;
};

// The handshake's proofs.
Digest client_proof(const std::string& secret, const std::string& server_nonce, const std::string& client_nonce);
Digest server_proof(const std::string& secret, const std::string& server_nonce, const std::string& client_nonce);
std::string to_string(const Digest& digest);
Digest to_digest(const std::string& bytes);  // ProtocolError unless 32 bytes

// --- blocking socket I/O with deadlines ------------------------------------------------------------------------------
using Clock = std::chrono::steady_clock;

// A timeout given in seconds (a config value, an option) as milliseconds.
std::chrono::milliseconds to_ms(double seconds);

// Writes all of `payload` as one frame. ProtocolError if the peer closed or `deadline` passed.
void write_frame(int fd, const std::string& payload, Clock::time_point deadline);
// Reads one frame. The first byte may take until `first_byte_deadline` (nullopt: no limit); the rest must arrive
// within `message_timeout` of it. Returns nullopt if the peer closed cleanly before a frame began or `keep_going()`
// turned false while waiting for one; ProtocolError for a stall, an oversized length, or a close mid-frame.
std::optional<std::string> read_frame(int fd, std::optional<Clock::time_point> first_byte_deadline,
                                      std::chrono::milliseconds message_timeout,
                                      const std::function<bool()>& keep_going);

// "1.2.3.4:5678" or "[::1]:5678": the peer of a connected socket.
std::string peer_name(int fd);

}  // namespace meshtrain::control
