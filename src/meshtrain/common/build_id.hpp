// build_id.hpp — what identifies this meshtrain binary, so that the hosts of a job can check they run the same build.
#pragma once

#include <string>

namespace meshtrain {

// The GNU build-id of the running executable (hex; the linker derives it from the binary's contents), or, where the
// binary has none, its size and modification time.
std::string build_id();

}  // namespace meshtrain
