// training_state.cpp — training_state.json: fields, the trajectory config and its fingerprint, atomic write, read.
#include "meshtrain/checkpoint/training_state.hpp"

#include "meshtrain/common/atomic_file.hpp"
#include "meshtrain/common/checksum.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/common/json_read.hpp"

#include <fmt/format.h>

#include <fstream>
#include <limits>
#include <sstream>
#include <type_traits>

namespace fs = std::filesystem;

namespace meshtrain::checkpoint {
namespace {

constexpr const char* kFormat = "meshtrain-training-state";
constexpr int kVersion = 1;

// Whether a JSON value is an integer that T holds (get<T>() alone would wrap a negative or too large one and
// truncate a fraction).
template <typename T>
bool integer_fits(const nlohmann::json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>() <= uint64_t(std::numeric_limits<T>::max());
  return value.is_number_integer() && std::is_signed_v<T> &&
         value.get<int64_t>() >= int64_t(std::numeric_limits<T>::min());
}

template <typename T>
T field(const nlohmann::json& json, const char* name, const std::string& source) {
  MT_USER_CHECK(json.contains(name), "{}: the field '{}' is missing", source, name);
  if constexpr (std::is_integral_v<T>) {
    MT_USER_CHECK(integer_fits<T>(json.at(name)), "{}: the field '{}' is {}, expected an integer in [{}, {}]", source,
                  name, json_excerpt(json.at(name)), std::numeric_limits<T>::min(), std::numeric_limits<T>::max());
  }
  try {
    return json.at(name).get<T>();
  } catch (const nlohmann::json::exception& e) {
    throw UserError(fmt::format("{}: the field '{}' has the wrong type ({})", source, name, e.what()));
  }
}

}  // namespace

std::string config_fingerprint(const std::map<std::string, std::string>& trajectory) {
  uint32_t crc = 0;
  for (const auto& [key, value] : trajectory) {
    const std::string line = key + "=" + value + "\n";
    crc = crc32c(line.data(), line.size(), crc);
  }
  return fmt::format("{:08x}", crc);
}

TrainingState TrainingState::at_step(const std::map<std::string, std::string>& trajectory, uint64_t seed, int64_t step,
                                     int64_t tokens_seen, nlohmann::json data_state) {
  TrainingState state;
  state.step = step;
  state.tokens_seen = tokens_seen;
  state.data_state = std::move(data_state);
  state.seed = seed;
  state.config = trajectory;
  state.config_fingerprint = checkpoint::config_fingerprint(state.config);
  return state;
}

nlohmann::json TrainingState::to_json() const {
  return {{"format", kFormat},          {"version", kVersion},
          {"step", step},               {"tokens_seen", tokens_seen},
          {"seed", seed},               {"data_state", data_state},
          {"config_fingerprint", config_fingerprint}, {"config", config}};
}

TrainingState TrainingState::from_json(const nlohmann::json& json, const std::string& source) {
  MT_USER_CHECK(json.is_object() && json.contains("format") && json["format"] == kFormat,
                "{}: not a meshtrain training state (its \"format\" must be \"{}\")", source, kFormat);
  const int version = field<int>(json, "version", source);
  MT_USER_CHECK(version == kVersion, "{}: training state version {} (this meshtrain reads version {})", source,
                version, kVersion);
  TrainingState state;
  state.step = field<int64_t>(json, "step", source);
  state.tokens_seen = field<int64_t>(json, "tokens_seen", source);
  state.seed = field<uint64_t>(json, "seed", source);
  state.data_state = field<nlohmann::json>(json, "data_state", source);
  state.config_fingerprint = field<std::string>(json, "config_fingerprint", source);
  state.config = field<std::map<std::string, std::string>>(json, "config", source);
  MT_USER_CHECK(state.step >= 0 && state.tokens_seen >= 0, "{}: negative step {} or tokens_seen {}", source,
                state.step, state.tokens_seen);
  return state;
}

std::vector<std::string> config_changes(const TrainingState& state, const std::map<std::string, std::string>& now) {
  std::vector<std::string> changes;
  if (config_fingerprint(now) == state.config_fingerprint) return changes;
  auto value_or_unset = [](const std::map<std::string, std::string>& m, const std::string& key) {
    auto it = m.find(key);
    return it == m.end() ? std::string("(unset)") : it->second;
  };
  std::map<std::string, std::string> all = state.config;
  all.insert(now.begin(), now.end());
  for (const auto& [key, ignored] : all) {
    const std::string saved = value_or_unset(state.config, key), current = value_or_unset(now, key);
    if (saved != current) changes.push_back(fmt::format("{}: {} -> {}", key, saved, current));
  }
  return changes;
}

CheckpointFile write_training_state(const fs::path& dir, const TrainingState& state) {
  const std::string text = state.to_json().dump(2) + "\n";
  fs::create_directories(dir);
  AtomicFileWriter writer(dir / kTrainingStateFile);
  writer.write(text.data(), text.size());
  writer.commit();
  return {kTrainingStateFile, writer.bytes_written(), writer.crc32c()};
}

TrainingState read_training_state(const fs::path& dir) {
  const fs::path path = dir / kTrainingStateFile;
  std::ifstream in(path, std::ios::binary);
  MT_USER_CHECK(in, "{}: cannot read the training state (is {} a meshtrain training checkpoint?)", path.string(),
                dir.string());
  std::stringstream text;
  text << in.rdbuf();
  return TrainingState::from_json(parse_json(text.str(), path.string()), path.string());
}

}  // namespace meshtrain::checkpoint
