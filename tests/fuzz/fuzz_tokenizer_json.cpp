// fuzz_tokenizer_json.cpp — fuzzes the Hugging Face tokenizer.json loader: the input is written as a .json file and
// loaded with load_tokenizer() (tokenizer_json_spec, then the Tokenizer's own checks of the vocabulary, the merges
// and the pre-tokenizer regex); a tokenizer that loads then encodes and decodes a short text with special tokens.
//
// Accepted: meshtrain::UserError (a file or vocabulary the loader refuses, naming the file or tokenizer and the
// check). Anything else is a finding.
#include "tokenizer_target.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain::fuzz;
  return load_and_use_tokenizer(write_input(scratch_dir() / "tokenizer.json", data, size));
}
