// checkpoint_dirs.hpp — the trainer's checkpoint folders under <output_dir>/checkpoints: one per saved step,
// named "step-000020", each a Hugging Face checkpoint directory plus the training state (model/hf_checkpoint.hpp,
// training_state.hpp), complete once its completion marker exists.
//
// Resume takes the newest *complete* folder. A newer incomplete one (the run died while saving it) is skipped with a
// warning naming it, never silently: the run continues from the complete one; a complete folder that turns out
// damaged is refused when it is loaded (model::verify_checkpoint_files), it is not skipped.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

namespace meshtrain::train {

// <root>/step-<step, 6 digits or more>.
std::filesystem::path checkpoint_dir_for_step(const std::filesystem::path& root, int64_t step);

// The step of a folder named by checkpoint_dir_for_step, or nullopt for any other name.
std::optional<int64_t> checkpoint_step(const std::filesystem::path& dir);

// The newest complete checkpoint under `root` (nullopt if none, or if `root` does not exist); logs a warning for
// each incomplete one newer than it.
std::optional<std::filesystem::path> newest_complete_checkpoint(const std::filesystem::path& root);

// Keeps the `keep` newest complete checkpoints (keep <= 0: keeps all) and removes the older complete ones, plus
// incomplete ones older than the newest complete one (abandoned saves). Never removes the newest complete one, nor
// an incomplete one newer than it. Logs each removal.
void remove_old_checkpoints(const std::filesystem::path& root, int64_t keep);

}  // namespace meshtrain::train
