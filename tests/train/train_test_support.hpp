// train_test_support.hpp — test helpers for the trainer's parts: its settings from the default config plus overrides.
#pragma once

#include "meshtrain/config/config.hpp"
#include "meshtrain/train/train_settings.hpp"

#include <string>
#include <vector>

namespace meshtrain::testing {

inline train::TrainSettings settings_for(const std::vector<std::string>& overrides) {
  return train::TrainSettings::from_config(config::Config::load(config::default_config_dir(), overrides));
}

}  // namespace meshtrain::testing
