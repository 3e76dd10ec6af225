// fuzz_safetensors.cpp — fuzzes the safetensors reader (checkpoint::SafetensorsFile::open: the header length, the
// JSON header, dtypes, shapes and data offsets) and then reads the bytes of every tensor it accepted.
//
// Accepted: meshtrain::UserError (a header the reader refuses, naming the file and the check). Anything else — an
// Error from a byte range the reader let through, std::bad_alloc — is a finding.
#include "fuzz_target.hpp"

#include "meshtrain/checkpoint/safetensors_file.hpp"
#include "meshtrain/common/error.hpp"

#include <vector>

using namespace meshtrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::filesystem::path path = fuzz::write_input(fuzz::scratch_dir() / "fuzz.safetensors", data, size);
  try {
    const checkpoint::SafetensorsFile file = checkpoint::SafetensorsFile::open(path);
    std::vector<char> bytes;
    for (const checkpoint::SafetensorsEntry& entry : file.entries()) {
      bytes.resize(entry.end - entry.begin);
      file.read_elements(entry, 0, entry.numel(), bytes.data());
    }
  } catch (const UserError&) {
  }
  return 0;
}
