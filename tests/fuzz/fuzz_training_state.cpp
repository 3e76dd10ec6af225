// fuzz_training_state.cpp — fuzzes training_state.json as a resumed run reads it (checkpoint::read_training_state), then
// writes the state back as JSON.
//
// Accepted: meshtrain::UserError (wrong format or version, a missing field, a field of the wrong type or range,
// naming the file and the field). Anything else is a finding.
#include "fuzz_target.hpp"

#include "meshtrain/checkpoint/training_state.hpp"
#include "meshtrain/common/error.hpp"

using namespace meshtrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::write_input(fuzz::scratch_dir() / checkpoint::kTrainingStateFile, data, size);
  try {
    checkpoint::read_training_state(fuzz::scratch_dir()).to_json().dump();
  } catch (const UserError&) {
  }
  return 0;
}
