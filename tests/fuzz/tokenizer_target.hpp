// tokenizer_target.hpp — what the two tokenizer fuzz targets share: load a tokenizer file written from the input
// and, when it loads, encode and decode a short text with special tokens (the code paths a bad vocabulary reaches).
#pragma once

#include "fuzz_target.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/tokenizer/tokenizer.hpp"

namespace meshtrain::fuzz {

// Accepted: meshtrain::UserError (a file or vocabulary the loader refuses). Anything else escapes as a finding.
inline int load_and_use_tokenizer(const std::filesystem::path& path) {
  try {
    const auto tokenizer = tokenizer::load_tokenizer(path.string());
    const std::vector<uint32_t> ids = tokenizer->encode(
        "Hello world, it's 2024!\n  <|endoftext|> caf\xc3\xa9 \xff", tokenizer::SpecialTokens::recognize);
    tokenizer->decode(ids);
  } catch (const UserError&) {
  }
  return 0;
}

}  // namespace meshtrain::fuzz
