// tokenizer.hpp — byte-level BPE tokenizers (tiktoken rank files, Hugging Face tokenizer.json) and the plain byte
// tokenizer, behind one type; and load_tokenizer(), which resolves names such as `gpt2`, `cl100k_base`, `llama3`,
// `byte` to the assets set-up installed, or loads a file path.
//
// Encoding is exact: text is split into pieces by the tokenizer's published pre-tokenizer regex, and each piece is
// merged from its bytes by the lowest-ranked adjacent pair first (leftmost on ties), as tiktoken and Hugging Face do.
// A piece that is itself a token is emitted directly (tiktoken; `ignore_merges` in tokenizer.json).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "meshtrain/tokenizer/regex.hpp"

namespace meshtrain::tokenizer {

struct SpecialToken {
  std::string text;  // e.g. "<|endoftext|>"
  uint32_t id;
};

// One merge rule of a Hugging Face tokenizer.json: tokens `left` and `right` merge into `result`; earlier rules
// have priority.
struct MergeRule {
  uint32_t left, right, result;
};

// Everything a tokenizer is made of; the loaders fill it, Tokenizer validates it.
struct TokenizerSpec {
  std::string name;                      // "cl100k_base", "llama3", "byte", ...
  std::string kind;                      // "tiktoken" | "tokenizer.json" | "byte"
  std::string fingerprint;               // identity of the source files: "crc32c:<hex>:<bytes>"
  std::string pattern;                   // pre-tokenizer regex (PCRE2 syntax); empty: the text is one piece
  std::vector<std::string> token_bytes;  // ordinary token id -> its bytes; empty for ids that are not ordinary
  // Merge priorities. Empty: derived from the token ids, as tiktoken ranks them (a pair merges with the rank of
  // the token its bytes concatenate to).
  std::vector<MergeRule> merges;
  std::vector<SpecialToken> special_tokens;
  std::string end_of_text;         // the special token that separates documents; empty if the tokenizer has none
  bool whole_piece_lookup = true;  // a piece that is a token is emitted without merging
  // The pattern is one whose pieces are known not to change when the text is cut where find_safe_split() says
  // (the published GPT-2, cl100k, o200k and Llama 3 patterns, checked by hand): encode_parallel() may split it.
  bool splittable = false;
};

enum class SpecialTokens {
  as_text,    // special-token strings in the text are encoded as ordinary text (safe for training data)
  recognize,  // special-token strings in the text become their ids
};

class Tokenizer {
 public:
  explicit Tokenizer(TokenizerSpec spec);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;  // the lookup tables point into spec_
  Tokenizer& operator=(const Tokenizer&) = delete;

  const std::string& name() const { return spec_.name; }
  const std::string& kind() const { return spec_.kind; }
  const std::string& fingerprint() const { return spec_.fingerprint; }
  // One more than the largest id, ordinary or special.
  uint32_t vocab_size() const { return vocab_size_; }
  std::optional<uint32_t> end_of_text_id() const { return end_of_text_id_; }
  const std::vector<SpecialToken>& special_tokens() const { return spec_.special_tokens; }

  // Appends the tokens of `text` to `out`. Invalid UTF-8 is replaced by U+FFFD first (as Python's
  // errors="replace" does).
  void encode(std::string_view text, std::vector<uint32_t>& out, SpecialTokens specials = SpecialTokens::as_text) const;
  std::vector<uint32_t> encode(std::string_view text, SpecialTokens specials = SpecialTokens::as_text) const;
  // Same tokens as encode(text) (special tokens as text), computed on `threads` threads for large texts: the text
  // is cut where the pre-tokenizer is known to end a piece (see find_safe_split); serial if the spec is not
  // `splittable`. The calling thread works on it with threads - 1 helper threads that live for the whole process
  // (each keeps its piece cache warm for the next call) and are shared by calls made at the same time.
  std::vector<uint32_t> encode_parallel(std::string_view text, int threads) const;

  // The bytes of `ids` concatenated. UserError for an id outside the vocabulary.
  std::string decode(const uint32_t* ids, size_t count) const;
  std::string decode(const std::vector<uint32_t>& ids) const { return decode(ids.data(), ids.size()); }

 private:
  void encode_ordinary(std::string_view valid_utf8, std::vector<uint32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<uint32_t>& out) const;

  TokenizerSpec spec_;
  uint64_t serial_;  // this tokenizer's number in the process: keys the per-thread cache of encoded pieces
  uint32_t vocab_size_ = 0;
  std::optional<uint32_t> end_of_text_id_;
  std::unique_ptr<RegexPattern> pre_tokenizer_;
  std::unique_ptr<RegexPattern> special_finder_;
  class TokenTable;
  std::unique_ptr<TokenTable> token_ids_;
  std::unordered_map<std::string_view, uint32_t> special_ids_;
  uint32_t byte_token_[256];
  class PairTable;
  std::unique_ptr<PairTable> pairs_;
};

// The largest position p <= `limit` (and > `floor`) where text may be cut without changing the pieces of any
// supported pre-tokenizer. Either text[p-2] is an ASCII character other than whitespace, text[p-1] is '\n' and
// text[p] an ASCII letter; or text[p-1] is an ASCII letter, text[p] a space and text[p+1] an ASCII letter (the
// single space before a word: no piece of these patterns holds a letter and the whitespace after it, and " word" is
// one piece from p whatever precedes it). Returns 0 if there is none.
size_t find_safe_split(std::string_view text, size_t floor, size_t limit);

// Replaces invalid UTF-8 sequences in `text` by U+FFFD; returns true if it changed anything.
bool make_valid_utf8(std::string& text);
bool is_valid_utf8(std::string_view text);

// The folder of the installed assets: $MESHTRAIN_ASSETS_DIR, else <source>/assets.
std::filesystem::path assets_dir();

// The names load_tokenizer() resolves without a path, each with the asset it loads.
std::vector<std::pair<std::string, std::string>> known_tokenizer_names();

// `byte`, a known name (gpt2, r50k_base, p50k_base, cl100k_base, o200k_base, llama3), or a path to a tiktoken
// rank file (named <encoding>.tiktoken) or a tokenizer.json. UserError naming what was tried otherwise.
std::shared_ptr<const Tokenizer> load_tokenizer(const std::string& name_or_path);

// The loaders behind load_tokenizer().
TokenizerSpec byte_tokenizer_spec();
TokenizerSpec tiktoken_spec(const std::filesystem::path& rank_file, const std::string& encoding_name);
TokenizerSpec tokenizer_json_spec(const std::filesystem::path& path, const std::string& name);

// The fingerprint of a file's bytes as recorded in TokenizerSpec::fingerprint.
std::string file_fingerprint(const std::string& bytes);
// Reads a whole file; UserError naming the file if it cannot.
std::string read_file_bytes(const std::filesystem::path& path);

}  // namespace meshtrain::tokenizer
