// train_test_support.hpp — test helpers for the trainer's parts: the default config plus overrides, and the settings
// from it.
#pragma once

#include "meshtrain/config/config.hpp"
#include "meshtrain/settings/settings.hpp"

#include <string>
#include <vector>

namespace meshtrain::testing {

inline config::Config run_config(const std::vector<std::string>& overrides) {
  return config::Config::load(config::default_config_dir(), overrides);
}

inline settings::Settings settings_for(const std::vector<std::string>& overrides) {
  return settings::Settings::from_config(run_config(overrides));
}

}  // namespace meshtrain::testing
