// watchdog.hpp — one host's failure detector: heartbeats through the coordinator's store, the abort record, lost
// contact with the coordinator, and local devices that stop making progress.
//
// Two threads, so that no blocking call can hide a failure:
//   beat      every heartbeat_interval_s: increments this host's heartbeat, reads the abort record, checks the other
//             hosts' heartbeats (a host that joined and then stayed silent for failure_timeout_s is dead) and the
//             local devices' progress (none for step_timeout_s: a hang)
//   deadline  checks that the beat thread completed a store round trip within failure_timeout_s; a partition (no
//             RST, packets just stop) blocks the beat thread inside the store client, and this thread ends the
//             process instead
// What it finds goes to the Events the host runtime supplies; each of them ends the process.
#pragma once

#include "meshtrain/runtime/comm.hpp"
#include "meshtrain/runtime/device_context.hpp"
#include "meshtrain/runtime/job_store.hpp"

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace meshtrain::runtime {

struct WatchdogTimes {
  double heartbeat_interval_s = 1;
  double failure_timeout_s = 30;
  double step_timeout_s = 600;  // 0: no hang detection
  double connect_timeout_s = 120;
};

// A local device as the watchdog sees it.
struct WatchedDevice {
  int device = 0;
  std::shared_ptr<const DeviceProgress> progress;
  std::shared_ptr<const CollectiveCounters> collectives;
};

class Watchdog {
 public:
  struct Events {
    // A failure this host found (a dead host, a hung device): publish it and end.
    std::function<void(const AbortRecord&)> failure_found;
    // Another host's failure, read from the store: end with it.
    std::function<void(const AbortRecord&)> abort_published;
    // No store round trip for failure_timeout_s: end (the reason cannot be read).
    std::function<void(const std::string&)> coordinator_lost;
  };

  Watchdog(const HostIdentity& identity, WatchdogTimes times, Events events);
  ~Watchdog();  // stops both threads
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The local devices to watch for progress (run_on_devices registers them as their threads start).
  void watch_device(WatchedDevice device);
  void unwatch_devices();
  // Per local device, the collectives it entered last (the flight recorder), for the log.
  std::vector<std::string> flight_recorder_lines() const;

  // Publishes `record` unless another host's came first; returns the one that stands.
  AbortRecord publish_abort(const AbortRecord& record);
  // Records that this host read the abort record (host 0 waits for that before it stops serving the store).
  void acknowledge_abort();
  // Host 0, aborting: waits until every other host that is still alive has read the abort record, at most `timeout_s`.
  void wait_for_acknowledgements(double timeout_s);
  // Marks this host finished; host 0 then waits for every host to finish (the others still use its store).
  void finish();

 private:
  void beat_loop();
  void deadline_loop();
  // One round of the beat thread; hands what it finds to the Events (store errors propagate).
  void check_round();
  std::optional<AbortRecord> find_hung_device() const;
  bool sleep_interval();  // false when stopping

  const HostIdentity identity_;
  const WatchdogTimes times_;
  const Events events_;
  c10::intrusive_ptr<c10d::Store> store_;
  std::mutex store_mutex_;  // one client, used by the beat thread and by abort/finish callers on other threads

  // Per host, owned by the beat thread.
  std::vector<bool> joined_, finished_;
  std::vector<int64_t> last_beat_;
  std::vector<std::chrono::steady_clock::time_point> last_change_;

  std::atomic<int64_t> last_contact_ns_;  // steady_clock time of the beat thread's last store round trip
  mutable std::mutex devices_mutex_;      // devices are registered by device threads, read by the beat thread
  std::vector<WatchedDevice> devices_;

  std::mutex stop_mutex_;
  std::condition_variable stop_changed_;
  bool stopping_ = false;
  std::thread beat_thread_, deadline_thread_;
};

}  // namespace meshtrain::runtime
