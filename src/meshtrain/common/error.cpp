// error.cpp — builds the message of a failed MT_CHECK.
#include "meshtrain/common/error.hpp"

namespace meshtrain {

void throw_check_failure(const char* condition, const char* file, int line, const std::string& message) {
  throw Error(fmt::format("{} (check `{}` failed at {}:{})", message, condition, file, line));
}

}  // namespace meshtrain
