// prepare.hpp — `meshtrain prepare`: text files, or JSONL files with a named text field, into a token-shard
// directory. Documents are tokenized in parallel (special-token strings in the text stay text), each is preceded by
// the tokenizer's end-of-text token when it has one, and shards are cut at document boundaries. Everything is
// written into `<output>.partial-<pid>` and renamed to `<output>` once the index is written.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "meshtrain/tokenizer/tokenizer.hpp"
#include "meshtrain/token_shards/shard_format.hpp"

namespace meshtrain::token_shards {

struct PrepareOptions {
  // Files or directories; a directory contributes its *.txt, *.jsonl files (sorted by name). A .jsonl file holds
  // one JSON object per line, each a document; any other file is one document.
  std::vector<std::filesystem::path> inputs;
  std::filesystem::path output_dir;
  std::string text_field = "text";            // the JSONL field that holds a document's text
  uint64_t shard_tokens = uint64_t(1) << 28;  // a shard is closed once it holds at least this many tokens
  int threads = 0;                            // 0: every core
  bool overwrite = false;                     // replace an existing output directory
  bool progress = false;                      // draw a progress bar on stderr
};

// Prepares the directory and returns its index. UserError for unreadable inputs, bad JSONL lines (naming the file
// and line), or an existing output without `overwrite`.
ShardIndex prepare_token_shards(const tokenizer::Tokenizer& tokenizer, const PrepareOptions& options);

}  // namespace meshtrain::token_shards
