// host_runtime.cpp — TCPStore rendezvous, device threads with Gloo groups, heartbeat watchdog, job-wide abort.
#include "meshtrain/runtime/host_runtime.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/common/log.hpp"
#include "meshtrain/config/config.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include <unistd.h>

namespace meshtrain::runtime {
namespace {

using Clock = std::chrono::steady_clock;

const std::string kAbortKey = "meshtrain/abort";
std::string heartbeat_key(int host) { return fmt::format("meshtrain/heartbeat/{}", host); }
std::string finished_key(int host) { return fmt::format("meshtrain/finished/{}", host); }
std::string joined_key(int host) { return fmt::format("meshtrain/joined/{}", host); }

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

std::string to_string(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }
std::vector<uint8_t> to_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

c10::intrusive_ptr<c10d::TCPStore> connect_store(const HostIdentity& id, bool serve, double timeout_s) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(id.master_port);
  options.isServer = serve;
  options.waitWorkers = false;
  options.timeout = to_ms(timeout_s);
  try {
    return c10::make_intrusive<c10d::TCPStore>(id.master_addr, options);
  } catch (const std::exception& e) {
    throw UserError(fmt::format("host {}: cannot {} the job's coordinator at {}:{}: {}", id.host,
                                serve ? "serve" : "reach", id.master_addr, id.master_port, e.what()));
  }
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr.rfind("127.", 0) == 0 || addr == "::1";
}

std::shared_ptr<::gloo::transport::Device> make_gloo_device(const HostIdentity& id) {
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
    return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  if (is_loopback(id.master_addr)) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

}  // namespace

DeviceContext::GroupFactory gloo_group_factory(c10::intrusive_ptr<c10d::Store> store,
                                               std::shared_ptr<::gloo::transport::Device> gloo_device,
                                               std::shared_ptr<CollectiveCounters> counters,
                                               double collective_timeout_s) {
  return [store, gloo_device, counters, collective_timeout_s](const std::string& label, const std::string& key,
                                                              const std::vector<int>& members, int rank) {
    auto prefix = c10::make_intrusive<c10d::PrefixStore>("group/" + key, store);
    auto options = c10d::ProcessGroupGloo::Options::create(to_ms(collective_timeout_s));
    options->devices.push_back(gloo_device);
    options->threads = 1;
    auto group = c10::make_intrusive<c10d::ProcessGroupGloo>(prefix, rank, static_cast<int>(members.size()), options);
    return Comm(label, group, counters);
  };
}

RuntimeOptions RuntimeOptions::from_config(const config::Config& config) {
  RuntimeOptions o;
  o.threads_per_device = static_cast<int>(config.get_int("runtime.threads_per_device"));
  o.failure_timeout_s = config.get_float("runtime.failure_timeout_s");
  o.heartbeat_interval_s = config.get_float("runtime.heartbeat_interval_s");
  o.rendezvous_timeout_s = config.get_float("runtime.rendezvous_timeout_s");
  o.collective_timeout_s = config.get_float("runtime.collective_timeout_s");
  MT_USER_CHECK(o.threads_per_device >= 0, "runtime.threads_per_device must be >= 0 (0 = auto), got {}",
                o.threads_per_device);
  MT_USER_CHECK(o.heartbeat_interval_s > 0, "runtime.heartbeat_interval_s must be > 0, got {}", o.heartbeat_interval_s);
  MT_USER_CHECK(o.failure_timeout_s > 2 * o.heartbeat_interval_s,
                "runtime.failure_timeout_s ({}) must exceed twice runtime.heartbeat_interval_s ({})",
                o.failure_timeout_s, o.heartbeat_interval_s);
  MT_USER_CHECK(o.rendezvous_timeout_s > 0, "runtime.rendezvous_timeout_s must be > 0, got {}", o.rendezvous_timeout_s);
  MT_USER_CHECK(o.collective_timeout_s > 0, "runtime.collective_timeout_s must be > 0, got {}", o.collective_timeout_s);
  return o;
}

// Beats this host's heartbeat, watches the others' and the abort record; ends the process on failure.
class HostRuntime::Watchdog {
 public:
  Watchdog(HostRuntime& runtime) : runtime_(runtime) {
    const HostIdentity& id = runtime.identity_;
    store_ = connect_store(id, false, runtime.options_.rendezvous_timeout_s);
    last_beat_.assign(id.hosts, -1);
    last_change_.assign(id.hosts, Clock::now());
    finished_.assign(id.hosts, false);
    thread_ = std::thread([this] { loop(); });
  }

  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  // Publishes the reason for the other hosts (first reason wins), best effort.
  void publish_abort(const std::string& reason) {
    std::lock_guard<std::mutex> lock(store_mutex_);
    try {
      if (!store_->check({kAbortKey})) store_->set(kAbortKey, to_bytes(reason));
    } catch (const std::exception&) {
      // The coordinator is gone; the other hosts will notice that themselves.
    }
  }

  // Marks this host finished, then (host 0) waits for every host to finish so the store outlives their use of it.
  void finish() {
    const HostIdentity& id = runtime_.identity_;
    {
      std::lock_guard<std::mutex> lock(store_mutex_);
      store_->set(finished_key(id.host), to_bytes("1"));
    }
    if (id.host != 0) return;
    for (int h = 1; h < id.hosts; ++h) {
      while (true) {
        {
          std::lock_guard<std::mutex> lock(store_mutex_);
          if (store_->check({finished_key(h)})) break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }

 private:
  void loop() {
    const HostIdentity& id = runtime_.identity_;
    const auto interval = to_ms(runtime_.options_.heartbeat_interval_s);
    const auto timeout = to_ms(runtime_.options_.failure_timeout_s);
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (wake_.wait_for(lock, interval, [this] { return stop_; })) return;
      }
      std::string abort_reason, dead_host_reason;
      try {
        std::lock_guard<std::mutex> lock(store_mutex_);
        store_->add(heartbeat_key(id.host), 1);
        if (store_->check({kAbortKey})) abort_reason = to_string(store_->get(kAbortKey));
        const auto now = Clock::now();
        for (int h = 0; h < id.hosts && abort_reason.empty() && dead_host_reason.empty(); ++h) {
          if (h == id.host || finished_[h]) continue;
          if (store_->check({finished_key(h)})) {
            finished_[h] = true;
            continue;
          }
          int64_t beat = store_->add(heartbeat_key(h), 0);
          if (beat != last_beat_[h]) {
            last_beat_[h] = beat;
            last_change_[h] = now;
          } else if (now - last_change_[h] > timeout) {
            dead_host_reason = fmt::format("host {} stopped responding (no heartbeat for {:.1f} s)", h,
                                           runtime_.options_.failure_timeout_s);
          }
        }
      } catch (const std::exception& e) {
        log::error("host {}: lost contact with the job's coordinator (host 0 at {}:{}), which has probably died: {}",
                   id.host, id.master_addr, id.master_port, e.what());
        std::_Exit(kExitAnotherHostFailed);
      }
      if (!abort_reason.empty()) {
        log::error("host {}: the job was aborted: {}", id.host, abort_reason);
        std::_Exit(kExitAnotherHostFailed);
      }
      if (!dead_host_reason.empty()) runtime_.abort_job(dead_host_reason, kExitAnotherHostFailed);
    }
  }

  HostRuntime& runtime_;
  c10::intrusive_ptr<c10d::TCPStore> store_;
  std::mutex store_mutex_;  // the store client is used by the watchdog thread and by abort/finish callers
  std::vector<int64_t> last_beat_;
  std::vector<Clock::time_point> last_change_;
  std::vector<bool> finished_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

HostRuntime::HostRuntime(HostIdentity identity, const mesh::Mesh& mesh, RuntimeOptions options)
    : identity_(std::move(identity)), mesh_(mesh), options_(options) {
  MT_CHECK(mesh.hosts() == identity_.hosts && mesh.devices_per_host() == identity_.devices_per_host,
           "the mesh was built for {} hosts x {} devices, but this host is one of {} hosts with {} devices",
           mesh.hosts(), mesh.devices_per_host(), identity_.hosts, identity_.devices_per_host);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads_per_device_ =
      options_.threads_per_device > 0 ? options_.threads_per_device : std::max(1, cores / identity_.devices_per_host);

  log::info("Host {} of {} (from {}, pid {}), {} devices, {} torch threads per device, coordinator {}:{}",
            identity_.host, identity_.hosts, identity_.source, ::getpid(), identity_.devices_per_host,
            threads_per_device_, identity_.master_addr, identity_.master_port);
  if (identity_.host == 0) server_ = connect_store(identity_, true, options_.rendezvous_timeout_s);

  // Rendezvous: every host announces itself and waits for the others.
  auto store = connect_store(identity_, false, options_.rendezvous_timeout_s);
  store->set(joined_key(identity_.host), to_bytes("1"));
  const auto deadline = Clock::now() + to_ms(options_.rendezvous_timeout_s);
  while (true) {
    std::vector<int> missing;
    for (int h = 0; h < identity_.hosts; ++h)
      if (!store->check({joined_key(h)})) missing.push_back(h);
    if (missing.empty()) break;
    if (Clock::now() > deadline)
      throw UserError(fmt::format("host {}: hosts {} did not join within runtime.rendezvous_timeout_s={} s",
                                  identity_.host, fmt::join(missing, ","), options_.rendezvous_timeout_s));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  watchdog_ = std::make_unique<Watchdog>(*this);
  log::info("All processes synchronized, starting");
}

HostRuntime::~HostRuntime() {
  try {
    watchdog_->finish();
  } catch (const std::exception& e) {
    log::warning("host {}: could not record the end of the job: {}", identity_.host, e.what());
  }
  watchdog_.reset();
}

void HostRuntime::abort_job(const std::string& reason, int exit_code) {
  // The first failure in this process tells the story; later ones (often its consequences) wait for the exit.
  static std::atomic<bool> aborting{false};
  if (aborting.exchange(true))
    while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
  log::error("{}; ending the job on every host", reason);
  if (watchdog_) watchdog_->publish_abort(reason);
  // Host 0 serves the store: give the others one heartbeat interval to read the reason before it goes away.
  if (identity_.host == 0 && identity_.hosts > 1)
    std::this_thread::sleep_for(to_ms(2 * options_.heartbeat_interval_s));
  std::_Exit(exit_code);
}

void HostRuntime::run_on_devices(const std::function<void(DeviceContext&)>& fn) {
  std::vector<std::thread> threads;
  for (int device : mesh_.devices_of_host(identity_.host)) {
    threads.emplace_back([this, device, &fn] {
      // Declared outside the try: the groups must outlive the abort, or their closing connections would make the
      // peers fail first and hide the real reason.
      std::unique_ptr<DeviceContext> context;
      try {
        at::set_num_threads(threads_per_device_);
        // Each device thread has its own store client: a TCPStore client shared between threads is not safe.
        auto store = connect_store(identity_, false, options_.rendezvous_timeout_s);
        auto gloo_device = make_gloo_device(identity_);
        auto counters = std::make_shared<CollectiveCounters>();
        context = std::make_unique<DeviceContext>(
            mesh_, device, gloo_group_factory(store, gloo_device, counters, options_.collective_timeout_s), counters);
        fn(*context);
      } catch (const std::exception& e) {
        abort_job(fmt::format("host {} device {} failed: {}", identity_.host, device, e.what()), kExitThisHostFailed);
      }
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace meshtrain::runtime
