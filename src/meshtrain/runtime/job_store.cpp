// job_store.cpp — store keys, the abort record's encoding, and connecting to the coordinator.
#include "meshtrain/runtime/job_store.hpp"

#include "meshtrain/common/error.hpp"

#include <fmt/format.h>

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

std::chrono::milliseconds to_ms(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

std::string to_string(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }
std::vector<uint8_t> to_bytes(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }

c10::intrusive_ptr<c10d::TCPStore> connect_store(const HostIdentity& identity, bool serve, double timeout_s) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(identity.master_port);
  options.isServer = serve;
  options.waitWorkers = false;
  options.timeout = to_ms(timeout_s);
  try {
    return c10::make_intrusive<c10d::TCPStore>(identity.master_addr, options);
  } catch (const std::exception& e) {
    throw UserError(fmt::format("host {}: cannot {} the job's coordinator at {}:{}: {}", identity.host,
                                serve ? "serve" : "reach", identity.master_addr, identity.master_port, e.what()));
  }
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
