// checkpoint_dirs.hpp — the trainer's checkpoint folders under <output_dir>/checkpoints: one per saved step,
// named "step-000020", each a Hugging Face checkpoint directory plus the training state (hf_directory.hpp,
// training_state.hpp), complete once its completion marker exists.
//
// A save writes into a fresh "step-000020.partial" folder and publishes it whole, by renaming it to "step-000020",
// once every file and the marker are written: a step folder never mixes files from two attempts, and a ".partial"
// folder (a save that was interrupted, or is still running) is never a checkpoint to resume from.
//
// Resume takes the newest *complete* folder. A newer incomplete one (the run died while saving it) is skipped with a
// warning naming it, never silently: the run continues from the complete one; a complete folder that turns out
// damaged is refused when it is loaded (verify_checkpoint_files), it is not skipped.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

namespace meshtrain::checkpoint {

// <root>/step-<step, 6 digits or more>.
std::filesystem::path checkpoint_dir_for_step(const std::filesystem::path& root, int64_t step);

// The step of a folder named by checkpoint_dir_for_step, or nullopt for any other name (a ".partial" one too).
std::optional<int64_t> checkpoint_step(const std::filesystem::path& dir);

// "<dir>.partial": where a save of `dir` writes its files until it publishes them.
std::filesystem::path partial_checkpoint_dir(const std::filesystem::path& dir);
// Creates partial_checkpoint_dir(dir) empty (removing what an earlier attempt left there) and returns it.
std::filesystem::path begin_partial_checkpoint(const std::filesystem::path& dir);
// Renames the complete partial_checkpoint_dir(dir) to `dir`. A folder already named `dir` (a run that started over
// with checkpoint.resume=false, an older meshtrain's interrupted save) is removed first, its marker first.
void publish_checkpoint(const std::filesystem::path& dir);
// Removes partial_checkpoint_dir(dir) if it exists, reporting nothing (a save that failed is on its way out).
void abandon_partial_checkpoint(const std::filesystem::path& dir) noexcept;

// The newest complete checkpoint under `root` (nullopt if none, or if `root` does not exist); logs a warning for
// each incomplete one (or interrupted save) newer than it.
std::optional<std::filesystem::path> newest_complete_checkpoint(const std::filesystem::path& root);

// Removes every ".partial" folder (call it only when no save is running); keeps the `keep` newest complete
// checkpoints (keep <= 0: keeps all) and removes the older complete ones, plus incomplete ones older than the newest
// complete one (abandoned saves). Never removes the newest complete one, nor an incomplete one newer than it. Logs
// each removal.
void remove_old_checkpoints(const std::filesystem::path& root, int64_t keep);

}  // namespace meshtrain::checkpoint
