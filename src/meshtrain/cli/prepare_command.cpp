// prepare_command.cpp — `meshtrain prepare`: text or JSONL files into a token-shard directory (see
// meshtrain/token_shards/prepare.hpp for the pipeline and docs/formats.md for the format).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>

#include "meshtrain/cli/commands.hpp"
#include "meshtrain/common/log.hpp"
#include "meshtrain/token_shards/prepare.hpp"

namespace meshtrain::cli {

int prepare_command(int argc, char** argv) {
  CLI::App app{"Tokenize text files, or JSONL files with a text field, into a token-shard directory",
               "meshtrain prepare"};
  token_shards::PrepareOptions options;
  std::string tokenizer_name;
  std::vector<std::string> inputs;
  bool no_progress = false;
  app.add_option("--tokenizer,-t", tokenizer_name, "tokenizer name (gpt2, cl100k_base, llama3, byte, ...) or path")
      ->required();
  app.add_option("--output,-o", options.output_dir, "the token-shard directory to create")->required();
  app.add_option("--text-field", options.text_field, "the JSONL field holding a document's text")->default_val("text");
  app.add_option("--shard-tokens", options.shard_tokens, "close a shard once it holds this many tokens")
      ->default_val(options.shard_tokens);
  app.add_option("--threads", options.threads, "tokenizer threads (0: every core)")->default_val(0);
  app.add_flag("--force", options.overwrite, "replace the output directory if it exists");
  app.add_flag("--no-progress", no_progress, "no progress bar (it is drawn only on a terminal anyway)");
  app.add_option("inputs", inputs, "text files, .jsonl files, or directories of them")->required();
  CLI11_PARSE(app, argc, argv);

  for (const std::string& input : inputs) options.inputs.emplace_back(input);
  options.progress = !no_progress && ::isatty(STDERR_FILENO);
  auto tokenizer = tokenizer::load_tokenizer(tokenizer_name);
  auto start = std::chrono::steady_clock::now();
  token_shards::ShardIndex index = token_shards::prepare_token_shards(*tokenizer, options);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log::info(
      "prepared {}: {} tokens in {} documents, {} shard(s) of uint{}, tokenizer {} ({}), {:.2f} s, "
      "{:.2f} M tokens/s",
      options.output_dir.string(), index.total_tokens, index.total_documents, index.shards.size(),
      index.token_bytes * 8, index.tokenizer.name, index.tokenizer.fingerprint, seconds,
      index.total_tokens / std::max(seconds, 1e-9) / 1e6);
  return 0;
}

}  // namespace meshtrain::cli
