// scratch_dir.hpp — test helper: a fresh folder under the system's temp dir, removed (whatever the test did) when
// the object goes out of scope. The process id in its name keeps parallel test processes apart.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace meshtrain::testing {

class ScratchDir {
 public:
  explicit ScratchDir(const std::string& name)
      : path_(std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace meshtrain::testing
