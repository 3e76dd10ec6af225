// file_names.hpp — checks on file names read from untrusted files (indexes, markers) before they become paths.
#pragma once

#include <string>

namespace meshtrain {

// A name that stays inside the folder it is joined to: not empty, not "." or "..", without '/' or a NUL byte, and at
// most NAME_MAX (255) bytes (a longer one fails every file system call with ENAMETOOLONG).
inline bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
         name.find_first_of(std::string("/\0", 2)) == std::string::npos;
}

}  // namespace meshtrain
