// host_runtime.hpp — one host process of a job: rendezvous, one worker thread per local device, failure handling.
//
// Host 0 serves the job's c10d TCPStore; every host and every device thread connects to it with a client of its own.
// Each local device runs the same function on its own thread with a DeviceContext (rank = global device id); its
// groups are Gloo process groups over the store. A watchdog thread per host beats a heartbeat into the store and
// watches for the others' and for an abort record: an exception in any device thread, a host that stops beating,
// or a lost coordinator ends every host within about failure_timeout_s, each printing the reason and exiting
// non-zero (1: this host failed, 3: another host did). No hang.
#pragma once

#include "meshtrain/mesh/mesh.hpp"
#include "meshtrain/runtime/device_context.hpp"
#include "meshtrain/runtime/host_identity.hpp"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <functional>
#include <memory>

namespace meshtrain::config {
class Config;
}

namespace meshtrain::runtime {

constexpr int kExitThisHostFailed = 1;
constexpr int kExitAnotherHostFailed = 3;

struct RuntimeOptions {
  int threads_per_device = 0;  // 0: the host's cores split evenly between its devices
  double failure_timeout_s = 30;
  double heartbeat_interval_s = 1;
  double rendezvous_timeout_s = 120;
  double collective_timeout_s = 600;

  static RuntimeOptions from_config(const config::Config& config);  // the runtime.* keys
};

// The group factory of one device: Gloo groups whose rendezvous goes through `store` under "group/<key>".
DeviceContext::GroupFactory gloo_group_factory(c10::intrusive_ptr<c10d::Store> store,
                                               std::shared_ptr<::gloo::transport::Device> gloo_device,
                                               std::shared_ptr<CollectiveCounters> counters,
                                               double collective_timeout_s);

class HostRuntime {
 public:
  // Connects to the coordinator (serving it on host 0), waits for every host, starts the watchdog, and logs
  // "All processes synchronized". Throws UserError if the hosts do not all arrive within rendezvous_timeout_s.
  HostRuntime(HostIdentity identity, const mesh::Mesh& mesh, RuntimeOptions options);
  // Waits until every host has finished (host 0 keeps serving the store until then), then stops the watchdog.
  ~HostRuntime();

  HostRuntime(const HostRuntime&) = delete;
  HostRuntime& operator=(const HostRuntime&) = delete;

  // Runs `fn` on one thread per local device and returns when all have returned. If any throws, the job ends
  // everywhere (this process exits; see the file comment).
  void run_on_devices(const std::function<void(DeviceContext&)>& fn);

  // Torch intra-op threads each device thread runs with (runtime.threads_per_device, or the cores split evenly).
  int threads_per_device() const { return threads_per_device_; }

  // Ends the job everywhere with `reason` (published for the other hosts), exiting with `exit_code`.
  [[noreturn]] void abort_job(const std::string& reason, int exit_code);

 private:
  class Watchdog;

  HostIdentity identity_;
  const mesh::Mesh& mesh_;
  RuntimeOptions options_;
  int threads_per_device_ = 1;
  c10::intrusive_ptr<c10d::Store> server_;  // host 0 only: the TCPStore that serves the job
  std::unique_ptr<Watchdog> watchdog_;
};

}  // namespace meshtrain::runtime
