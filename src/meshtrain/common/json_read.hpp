// json_read.hpp — the one way meshtrain parses JSON that comes from outside the process (files, lines, store values):
// with a nesting limit checked while parsing, so that no input can overflow the stack of the recursive code that
// later walks, copies, compares or prints a value (nlohmann's dump, copy and == recurse); and bounded renderings of
// untrusted values and parser messages for error messages, which never quote a value whole.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace meshtrain {

// Objects and arrays nested deeper than this are refused (meshtrain's own files nest 4 levels at most).
inline constexpr int kMaxJsonDepth = 64;

// `text` parsed. UserError naming `source` (a file, "file:line") if it is not valid JSON ("not valid JSON: <the
// parser's message, bounded>") or nests deeper than kMaxJsonDepth ("nested deeper than the limit of 64 levels").
nlohmann::json parse_json(std::string_view text, const std::string& source);
// `text` parsed, or nullopt if parse_json would refuse it (for lines that are skipped when they are not JSON).
std::optional<nlohmann::json> parse_json_if_valid(std::string_view text);

// `value` as JSON text (as value.dump() writes it), cut to at most `max_chars` characters plus "..." (work and
// recursion bounded by max_chars, whatever the value's size or depth): for quoting a value from an untrusted file in
// an error message.
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 120);
// `text` cut to at most `max_chars` bytes (not inside a UTF-8 character) plus "..." when longer.
std::string bounded_text(std::string_view text, size_t max_chars = 200);

}  // namespace meshtrain
