// fuzz_config_yaml.cpp — fuzzes the YAML config through Config's public API: from_yaml() on the input, then every
// leaf key read as each type, the YAML written back out, and one override applied.
//
// Accepted: meshtrain::UserError (text that is not YAML, a key of the wrong type, a bad override). Anything else is
// a finding.
#include "fuzz_target.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/config/config.hpp"

using namespace meshtrain;

namespace {

template <typename Read>
void read_or_refuse(Read&& read) {
  try {
    read();
  } catch (const UserError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  config::Config config;
  try {
    config = config::Config::from_yaml(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const UserError&) {
    return 0;
  }
  const std::vector<std::string> keys = config.leaf_keys();
  for (const std::string& key : keys) {
    read_or_refuse([&] { config.get_int(key); });
    read_or_refuse([&] { config.get_float(key); });
    read_or_refuse([&] { config.get_bool(key); });
    read_or_refuse([&] { config.get_string(key); });
    read_or_refuse([&] { config.get_int_list(key); });
    read_or_refuse([&] { config.node(key); });
  }
  config.leaf_values();
  config.to_yaml();
  if (!keys.empty()) read_or_refuse([&] { config.set_from_text(keys.front(), "17"); });
  read_or_refuse([&] { config.get_int("no.such.key"); });
  return 0;
}
