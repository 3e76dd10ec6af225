// job_store.hpp — the job's control records in the coordinator's c10d TCPStore (served by host 0), and connecting.
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

#include "meshtrain/runtime/host_identity.hpp"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <functional>
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

std::chrono::milliseconds to_ms(double seconds);
std::string to_string(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> to_bytes(const std::string& text);

// Connects to the job's coordinator at identity.master_addr:master_port (serving it when `serve`), retrying until
// `timeout_s`. UserError naming the address if it cannot.
c10::intrusive_ptr<c10d::TCPStore> connect_store(const HostIdentity& identity, bool serve, double timeout_s);

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
