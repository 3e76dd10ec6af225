// training_state.hpp — the training state saved beside a checkpoint's weights, as `training_state.json`: the step,
// the data cursor, the seed and the config the run was trained with. The optimizer's moments are tensors and are
// saved by the trainer as safetensors files next to it; the learning rate is a function of the step
// (train/lr_schedule.hpp), so it needs no state.
//
// The config is kept as its trajectory keys (everything that changes what is computed: model, data, optimizer,
// schedule, batch, seed; not output paths, logging, checkpointing, the mesh or the runtime) with a fingerprint of
// them, so that a resumed run can name each key whose value changed.
//
// {"format": "meshtrain-training-state", "version": 1, "step": 20, "tokens_seen": 40960, "seed": 42,
//  "data_state": {...}, "config_fingerprint": "3f2a9c1e", "config": {"optimizer.learning_rate": "0.003", ...}}
#pragma once

#include "meshtrain/checkpoint/hf_directory.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace meshtrain::checkpoint {

inline constexpr const char* kTrainingStateFile = "training_state.json";

struct TrainingState {
  int64_t step = 0;          // optimizer steps completed; the resumed run's first step is step + 1
  int64_t tokens_seen = 0;   // global tokens trained on so far
  nlohmann::json data_state;  // the data cursor, in the data part's own format
  uint64_t seed = 0;
  std::string config_fingerprint;             // config_fingerprint(trajectory config)
  std::map<std::string, std::string> config;  // trajectory key -> value as YAML text

  // The state at `step` of a run whose trajectory config is `trajectory` (settings::Settings::trajectory()); fills the
  // fingerprint.
  static TrainingState at_step(const std::map<std::string, std::string>& trajectory, uint64_t seed, int64_t step,
                               int64_t tokens_seen, nlohmann::json data_state);

  nlohmann::json to_json() const;
  // UserError naming `source` (a file name) for a wrong format, version or field.
  static TrainingState from_json(const nlohmann::json& json, const std::string& source);
};

// CRC-32C of the trajectory keys and values, 8 hex digits.
std::string config_fingerprint(const std::map<std::string, std::string>& trajectory);

// "key: saved -> now" for each trajectory key whose value differs between `state` and `trajectory` (added and removed
// keys too); empty when the fingerprints match.
std::vector<std::string> config_changes(const TrainingState& state, const std::map<std::string, std::string>& trajectory);

// Writes <dir>/training_state.json atomically and returns its entry for write_completion_marker.
CheckpointFile write_training_state(const std::filesystem::path& dir, const TrainingState& state);
// Reads <dir>/training_state.json; UserError naming the file if it is missing or malformed. (Its size and checksum
// are checked by verify_checkpoint_files.)
TrainingState read_training_state(const std::filesystem::path& dir);

}  // namespace meshtrain::checkpoint
