// watchdog.cpp — heartbeats, the abort record, the coordinator deadline and hang detection (see watchdog.hpp).
#include "meshtrain/runtime/watchdog.hpp"

#include "meshtrain/common/error.hpp"

#include <fmt/format.h>

namespace meshtrain::runtime {
namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

}  // namespace

Watchdog::Watchdog(const HostIdentity& identity, WatchdogTimes times, Events events)
    : identity_(identity), times_(times), events_(std::move(events)), last_contact_ns_(now_ns()) {
  store_ = connect_store(identity_, times_.connect_timeout_s);
  joined_.assign(identity_.hosts, false);
  finished_.assign(identity_.hosts, false);
  last_beat_.assign(identity_.hosts, -1);
  last_change_.assign(identity_.hosts, Clock::now());
  beat_thread_ = std::thread([this] { beat_loop(); });
  deadline_thread_ = std::thread([this] { deadline_loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    stopping_ = true;
  }
  stop_changed_.notify_all();
  beat_thread_.join();
  deadline_thread_.join();
}

bool Watchdog::sleep_interval() {
  std::unique_lock<std::mutex> lock(stop_mutex_);
  return !stop_changed_.wait_for(lock, to_ms(times_.heartbeat_interval_s), [this] { return stopping_; });
}

void Watchdog::watch_device(WatchedDevice device) {
  std::lock_guard<std::mutex> lock(devices_mutex_);
  devices_.push_back(std::move(device));
}

void Watchdog::unwatch_devices() {
  std::lock_guard<std::mutex> lock(devices_mutex_);
  devices_.clear();
}

std::vector<std::string> Watchdog::flight_recorder_lines() const {
  std::lock_guard<std::mutex> lock(devices_mutex_);
  std::vector<std::string> lines;
  for (const WatchedDevice& d : devices_) {
    const std::vector<std::string> recent = d.collectives->recent_lines();
    lines.push_back(fmt::format("host {} device {} (at step {}, last progress {:.1f} s ago): {}", identity_.host,
                                d.device, d.progress->step(), d.progress->seconds_since_progress(),
                                recent.empty() ? "no collective entered yet" : "its last collectives:"));
    for (const std::string& line : recent) lines.push_back("    " + line);
  }
  return lines;
}

AbortRecord Watchdog::publish_abort(const AbortRecord& record) {
  std::lock_guard<std::mutex> lock(store_mutex_);
  return runtime::publish_abort(*store_, record);
}

void Watchdog::acknowledge_abort() {
  std::lock_guard<std::mutex> lock(store_mutex_);
  store_->set(store_keys::abort_seen(identity_.host), to_bytes("1"));
}

void Watchdog::wait_for_acknowledgements(double timeout_s) {
  wait_until_hosts_read_abort(identity_.hosts, timeout_s, [this](const std::string& key) {
    std::lock_guard<std::mutex> lock(store_mutex_);
    return store_->check({key});
  });
}

void Watchdog::finish() {
  {
    std::lock_guard<std::mutex> lock(store_mutex_);
    store_->set(store_keys::finished(identity_.host), to_bytes("1"));
  }
  if (identity_.host != 0) return;
  // Bounded: a host that dies instead of finishing stops beating, and the beat thread ends the job.
  for (int h = 1; h < identity_.hosts; ++h) {
    while (true) {
      {
        std::lock_guard<std::mutex> lock(store_mutex_);
        if (store_->check({store_keys::finished(h)})) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

void Watchdog::beat_loop() {
  while (sleep_interval()) {
    try {
      check_round();
    } catch (const std::exception& e) {
      events_.coordinator_lost(coordinator_lost_reason(identity_, e.what()));
      return;
    }
  }
}

void Watchdog::check_round() {
  std::optional<AbortRecord> published, found;
  {
    std::lock_guard<std::mutex> lock(store_mutex_);
    store_->add(store_keys::heartbeat(identity_.host), 1);
    published = read_abort(*store_);
    const auto now = Clock::now();
    for (int h = 0; h < identity_.hosts && !published && !found; ++h) {
      if (h == identity_.host || finished_[h]) continue;
      if (!joined_[h]) {
        // Before a host joins, the rendezvous deadline applies to it, not the heartbeat.
        if (!store_->check({store_keys::joined(h)})) continue;
        joined_[h] = true;
        last_change_[h] = now;
      }
      if (store_->check({store_keys::finished(h)})) {
        finished_[h] = true;
        continue;
      }
      const int64_t beat = store_->add(store_keys::heartbeat(h), 0);
      if (beat != last_beat_[h]) {
        last_beat_[h] = beat;
        last_change_[h] = now;
      } else if (now - last_change_[h] > to_ms(times_.failure_timeout_s)) {
        found = AbortRecord{kExitAnotherHostFailed,
                            fmt::format("host {} stopped responding (no heartbeat for {:.1f} s): it died, or the "
                                        "network between it and the coordinator (host 0) is cut",
                                        h, times_.failure_timeout_s)};
      }
    }
  }
  last_contact_ns_.store(now_ns());
  if (published) return events_.abort_published(*published);
  if (!found) found = find_hung_device();
  if (found) events_.failure_found(*found);
}

std::optional<AbortRecord> Watchdog::find_hung_device() const {
  if (times_.step_timeout_s <= 0) return std::nullopt;
  std::lock_guard<std::mutex> lock(devices_mutex_);
  // A device that waits in a collective is usually waiting for the one that hangs elsewhere: give that one's host
  // two heartbeats to report it first.
  const double grace_s = 2 * times_.heartbeat_interval_s;
  for (const WatchedDevice& d : devices_) {
    const double idle_s = d.progress->seconds_since_progress();
    if (idle_s <= times_.step_timeout_s) continue;
    const std::vector<CollectiveEntry> recent = d.collectives->recent();
    const bool waiting = !recent.empty() && !recent.back().completed;
    if (!waiting)
      return AbortRecord{kExitThisHostFailed,
                         fmt::format("host {} device {} hangs: no progress for {:.1f} s after step {} "
                                     "(runtime.step_timeout_s={}), and it is not waiting in a collective",
                                     identity_.host, d.device, idle_s, d.progress->step(), times_.step_timeout_s)};
    if (idle_s > times_.step_timeout_s + grace_s) {
      const CollectiveEntry& e = recent.back();
      return AbortRecord{kExitThisHostFailed,
                         fmt::format("host {} device {} made no progress for {:.1f} s after step {} "
                                     "(runtime.step_timeout_s={}): it waits in {} #{} over {}, which a peer never "
                                     "joined",
                                     identity_.host, d.device, idle_s, d.progress->step(), times_.step_timeout_s,
                                     collective_name(e.kind), e.sequence, e.group)};
    }
  }
  return std::nullopt;
}

void Watchdog::deadline_loop() {
  while (sleep_interval()) {
    const double silent_s = static_cast<double>(now_ns() - last_contact_ns_.load()) * 1e-9;
    if (silent_s > times_.failure_timeout_s) {
      events_.coordinator_lost(fmt::format(
          "host {} has had no answer from the job's coordinator (host 0 at {}:{}) for {:.1f} s "
          "(runtime.failure_timeout_s={}): host 0 is gone or the network between them is cut",
          identity_.host, identity_.master_addr, identity_.master_port, silent_s, times_.failure_timeout_s));
      return;
    }
  }
}

}  // namespace meshtrain::runtime
