// regex.hpp — a compiled PCRE2 pattern (UTF + Unicode properties, JIT) that splits UTF-8 text into pieces.
//
// The published pre-tokenizer regexes of GPT-2, cl100k, o200k and Llama 3 need `\p{..}` classes, possessive
// quantifiers and the look-ahead in `\s+(?!\S)`; PCRE2 with PCRE2_UTF | PCRE2_UCP expresses them exactly.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace meshtrain::tokenizer {

class RegexPattern {
 public:
  // Compiles `pattern`; UserError naming the pattern and the offset of the error if it does not compile.
  explicit RegexPattern(const std::string& pattern);
  ~RegexPattern();
  RegexPattern(const RegexPattern&) = delete;
  RegexPattern& operator=(const RegexPattern&) = delete;

  const std::string& pattern() const { return pattern_; }

  // Calls on_piece for each match of the pattern in `text`, left to right, and for each stretch of text between
  // matches (as Hugging Face's `Split` with behaviour "Isolated" does), so the pieces cover `text` exactly.
  // `text` must be valid UTF-8 (it is not checked again here).
  template <typename OnPiece>
  void split(std::string_view text, OnPiece&& on_piece) const;

  // The first match at or after `start`: its [begin, end) in bytes, or {npos, npos} if none.
  std::pair<size_t, size_t> find(std::string_view text, size_t start) const;

 private:
  std::string pattern_;
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

template <typename OnPiece>
void RegexPattern::split(std::string_view text, OnPiece&& on_piece) const {
  size_t position = 0;
  while (position < text.size()) {
    auto [begin, end] = find(text, position);
    if (begin == std::string_view::npos) break;
    if (begin > position) on_piece(text.substr(position, begin - position));
    if (end == begin) {  // an empty match: step over one UTF-8 character
      end = begin + 1;
      while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
    }
    on_piece(text.substr(begin, end - begin));
    position = end;
  }
  if (position < text.size()) on_piece(text.substr(position));
}

// Escapes `literal` for use inside a PCRE2 pattern.
std::string regex_quote(std::string_view literal);

}  // namespace meshtrain::tokenizer
