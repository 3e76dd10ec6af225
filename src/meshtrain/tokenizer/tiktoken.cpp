// tiktoken.cpp — loads tiktoken rank files (`<base64 token> <rank>` per line) with the published pre-tokenizer
// regex and special tokens of each encoding (from openai/tiktoken's tiktoken_ext/openai_public.py).
//
// Ranks number the tokens from 0, one a line, so a rank must be below the file's line count: an untrusted rank
// cannot size the token table beyond what the file holds.
#include <algorithm>
#include <charconv>

#include "meshtrain/common/error.hpp"
#include "meshtrain/tokenizer/tokenizer.hpp"

namespace meshtrain::tokenizer {
namespace {

const char* const kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const char* const kCl100kPattern =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s)";
const char* const kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct TiktokenEncoding {
  const char* name;
  const char* pattern;
  std::vector<SpecialToken> special_tokens;
};

const std::vector<TiktokenEncoding>& tiktoken_encodings() {
  static const std::vector<TiktokenEncoding> encodings = {
      {"r50k_base", kGpt2Pattern, {{"<|endoftext|>", 50256}}},
      {"p50k_base", kGpt2Pattern, {{"<|endoftext|>", 50256}}},
      {"cl100k_base",
       kCl100kPattern,
       {{"<|endoftext|>", 100257},
        {"<|fim_prefix|>", 100258},
        {"<|fim_middle|>", 100259},
        {"<|fim_suffix|>", 100260},
        {"<|im_start|>", 100264},
        {"<|im_end|>", 100265},
        {"<|im_sep|>", 100266},
        {"<|endofprompt|>", 100276}}},
      {"o200k_base", kO200kPattern, {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}},
  };
  return encodings;
}

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Decodes standard base64 (with '=' padding); false if `text` is not base64.
bool base64_decode(std::string_view text, std::string& out) {
  out.clear();
  uint32_t buffer = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=') break;
    int value = base64_value(c);
    if (value < 0) return false;
    buffer = (buffer << 6) | uint32_t(value);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((buffer >> bits) & 0xFF);
    }
  }
  return true;
}

}  // namespace

TokenizerSpec tiktoken_spec(const std::filesystem::path& rank_file, const std::string& encoding_name) {
  const TiktokenEncoding* encoding = nullptr;
  std::string known;
  for (const TiktokenEncoding& e : tiktoken_encodings()) {
    if (e.name == encoding_name) encoding = &e;
    known += (known.empty() ? "" : ", ") + std::string(e.name);
  }
  MT_USER_CHECK(encoding,
                "{}: unknown tiktoken encoding '{}' (the file's name picks the regex and special tokens; "
                "known: {})",
                rank_file.string(), encoding_name, known);

  std::string bytes = read_file_bytes(rank_file);
  TokenizerSpec spec;
  spec.name = encoding->name;
  spec.kind = "tiktoken";
  spec.fingerprint = file_fingerprint(bytes);
  spec.pattern = encoding->pattern;
  spec.special_tokens = encoding->special_tokens;
  spec.end_of_text = "<|endoftext|>";
  spec.whole_piece_lookup = true;
  spec.splittable = true;  // the patterns above

  const size_t line_count = static_cast<size_t>(std::count(bytes.begin(), bytes.end(), '\n')) + 1;
  std::string token;
  size_t line_number = 0;
  for (size_t start = 0; start < bytes.size();) {
    size_t end = bytes.find('\n', start);
    if (end == std::string::npos) end = bytes.size();
    std::string_view line(bytes.data() + start, end - start);
    start = end + 1;
    ++line_number;
    if (line.empty()) continue;
    size_t space = line.find(' ');
    uint32_t rank = 0;
    bool ok = space != std::string_view::npos && base64_decode(line.substr(0, space), token) && !token.empty();
    if (ok) {
      auto [ptr, ec] = std::from_chars(line.data() + space + 1, line.data() + line.size(), rank);
      ok = ec == std::errc() && ptr == line.data() + line.size();
    }
    MT_USER_CHECK(ok, "{}:{}: expected `<base64 token> <rank>`, got '{}'", rank_file.string(), line_number, line);
    MT_USER_CHECK(rank < line_count, "{}:{}: rank check failed: rank {} is not below the file's {} lines",
                  rank_file.string(), line_number, rank, line_count);
    if (spec.token_bytes.size() <= rank) spec.token_bytes.resize(rank + 1);
    MT_USER_CHECK(spec.token_bytes[rank].empty(), "{}:{}: rank {} appears twice", rank_file.string(), line_number,
                  rank);
    spec.token_bytes[rank] = token;
  }
  for (const SpecialToken& special : spec.special_tokens) {
    MT_USER_CHECK(special.id >= spec.token_bytes.size() || spec.token_bytes[special.id].empty(),
                  "{}: rank {} is also the special token {}: is this file really {}?", rank_file.string(), special.id,
                  special.text, encoding_name);
  }
  return spec;
}

}  // namespace meshtrain::tokenizer
