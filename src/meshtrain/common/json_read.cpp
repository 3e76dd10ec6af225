// json_read.cpp — depth-limited JSON parsing (nlohmann's parser callback sees each object's and array's depth) and
// bounded renderings for error messages.
#include "meshtrain/common/json_read.hpp"

#include "meshtrain/common/error.hpp"

#include <fmt/format.h>

namespace meshtrain {
namespace {

using Json = nlohmann::json;

// Parses `text`, throwing UserError naming `source` at the first object or array past kMaxJsonDepth, before it is
// built. With allow_exceptions false, invalid JSON gives a discarded value instead of a parse_error.
Json parse_with_depth_limit(std::string_view text, const std::string& source, bool allow_exceptions) {
  const Json::parser_callback_t limit_depth = [&source](int depth, Json::parse_event_t event, Json&) {
    const bool opens = event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start;
    MT_USER_CHECK(!opens || depth < kMaxJsonDepth,
                  "{}: nested deeper than the limit of {} levels of objects and arrays (damaged, or not a file "
                  "meshtrain reads)", source, kMaxJsonDepth);
    return true;
  };
  return Json::parse(text.begin(), text.end(), limit_depth, allow_exceptions);
}

// The JSON text of a string, from its first `max_chars` bytes (invalid UTF-8 replaced).
std::string quoted_prefix(const std::string& text, size_t max_chars) {
  return Json(text.substr(0, max_chars + 1)).dump(-1, ' ', false, Json::error_handler_t::replace);
}

// Appends `value` to `out` until `out` is longer than `max_chars`. Each level appends a character before it goes
// deeper, so the recursion is at most max_chars deep.
void append_excerpt(const Json& value, size_t max_chars, std::string& out) {
  if (out.size() > max_chars) return;
  if (value.is_string()) {
    out += quoted_prefix(value.get_ref<const std::string&>(), max_chars - out.size());
  } else if (value.is_object() || value.is_array()) {
    out += value.is_object() ? '{' : '[';
    for (auto it = value.begin(); it != value.end() && out.size() <= max_chars; ++it) {
      if (it != value.begin()) out += ',';
      if (value.is_object()) out += quoted_prefix(it.key(), max_chars - std::min(out.size(), max_chars)) + ':';
      append_excerpt(*it, max_chars, out);
    }
    out += value.is_object() ? '}' : ']';
  } else {
    out += value.dump();  // a number, a boolean, null
  }
}

}  // namespace

Json parse_json(std::string_view text, const std::string& source) {
  try {
    return parse_with_depth_limit(text, source, /*allow_exceptions=*/true);
  } catch (const Json::exception& e) {
    throw UserError(fmt::format("{}: not valid JSON: {}", source, bounded_text(e.what())));
  }
}

std::optional<Json> parse_json_if_valid(std::string_view text) {
  try {
    Json json = parse_with_depth_limit(text, "", /*allow_exceptions=*/false);
    if (!json.is_discarded()) return json;
  } catch (const UserError&) {  // nested too deep
  }
  return std::nullopt;
}

std::string json_excerpt(const Json& value, size_t max_chars) {
  std::string out;
  append_excerpt(value, max_chars, out);
  return bounded_text(out, max_chars);
}

std::string bounded_text(std::string_view text, size_t max_chars) {
  if (text.size() <= max_chars) return std::string(text);
  size_t end = max_chars;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;  // not inside a character
  return std::string(text.substr(0, end)) + "...";
}

}  // namespace meshtrain
