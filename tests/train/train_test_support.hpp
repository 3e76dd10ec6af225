// train_test_support.hpp — test helpers for the trainer's parts: the default config plus overrides, and the trainer's
// settings from it.
#pragma once

#include "meshtrain/config/config.hpp"
#include "meshtrain/train/train_settings.hpp"

#include <string>
#include <vector>

namespace meshtrain::testing {

inline config::Config run_config(const std::vector<std::string>& overrides) {
  return config::Config::load(config::default_config_dir(), overrides);
}

inline train::TrainSettings settings_for(const std::vector<std::string>& overrides) {
  return train::TrainSettings::from_config(run_config(overrides));
}

}  // namespace meshtrain::testing
