// tokenize_command.cpp — `meshtrain tokenize --tokenizer NAME_OR_PATH TEXT`: prints the token ids of TEXT on one
// line, separated by single spaces; `--decode` takes ids and prints their text. TEXT defaults to standard input.
#include <CLI/CLI.hpp>
#include <iostream>
#include <iterator>

#include "meshtrain/cli/command_inputs.hpp"
#include "meshtrain/cli/commands.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/tokenizer/tokenizer.hpp"

namespace meshtrain::cli {

int tokenize_command(int argc, char** argv) {
  CLI::App app{"Print the token ids of TEXT (or, with --decode, the text of token ids)", "meshtrain tokenize"};
  std::string tokenizer_name;
  std::vector<std::string> words;
  bool decode = false, special_as_text = false;
  std::string names;
  for (const auto& [name, asset] : tokenizer::known_tokenizer_names()) names += "\n  " + name + "  " + asset;
  app.add_option("--tokenizer,-t", tokenizer_name, "a tokenizer name or a path (.tiktoken or tokenizer.json):" + names)
      ->required();
  app.add_flag("--decode,-d", decode, "read token ids and print their text");
  app.add_flag("--special-as-text", special_as_text, "encode special-token strings such as <|endoftext|> as text");
  app.add_option("text", words,
                 "the text (words are joined by single spaces), or the ids with --decode; "
                 "standard input when absent");
  CLI11_PARSE(app, argc, argv);

  std::string input;
  if (words.empty()) {
    input.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  } else {
    for (const std::string& word : words) input += (input.empty() ? "" : " ") + word;
  }
  auto tokenizer = tokenizer::load_tokenizer(tokenizer_name);

  if (decode) {
    std::vector<uint32_t> ids;
    for (int64_t id : parse_token_ids(input, "--decode")) {
      MT_USER_CHECK(id < tokenizer->vocab_size(), "--decode: token id {} is outside the vocabulary of {}", id,
                    tokenizer->vocab_size());
      ids.push_back(static_cast<uint32_t>(id));
    }
    std::cout << tokenizer->decode(ids) << "\n";
    return 0;
  }
  auto ids = tokenizer->encode(
      input, special_as_text ? tokenizer::SpecialTokens::as_text : tokenizer::SpecialTokens::recognize);
  std::string line;
  for (uint32_t id : ids) line += (line.empty() ? "" : " ") + std::to_string(id);
  std::cout << line << "\n";
  return 0;
}

}  // namespace meshtrain::cli
