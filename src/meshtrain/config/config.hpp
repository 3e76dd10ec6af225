// config.hpp — the run's configuration: configs/defaults.yaml (every known key with its default; a `defaults:` list
// selects config groups), configs/<group>/<name>.yaml (a group option, loaded under key <group>), then
// torchprime/Hydra-style overrides: `key.sub=value` sets a known key, `<group>=<name>` selects a group option.
//
// Every error is a UserError naming the key: an unknown key (with the closest known keys), a value of the wrong type
// (with the value and the expected type), YAML text past the limits of docs/cli.md (with the file and the limit).
// A Config is not safe to read from several threads, even through const: settings::Settings::from_config reads it
// once, on the main thread, into the typed tree every other part uses (settings/settings.hpp).
#pragma once

#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace meshtrain::config {

// The folder of the shipped configs: $MESHTRAIN_CONFIG_DIR, else <source>/configs.
std::filesystem::path default_config_dir();

class Config {
 public:
  // Loads defaults.yaml, the selected groups, then applies `overrides` in order.
  static Config load(const std::filesystem::path& config_dir, const std::vector<std::string>& overrides);
  // Builds a config from YAML text (tests, saved runs); no groups are resolved.
  static Config from_yaml(const std::string& text);

  bool has(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;  // ints are accepted
  bool get_bool(const std::string& key) const;
  std::string get_string(const std::string& key) const;  // null reads as ""
  std::vector<int64_t> get_int_list(const std::string& key) const;
  YAML::Node node(const std::string& key) const;  // the subtree (a copy); UserError if missing

  // Sets a known key from override text, checking the type against the current value.
  void set_from_text(const std::string& key, const std::string& value_text);

  // Every leaf key in dotted form, in file order.
  std::vector<std::string> leaf_keys() const;
  // Every leaf key with its value as YAML text ("0.003", "[1, 2]", "~"), sorted by key.
  std::map<std::string, std::string> leaf_values() const;
  std::string to_yaml() const;

 private:
  YAML::Node root_;
};

// The known keys closest to `key` (edit distance on the full key and on its last component), best first.
std::vector<std::string> closest_keys(const std::string& key, const std::vector<std::string>& known, size_t max = 3);

}  // namespace meshtrain::config
