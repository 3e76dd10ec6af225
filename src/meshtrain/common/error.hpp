// error.hpp — meshtrain's error type and checked-condition macros.
//
// MT_CHECK(cond, fmt, args...) throws meshtrain::Error with the message, the failed condition and the source
// location. Messages name the thing that is wrong and what was expected (a key, a file, a device).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace meshtrain {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Raised for invalid user input (config, command line, files): the CLI prints these without a source location.
class UserError : public Error {
 public:
  explicit UserError(const std::string& message) : Error(message) {}
};

[[noreturn]] void throw_check_failure(const char* condition, const char* file, int line, const std::string& message);

}  // namespace meshtrain

#define MT_CHECK(cond, ...)                                                                       \
  do {                                                                                            \
    if (!(cond)) ::meshtrain::throw_check_failure(#cond, __FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)

// A user-facing error: bad config, bad flag, bad file. The message must say what was expected.
#define MT_USER_CHECK(cond, ...)                                          \
  do {                                                                    \
    if (!(cond)) throw ::meshtrain::UserError(fmt::format(__VA_ARGS__));  \
  } while (0)
