// shape_text.hpp — a tensor shape as messages and logs print it: "[8, 4096]".
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain {

inline std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t d = 0; d < shape.size(); ++d) out += (d ? ", " : "") + std::to_string(shape[d]);
  return out + "]";
}

}  // namespace meshtrain
