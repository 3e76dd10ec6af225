// fuzz_checkpoint_marker.cpp — fuzzes a checkpoint's completion marker (meshtrain_complete.json) as resuming reads
// it: the input is the marker of a folder step-000001 holding a config.json and a training_state.json; the trainer's
// choice of checkpoint (checkpoint::newest_complete_checkpoint) and checkpoint::verify_checkpoint_files then read it and every
// file it lists.
//
// Accepted: meshtrain::UserError (a malformed marker, a listed name that is not a plain file name, a missing file, a
// size or checksum mismatch, naming the file and the check). Anything else is a finding.
#include "fuzz_target.hpp"

#include "meshtrain/checkpoint/checkpoint_dirs.hpp"
#include "meshtrain/checkpoint/hf_directory.hpp"
#include "meshtrain/common/error.hpp"

namespace fs = std::filesystem;
using namespace meshtrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fs::path root = [] {
    const fs::path checkpoints = fuzz::scratch_dir() / "checkpoints", dir = checkpoints / "step-000001";
    fs::create_directories(dir);
    const std::string config = "{\"model_type\": \"llama\"}\n", state = "{\"step\": 1}\n";
    fuzz::write_input(dir / "config.json", config.data(), config.size());
    fuzz::write_input(dir / "training_state.json", state.data(), state.size());
    return checkpoints;
  }();
  fuzz::write_input(root / "step-000001" / checkpoint::kCompletionMarker, data, size);
  try {
    if (const auto dir = checkpoint::newest_complete_checkpoint(root)) checkpoint::verify_checkpoint_files(*dir);
  } catch (const UserError&) {
  }
  return 0;
}
