// fuzz_prepare_jsonl.cpp — fuzzes `meshtrain prepare`'s JSONL input (token_shards::prepare_token_shards): the input is a
// .jsonl file of documents under a `text` field, tokenized into a shard directory with the byte tokenizer.
//
// Accepted: meshtrain::UserError (a line that is not a JSON object, has no string `text`, nests too deep; naming the
// file and line). Anything else is a finding.
#include "fuzz_target.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/tokenizer/tokenizer.hpp"
#include "meshtrain/token_shards/prepare.hpp"

using namespace meshtrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::shared_ptr<const tokenizer::Tokenizer> bytes = tokenizer::load_tokenizer("byte");
  token_shards::PrepareOptions options;
  options.inputs = {fuzz::write_input(fuzz::scratch_dir() / "documents.jsonl", data, size)};
  options.output_dir = fuzz::scratch_dir() / "shards";
  options.threads = 1;
  options.overwrite = true;
  try {
    token_shards::prepare_token_shards(*bytes, options);
  } catch (const UserError&) {
  }
  return 0;
}
