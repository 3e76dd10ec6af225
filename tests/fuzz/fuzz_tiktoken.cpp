// fuzz_tiktoken.cpp — fuzzes the tiktoken rank-file loader: the input is written as r50k_base.tiktoken (the name
// picks the encoding's regex and special tokens) and loaded with load_tokenizer(); a tokenizer that loads then
// encodes and decodes a short text with its special token.
//
// Accepted: meshtrain::UserError (a line, rank or vocabulary the loader refuses, naming the file and line or the
// check). Anything else is a finding.
#include "tokenizer_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain::fuzz;
  return load_and_use_tokenizer(write_input(scratch_dir() / "r50k_base.tiktoken", data, size));
}
