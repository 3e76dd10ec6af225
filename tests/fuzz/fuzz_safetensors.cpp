// fuzz_safetensors.cpp — fuzzes the safetensors reader (model::SafetensorsFile::open: the header length, the JSON
// header, dtypes, shapes and data offsets) and then materializes every tensor it accepted.
//
// Accepted: meshtrain::UserError (a header the reader refuses, naming the file and the check). Anything else — a
// c10::Error from a tensor the reader let through, std::bad_alloc — is a finding.
#include "fuzz_target.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/model/safetensors.hpp"

using namespace meshtrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::filesystem::path path = fuzz::write_input(fuzz::scratch_dir() / "fuzz.safetensors", data, size);
  try {
    const model::SafetensorsFile file = model::SafetensorsFile::open(path);
    for (const model::SafetensorsEntry& entry : file.entries()) file.tensor(entry.name);
  } catch (const UserError&) {
  }
  return 0;
}
