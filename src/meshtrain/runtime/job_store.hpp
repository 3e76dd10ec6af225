// job_store.hpp — the job's control records in the coordinator's store (control/server.hpp, served by host 0), the
// c10d::Store that reaches it (so Gloo's rendezvous uses it too), and connecting.
//
//   meshtrain/joined/<h>       host h reached the rendezvous
//   meshtrain/heartbeat/<h>    a counter host h's watchdog increments every runtime.heartbeat_interval_s
//   meshtrain/finished/<h>     host h ended normally
//   meshtrain/abort            the first failure anywhere, "<exit code>\n<reason>"; the first writer wins
//   meshtrain/abort_seen/<h>   host h read the abort record (host 0 keeps serving until all have, for a moment)
//   meshtrain/facts/<h>, meshtrain/sees/<h>, meshtrain/verdict: the start-up agreement (job_agreement.hpp)
//
// Gloo groups keep their own keys under "group/<key>/".
#pragma once

#include "meshtrain/control/client.hpp"
#include "meshtrain/control/protocol.hpp"
#include "meshtrain/control/server.hpp"
#include "meshtrain/runtime/host_identity.hpp"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace meshtrain::runtime {

constexpr int kExitThisHostFailed = 1;
constexpr int kExitUsage = 2;  // a usage or start-up refusal: bad config, a file that is not there, hosts disagree
constexpr int kExitAnotherHostFailed = 3;

namespace store_keys {
inline const std::string kAbort = "meshtrain/abort";
inline const std::string kVerdict = "meshtrain/verdict";
std::string joined(int host);
std::string heartbeat(int host);
std::string finished(int host);
std::string abort_seen(int host);
std::string facts(int host);
std::string sees(int host);
}  // namespace store_keys

using control::to_ms;  // control/protocol.hpp
std::string to_string(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> to_bytes(const std::string& text);

// A c10d::Store over one control-plane connection (safe to share between threads; c10d's TCPStore client is not).
// `get` and `wait` wait for their keys up to the store's timeout, as c10d's stores do; a timeout is a c10::Error.
class JobStore final : public c10d::Store {
 public:
  JobStore(control::ClientOptions options, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  control::ControlPlaneClient client_;
};

// Host 0: serves the job's control plane at identity.master_addr:master_port, bound to that address only, admitting
// connections that prove identity.job_secret. UserError naming the address if it cannot.
std::unique_ptr<control::ControlPlaneServer> serve_control_plane(const HostIdentity& identity);

// Connects to the job's coordinator at identity.master_addr:master_port with identity.job_secret, retrying until
// `timeout_s`. UserError naming the address if it cannot reach it or is refused.
c10::intrusive_ptr<c10d::Store> connect_store(const HostIdentity& identity, double timeout_s);

// What a host prints when it cannot reach the coordinator any more: "host H lost contact with the job's coordinator
// (host 0 at A:P), which has probably died: <detail>".
std::string coordinator_lost_reason(const HostIdentity& identity, const std::string& detail);

// The first failure of the job, as published in the store.
struct AbortRecord {
  int exit_code = kExitThisHostFailed;  // what the failing host exits with; kExitUsage is passed on to every host
  std::string reason;

  // What another host exits with when it learns of this record: usage refusals stay 2, failures become 3.
  int exit_code_elsewhere() const { return exit_code == kExitUsage ? kExitUsage : kExitAnotherHostFailed; }
};

// Publishes `record` unless another is there already; returns the record that stands (the first one).
AbortRecord publish_abort(c10d::Store& store, const AbortRecord& record);
// The published record, if any.
std::optional<AbortRecord> read_abort(c10d::Store& store);

// Host 0 keeps the coordinator up after an abort until every other host has read the record (or finished), for at
// most `timeout_s`. `key_exists(key)` is one store check (the caller's, under its lock if it shares the store:
// c10d stores are not safe for concurrent use; the lock is not held while waiting).
void wait_until_hosts_read_abort(int hosts, double timeout_s, const std::function<bool(const std::string&)>& key_exists);

}  // namespace meshtrain::runtime
