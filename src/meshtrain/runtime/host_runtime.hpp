// host_runtime.hpp — HostRuntime: one host process of a job: the rendezvous (host 0 serves the control plane), the
// start-up agreement (agree_on_job, once, before any collective exists), one worker thread per local device
// (run_on_devices; rank = global device id) and the failure model (docs/runtime.md, "Failure").
//
// The first failure anywhere is published once and every host ends within about failure_timeout_s, printing that
// first reason and its devices' last collectives, with exit code 1 (this host failed: a device threw or hangs),
// 2 (usage or start-up refusal, on every host) or 3 (another host failed, or the coordinator was lost). A device whose
// collective fails in the transport waits for the real reason and reports its own only if none comes.
#pragma once

#include "meshtrain/mesh/mesh.hpp"
#include "meshtrain/runtime/device_context.hpp"
#include "meshtrain/runtime/host_identity.hpp"
#include "meshtrain/runtime/job_agreement.hpp"
#include "meshtrain/runtime/job_store.hpp"
#include "meshtrain/runtime/local_group.hpp"
#include "meshtrain/settings/settings.hpp"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <atomic>
#include <functional>
#include <memory>

namespace meshtrain::runtime {

class Watchdog;

// The runtime.* settings: threads per device and the timeouts.
using RuntimeOptions = settings::RuntimeSettings;

// The group factory of one device: Gloo groups whose rendezvous goes through `store` under "group/<key>"; a group
// whose members are all among `local_groups`' devices (the host's, shared by its device threads) moves its
// collectives through memory instead (its Gloo group carries only point-to-point exchanges), and a group with several
// members on each of several hosts gathers and reduce-scatters in two levels (runtime/comm.hpp HostSplit: a local
// group of its members on this host, a Gloo group "<key>/across-hosts-<i>" of the i-th member of every host).
DeviceContext::GroupFactory gloo_group_factory(c10::intrusive_ptr<c10d::Store> store,
                                               std::shared_ptr<::gloo::transport::Device> gloo_device,
                                               std::shared_ptr<CollectiveCounters> counters,
                                               double collective_timeout_s,
                                               std::shared_ptr<LocalGroups> local_groups = nullptr);

// For a host that fails before its HostRuntime exists (a config it cannot load, a missing file): publishes the
// reason in the job's store so that the other hosts end with it instead of waiting for this one, then returns.
// Host 0 serves the store for a moment so the others can read it. Best effort: the coordinator may be unreachable.
void publish_startup_failure(const HostIdentity& identity, const std::string& reason, int exit_code);

class HostRuntime {
 public:
  // Connects to the coordinator (serving it on host 0), starts the watchdog, waits for every host, and logs
  // "All processes synchronized". Throws UserError if the hosts do not all arrive within rendezvous_timeout_s;
  // ends the process if another host published a failure meanwhile.
  HostRuntime(HostIdentity identity, const mesh::Mesh& mesh, RuntimeOptions options);
  // Waits until every host has finished (host 0 keeps serving the store until then), then stops the watchdog.
  ~HostRuntime();

  HostRuntime(const HostRuntime&) = delete;
  HostRuntime& operator=(const HostRuntime&) = delete;

  // Publishes this host's facts, and returns host 0's once every host's agree (what host 0 decides for all:
  // JobFacts::mfu_peak); otherwise every host ends with exit code 2, printing each difference per host. Call it
  // once, before run_on_devices.
  JobFacts agree_on_job(const JobFacts& facts);

  // Runs `fn` on one thread per local device and returns when all have returned. If any throws, the job ends
  // everywhere (this process exits; see the file comment).
  void run_on_devices(const std::function<void(DeviceContext&)>& fn);

  // Torch intra-op threads each device thread runs with (runtime.threads_per_device, or the cores split evenly).
  int threads_per_device() const { return threads_per_device_; }

  // Ends the job everywhere with `reason` (published for the other hosts unless one came first), exiting with
  // `exit_code` (or, when another host's failure came first, with what that one asks of this host).
  [[noreturn]] void abort_job(const std::string& reason, int exit_code);

 private:
  // Ends this process because of `record`, published by another host (or found unreachable): prints it and the
  // devices' last collectives.
  [[noreturn]] void end_for_another_host(const AbortRecord& record);
  [[noreturn]] void end_without_coordinator(const std::string& reason);
  void log_flight_recorder() const;
  // Polls the store until `keys` all exist, ending the process if an abort is published; UserError after `timeout_s`.
  void wait_for_keys(c10d::Store& store, const std::vector<std::string>& keys, double timeout_s, const char* what);

  HostIdentity identity_;
  const mesh::Mesh& mesh_;
  RuntimeOptions options_;
  int threads_per_device_ = 1;
  std::unique_ptr<control::ControlPlaneServer> server_;  // host 0 only: the job's control plane
  c10::intrusive_ptr<c10d::Store> store_;   // the main thread's client (rendezvous, agreement)
  std::unique_ptr<Watchdog> watchdog_;
  std::atomic<bool> ending_{false};  // the first thread to end the process prints its reason; others wait for exit
};

}  // namespace meshtrain::runtime
