// host_runtime.cpp — rendezvous, the start-up agreement, device threads with Gloo groups, job-wide abort.
#include "meshtrain/runtime/host_runtime.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/common/json_read.hpp"
#include "meshtrain/common/log.hpp"
#include "meshtrain/runtime/compute_threads.hpp"
#include "meshtrain/runtime/network.hpp"
#include "meshtrain/runtime/watchdog.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include <unistd.h>

namespace fs = std::filesystem;

namespace meshtrain::runtime {
namespace {

using Clock = std::chrono::steady_clock;

const std::string kJobIdKey = "meshtrain/job_id";

// Binds to what network.hpp chooses (an interface named by --iface or GLOO_SOCKET_IFNAME, else the local address
// that routes to the master), and logs it once per host.
std::shared_ptr<::gloo::transport::Device> make_gloo_device(const HostIdentity& id) {
  const GlooBinding binding = choose_gloo_binding(id.master_addr, id.master_port, id.iface);
  static std::once_flag logged;
  std::call_once(logged, [&] {
    log::info("Host {} advertises {} on {} to its peers ({})", id.host, binding.address, binding.interface,
              describe(binding.choice));
  });
  if (binding.by_interface()) return c10d::ProcessGroupGloo::createDeviceForInterface(binding.interface);
  return c10d::ProcessGroupGloo::createDeviceForHostname(binding.address);
}

// How long host 0 keeps serving the store after publishing a failure, for the others to read it (they poll once per
// heartbeat interval); it stops earlier once they all have.
double linger_seconds(const RuntimeOptions& options) { return 2 * options.heartbeat_interval_s + 1; }

// A file in `dir` that names this host of this job, for the shared-storage check.
fs::path host_marker(const fs::path& dir, const std::string& job_id, int host) {
  return dir / ".meshtrain-hosts" / fmt::format("{}-host-{}", job_id, host);
}

}  // namespace

DeviceContext::GroupFactory gloo_group_factory(c10::intrusive_ptr<c10d::Store> store,
                                               std::shared_ptr<::gloo::transport::Device> gloo_device,
                                               std::shared_ptr<CollectiveCounters> counters,
                                               double collective_timeout_s,
                                               std::shared_ptr<LocalGroups> local_groups) {
  return [store, gloo_device, counters, collective_timeout_s, local_groups](
             const std::string& label, const std::string& key, const std::vector<int>& members, int rank) {
    auto gloo_group = [&](const std::string& group_key, int group_rank, int group_size) {
      auto prefix = c10::make_intrusive<c10d::PrefixStore>("group/" + group_key, store);
      auto options = c10d::ProcessGroupGloo::Options::create(to_ms(collective_timeout_s));
      options->devices.push_back(gloo_device);
      options->threads = 1;
      return c10::make_intrusive<c10d::ProcessGroupGloo>(prefix, group_rank, group_size, options);
    };
    try {
      auto group = gloo_group(key, rank, static_cast<int>(members.size()));
      if (!local_groups) return Comm(label, group, counters);
      if (auto local = local_groups->group(key, label, members, collective_timeout_s))
        return Comm(label, std::move(local), rank, group, counters);
      if (auto layout = local_groups->layout_across_hosts(members)) {
        HostSplit split;
        int host_index = 0;
        for (size_t h = 0; h < layout->group_rank.size(); ++h)
          for (size_t i = 0; i < layout->group_rank[h].size(); ++i)
            if (layout->group_rank[h][i] == rank) {
              host_index = static_cast<int>(h);
              split.on_host_rank = static_cast<int>(i);
            }
        std::vector<int> on_host_devices;
        for (int member_rank : layout->group_rank[host_index]) on_host_devices.push_back(members[member_rank]);
        split.on_host = local_groups->group(fmt::format("{}/on-host-{}", key, layout->hosts[host_index]), label,
                                            on_host_devices, collective_timeout_s);
        split.across_hosts = gloo_group(fmt::format("{}/across-hosts-{}", key, split.on_host_rank), host_index,
                                        static_cast<int>(layout->hosts.size()));
        split.group_rank = std::move(layout->group_rank);
        return Comm(label, group, std::move(split), counters);
      }
      return Comm(label, group, counters);
    } catch (const std::exception& e) {
      // Forming a group talks to the coordinator's store and to every member: when that fails, it is most likely
      // because a peer or the coordinator died, so it ends like a failed collective (the watchdog names the cause).
      throw CollectiveError(fmt::format("forming the group over {} ({} devices, rank {}) failed in the transport: {}",
                                        label, members.size(), rank, e.what()));
    }
  };
}

void publish_startup_failure(const HostIdentity& identity, const std::string& reason, int exit_code) {
  const RuntimeOptions defaults;
  try {
    std::unique_ptr<control::ControlPlaneServer> server;
    if (identity.host == 0) server = serve_control_plane(identity);
    auto store = connect_store(identity, 10);
    publish_abort(*store, AbortRecord{exit_code, fmt::format("host {} failed at start-up: {}", identity.host, reason)});
    if (identity.host != 0) return;
    // Serve until every other host has read it (they poll while they wait for the rendezvous), for a bounded time.
    wait_until_hosts_read_abort(identity.hosts, defaults.failure_timeout_s,
                                [&](const std::string& key) { return store->check({key}); });
  } catch (const std::exception& e) {
    log::warning("host {}: could not tell the other hosts why it stopped: {}", identity.host, e.what());
  }
}

HostRuntime::HostRuntime(HostIdentity identity, const mesh::Mesh& mesh, RuntimeOptions options)
    : identity_(std::move(identity)), mesh_(mesh), options_(options) {
  MT_CHECK(mesh.hosts() == identity_.hosts && mesh.devices_per_host() == identity_.devices_per_host,
           "the mesh was built for {} hosts x {} devices, but this host is one of {} hosts with {} devices",
           mesh.hosts(), mesh.devices_per_host(), identity_.hosts, identity_.devices_per_host);
  threads_per_device_ = resolve_threads_per_device(options_.threads_per_device, identity_.devices_per_host);

  log::info("Host {} of {} (from {}, pid {}), {} devices, {} torch threads per device ({}; OpenMP: {}), coordinator "
            "{}:{}", identity_.host, identity_.hosts, identity_.source, ::getpid(), identity_.devices_per_host,
            threads_per_device_, set_blas_threads(threads_per_device_), openmp_wait_setting(),
            identity_.master_addr, identity_.master_port);
  if (identity_.host == 0) {
    server_ = serve_control_plane(identity_);
    log::info("Control plane: served at {}:{} (bound to that address only); it admits connections that prove the "
              "job secret (from {})", identity_.master_addr, server_->port(), identity_.job_secret_source);
  }
  store_ = connect_store(identity_, options_.rendezvous_timeout_s);
  if (identity_.host == 0) {
    std::random_device random;
    store_->set(kJobIdKey, to_bytes(fmt::format("{:08x}{:08x}", random(), random())));
  }

  Watchdog::Events events;
  events.failure_found = [this](const AbortRecord& record) { abort_job(record.reason, record.exit_code); };
  events.abort_published = [this](const AbortRecord& record) { end_for_another_host(record); };
  events.coordinator_lost = [this](const std::string& reason) { end_without_coordinator(reason); };
  watchdog_ = std::make_unique<Watchdog>(
      identity_,
      WatchdogTimes{options_.heartbeat_interval_s, options_.failure_timeout_s, options_.step_timeout_s,
                    options_.rendezvous_timeout_s},
      std::move(events));

  // Rendezvous: every host announces itself (its watchdog beats already) and waits for the others.
  store_->set(store_keys::joined(identity_.host), to_bytes("1"));
  std::vector<std::string> joined;
  for (int h = 0; h < identity_.hosts; ++h) joined.push_back(store_keys::joined(h));
  wait_for_keys(*store_, joined, options_.rendezvous_timeout_s, "join the rendezvous");
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

void HostRuntime::wait_for_keys(c10d::Store& store, const std::vector<std::string>& keys, double timeout_s,
                                const char* what) {
  const auto deadline = Clock::now() + to_ms(timeout_s);
  while (true) {
    if (std::optional<AbortRecord> record = read_abort(store)) end_for_another_host(*record);
    std::vector<std::string> missing;
    for (const std::string& key : keys)
      if (!store.check({key})) missing.push_back(key.substr(key.rfind('/') + 1));
    if (missing.empty()) return;
    if (Clock::now() > deadline)
      abort_job(fmt::format("host{} {} did not {} within runtime.rendezvous_timeout_s={} s",
                            missing.size() == 1 ? "" : "s", fmt::join(missing, ","), what, timeout_s),
                kExitUsage);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

JobFacts HostRuntime::agree_on_job(const JobFacts& facts) {
  const std::string job_id = to_string(store_->get(kJobIdKey));
  if (!facts.shared_dir.empty()) {
    const fs::path marker = host_marker(facts.shared_dir, job_id, identity_.host);
    std::error_code error;
    fs::create_directories(marker.parent_path(), error);
    std::ofstream(marker) << identity_.host << "\n";
    MT_USER_CHECK(fs::exists(marker), "host {} cannot write in output_dir {} (tried {})", identity_.host,
                  facts.shared_dir, marker.string());
  }
  store_->set(store_keys::facts(identity_.host), to_bytes(facts.to_json().dump()));
  std::vector<std::string> fact_keys, sees_keys;
  for (int h = 0; h < identity_.hosts; ++h) {
    fact_keys.push_back(store_keys::facts(h));
    sees_keys.push_back(store_keys::sees(h));
  }
  wait_for_keys(*store_, fact_keys, options_.rendezvous_timeout_s, "publish what it would run");

  // Every marker is written now: which of the other hosts' can this host see?
  std::vector<int> unseen;
  if (!facts.shared_dir.empty())
    for (int h = 0; h < identity_.hosts; ++h)
      if (h != identity_.host && !fs::exists(host_marker(facts.shared_dir, job_id, h))) unseen.push_back(h);
  store_->set(store_keys::sees(identity_.host), to_bytes(nlohmann::json(unseen).dump()));

  if (identity_.host == 0) {
    wait_for_keys(*store_, sees_keys, options_.rendezvous_timeout_s, "check the shared storage");
    std::vector<JobFacts> all;
    std::vector<std::vector<int>> all_unseen;
    for (int h = 0; h < identity_.hosts; ++h) {
      all.push_back(JobFacts::from_json(
          parse_json(to_string(store_->get(store_keys::facts(h))), fmt::format("host {}'s job facts", h))));
      all_unseen.push_back(
          parse_json(to_string(store_->get(store_keys::sees(h))), fmt::format("host {}'s shared-storage check", h))
              .get<std::vector<int>>());
    }
    const std::string refusal = compare_job_facts(all, all_unseen);
    if (!refusal.empty()) abort_job(refusal, kExitUsage);
    store_->set(store_keys::kVerdict, to_bytes("agreed"));
  }
  wait_for_keys(*store_, {store_keys::kVerdict}, options_.rendezvous_timeout_s, "agree on the job");
  if (!facts.shared_dir.empty()) {
    std::error_code error;
    fs::remove(host_marker(facts.shared_dir, job_id, identity_.host), error);
  }
  log::info("The {} hosts agree on the job: config, build {}, dataset {}, resume point {}{}", identity_.hosts,
            facts.build.substr(0, 12), facts.dataset.empty() ? "(none)" : facts.dataset, facts.resume,
            facts.shared_dir.empty() ? "" : fmt::format(", and every host sees {}", facts.shared_dir));
  return JobFacts::from_json(
      parse_json(to_string(store_->get(store_keys::facts(0))), "host 0's job facts"));
}

void HostRuntime::log_flight_recorder() const {
  if (!watchdog_) return;
  const std::vector<std::string> lines = watchdog_->flight_recorder_lines();
  if (lines.empty()) return;
  log::error("host {}: the last collectives of its devices (flight recorder):", identity_.host);
  for (const std::string& line : lines) log::error("  {}", line);
}

void HostRuntime::abort_job(const std::string& reason, int exit_code) {
  // The first failure in this process tells the story; later ones (often its consequences) wait for the exit.
  if (ending_.exchange(true))
    while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
  AbortRecord standing{exit_code, reason};
  try {
    standing = watchdog_ ? watchdog_->publish_abort(standing) : publish_abort(*store_, standing);
  } catch (const std::exception& e) {
    // The coordinator is gone: that is the job's first failure, whatever error reached this host first (a device's
    // collective or store call can fail before the watchdog's next heartbeat notices). The others notice it too.
    if (identity_.host != 0)
      end_without_coordinator(
          fmt::format("{}; this host then failed too: {}", coordinator_lost_reason(identity_, e.what()), reason));
  }
  if (standing.reason != reason) {
    log::error("host {}: the job was aborted: {}", identity_.host, standing.reason);
    log::error("host {}: (this host then failed too: {})", identity_.host, reason);
    exit_code = standing.exit_code_elsewhere();
  } else {
    log::error("{}; ending the job on every host", reason);
  }
  log_flight_recorder();
  if (identity_.host == 0 && identity_.hosts > 1 && watchdog_) {
    try {
      watchdog_->wait_for_acknowledgements(linger_seconds(options_));
    } catch (const std::exception&) {
    }
  }
  std::_Exit(exit_code);
}

void HostRuntime::end_for_another_host(const AbortRecord& record) {
  if (ending_.exchange(true))
    while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
  log::error("host {}: the job was aborted: {}", identity_.host, record.reason);
  log_flight_recorder();
  try {
    if (watchdog_)
      watchdog_->acknowledge_abort();
    else
      store_->set(store_keys::abort_seen(identity_.host), to_bytes("1"));
  } catch (const std::exception&) {
  }
  std::_Exit(record.exit_code_elsewhere());
}

void HostRuntime::end_without_coordinator(const std::string& reason) {
  // No wait for another thread that is ending the process: that one may be stuck in a store call for the same reason.
  ending_.store(true);
  log::error("{}; ending this host", reason);
  log_flight_recorder();
  std::_Exit(kExitAnotherHostFailed);
}

void HostRuntime::run_on_devices(const std::function<void(DeviceContext&)>& fn) {
  std::vector<std::thread> threads;
  auto local_groups = std::make_shared<LocalGroups>(mesh_, identity_.host);
  for (int device : mesh_.devices_of_host(identity_.host)) {
    threads.emplace_back([this, device, &fn, local_groups] {
      // Declared outside the try: the groups must outlive the abort, or their closing connections would make the
      // peers fail first and hide the real reason.
      std::unique_ptr<DeviceContext> context;
      try {
        set_device_intra_op_threads(threads_per_device_);
        // Each device thread has its own store connection, so that a Gloo rendezvous waiting on one does not hold
        // up the others.
        auto store = connect_store(identity_, options_.rendezvous_timeout_s);
        auto gloo_device = make_gloo_device(identity_);
        auto counters = std::make_shared<CollectiveCounters>();
        context = std::make_unique<DeviceContext>(
            mesh_, device,
            gloo_group_factory(store, gloo_device, counters, options_.collective_timeout_s, local_groups), counters);
        watchdog_->watch_device(WatchedDevice{device, context->progress(), counters});
        fn(*context);
      } catch (const CollectiveError& e) {
        // Most likely the consequence of a failure elsewhere: give the watchdog the time it needs to learn the real
        // reason (a published abort, a host that stopped beating) and end with that; report this one if none comes.
        std::this_thread::sleep_for(to_ms(options_.failure_timeout_s + 2 * options_.heartbeat_interval_s));
        abort_job(fmt::format("host {} device {} failed: {}", identity_.host, device, e.what()), kExitThisHostFailed);
      } catch (const UserError& e) {
        abort_job(fmt::format("host {} device {} failed: {}", identity_.host, device, e.what()), kExitUsage);
      } catch (const std::exception& e) {
        abort_job(fmt::format("host {} device {} failed: {}", identity_.host, device, e.what()), kExitThisHostFailed);
      }
    });
  }
  for (auto& t : threads) t.join();
  watchdog_->unwatch_devices();
}

}  // namespace meshtrain::runtime
