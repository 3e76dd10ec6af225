// fuzz_target.hpp — what every fuzz target shares: libFuzzer's entry point, and one scratch folder per process for
// readers that take a path (each input is written there as a file, then read back by the real reader).
//
// A target calls the reader on the bytes and catches meshtrain::UserError, the reader's documented rejection of bad
// input; anything else that escapes (another exception type, a crash, a sanitizer report) is a finding.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace meshtrain::fuzz {

// The process's scratch folder under the system temp dir, created on first use and removed at exit.
inline const std::filesystem::path& scratch_dir() {
  struct Scratch {
    std::filesystem::path path =
        std::filesystem::temp_directory_path() / ("meshtrain_fuzz_" + std::to_string(::getpid()));
    Scratch() {
      std::filesystem::remove_all(path);
      std::filesystem::create_directories(path);
    }
    ~Scratch() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const Scratch scratch;
  return scratch.path;
}

// Writes `size` bytes to `path` (replacing it) and returns the path.
inline std::filesystem::path write_input(const std::filesystem::path& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) throw std::runtime_error("fuzz harness: cannot write " + path.string());
  return path;
}

}  // namespace meshtrain::fuzz
