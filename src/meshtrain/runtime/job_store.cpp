// job_store.cpp — store keys, the abort record's encoding, the c10d::Store over the control plane, and connecting.
#include "meshtrain/runtime/job_store.hpp"

#include "meshtrain/common/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

namespace meshtrain::runtime {

namespace store_keys {
std::string joined(int host) { return fmt::format("meshtrain/joined/{}", host); }
std::string heartbeat(int host) { return fmt::format("meshtrain/heartbeat/{}", host); }
std::string finished(int host) { return fmt::format("meshtrain/finished/{}", host); }
std::string abort_seen(int host) { return fmt::format("meshtrain/abort_seen/{}", host); }
std::string facts(int host) { return fmt::format("meshtrain/facts/{}", host); }
std::string sees(int host) { return fmt::format("meshtrain/sees/{}", host); }
}  // namespace store_keys

std::string to_string(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }
std::vector<uint8_t> to_bytes(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }

JobStore::JobStore(control::ClientOptions options, std::chrono::milliseconds timeout)
    : c10d::Store(timeout), client_(std::move(options)) {}

void JobStore::set(const std::string& key, const std::vector<uint8_t>& value) { client_.set(key, to_string(value)); }

std::vector<uint8_t> JobStore::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                          const std::vector<uint8_t>& desired) {
  return to_bytes(client_.compare_set(key, to_string(expected), to_string(desired)));
}

std::vector<uint8_t> JobStore::get(const std::string& key) {
  std::optional<std::string> value = client_.get(key, timeout_);
  TORCH_CHECK(value.has_value(), "job store: key '", key, "' did not appear within ", timeout_.count(), " ms");
  return to_bytes(*value);
}

int64_t JobStore::add(const std::string& key, int64_t value) { return client_.add(key, value); }
bool JobStore::deleteKey(const std::string& key) { return client_.remove(key); }
bool JobStore::check(const std::vector<std::string>& keys) { return client_.check(keys); }
int64_t JobStore::getNumKeys() { return client_.key_count(); }
void JobStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void JobStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  TORCH_CHECK(client_.wait(keys, timeout), "job store: ", keys.size(), " key(s) did not all appear within ",
              timeout.count(), " ms");
}

std::unique_ptr<control::ControlPlaneServer> serve_control_plane(const HostIdentity& identity) {
  control::ServerOptions options;
  options.address = identity.master_addr;
  options.port = identity.master_port;
  options.secret = identity.job_secret;
  return std::make_unique<control::ControlPlaneServer>(options);
}

c10::intrusive_ptr<c10d::Store> connect_store(const HostIdentity& identity, double timeout_s) {
  control::ClientOptions options;
  options.address = identity.master_addr;
  options.port = identity.master_port;
  options.secret = identity.job_secret;
  options.connect_timeout_s = timeout_s;
  options.reply_timeout_s = std::max(timeout_s, 10.0);
  try {
    return c10::make_intrusive<JobStore>(options, to_ms(timeout_s));
  } catch (const std::exception& e) {
    throw UserError(fmt::format("host {}: {}", identity.host, e.what()));
  }
}

std::string coordinator_lost_reason(const HostIdentity& identity, const std::string& detail) {
  return fmt::format("host {} lost contact with the job's coordinator (host 0 at {}:{}), which has probably died: {}",
                     identity.host, identity.master_addr, identity.master_port, detail);
}

namespace {

std::string encode(const AbortRecord& record) { return fmt::format("{}\n{}", record.exit_code, record.reason); }

AbortRecord decode(const std::string& text) {
  const size_t newline = text.find('\n');
  AbortRecord record;
  if (newline == std::string::npos) {
    record.reason = text;
    return record;
  }
  try {
    record.exit_code = std::stoi(text.substr(0, newline));
  } catch (const std::exception&) {
    record.exit_code = kExitThisHostFailed;
  }
  record.reason = text.substr(newline + 1);
  return record;
}

}  // namespace

AbortRecord publish_abort(c10d::Store& store, const AbortRecord& record) {
  // compareSet with an empty expected value sets the key only if it does not exist, and returns what stands.
  const std::vector<uint8_t> standing = store.compareSet(store_keys::kAbort, {}, to_bytes(encode(record)));
  return decode(to_string(standing));
}

std::optional<AbortRecord> read_abort(c10d::Store& store) {
  if (!store.check({store_keys::kAbort})) return std::nullopt;
  return decode(to_string(store.get(store_keys::kAbort)));
}

void wait_until_hosts_read_abort(int hosts, double timeout_s, const std::function<bool(const std::string&)>& key_exists) {
  const auto deadline = std::chrono::steady_clock::now() + to_ms(timeout_s);
  for (int h = 1; h < hosts; ++h)
    while (std::chrono::steady_clock::now() < deadline && !key_exists(store_keys::abort_seen(h)) &&
           !key_exists(store_keys::finished(h)))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

}  // namespace meshtrain::runtime
