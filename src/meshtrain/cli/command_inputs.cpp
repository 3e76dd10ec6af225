// command_inputs.cpp — token-id parsing and a checkpoint's tokenizer.
#include "meshtrain/cli/command_inputs.hpp"

#include "meshtrain/checkpoint/checkpoint_dirs.hpp"
#include "meshtrain/checkpoint/training_state.hpp"
#include "meshtrain/common/error.hpp"

#include <algorithm>
#include <charconv>
#include <optional>

namespace fs = std::filesystem;

namespace meshtrain::cli {

fs::path resolve_checkpoint_dir(const fs::path& path) {
  if (fs::exists(path / "config.json")) return path;
  const std::optional<fs::path> newest = checkpoint::newest_complete_checkpoint(path / "checkpoints");
  MT_USER_CHECK(newest, "{} is neither a checkpoint directory (no config.json) nor a run's output_dir with a complete "
                "checkpoint under checkpoints/", path.string());
  return *newest;
}

std::vector<int64_t> parse_token_ids(const std::string& text, const std::string& option) {
  std::vector<int64_t> ids;
  for (size_t i = 0; i < text.size();) {
    if (text[i] == ' ' || text[i] == '\n' || text[i] == '\t' || text[i] == ',') {
      ++i;
      continue;
    }
    int64_t id = -1;
    const auto [end, error] = std::from_chars(text.data() + i, text.data() + text.size(), id);
    const size_t word_end = std::min(text.find_first_of(" ,\n\t", i), text.size());
    MT_USER_CHECK(error == std::errc() && end == text.data() + word_end && id >= 0,
                  "{}: '{}' is not a token id (expected \"ID ID ...\")", option, text.substr(i, word_end - i));
    ids.push_back(id);
    i = word_end;
  }
  return ids;
}

void add_document_options(CLI::App& app, DocumentOptions& into, const std::string& text_flag,
                          const std::string& text_help, const std::string& tokens_help, const std::string& mask_help) {
  CLI::Option* text_option = app.add_option(text_flag, into.texts, text_help);
  CLI::Option* tokens_option = app.add_option("--tokens", into.tokens_texts, tokens_help);
  // One value per occurrence, so that the overrides after them are not taken for more documents.
  for (CLI::Option* option : {text_option, tokens_option})
    option->expected(1)->allow_extra_args(false)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  text_option->excludes(tokens_option);
  app.add_option("overrides", into.overrides, mask_help);
}

std::vector<std::vector<int64_t>> prompt_documents(const std::vector<std::string>& tokens_texts,
                                                   const std::vector<std::string>& texts,
                                                   const std::string& text_option, const tokenizer::Tokenizer* tok,
                                                   const fs::path& dir) {
  std::vector<std::vector<int64_t>> documents;
  for (const std::string& tokens_text : tokens_texts) documents.push_back(parse_token_ids(tokens_text, "--tokens"));
  if (!documents.empty()) return documents;
  MT_USER_CHECK(tok, "{} needs a tokenizer: {} has neither a tokenizer.json nor a training_state.json that names one; "
                "pass --tokenizer", text_option, dir.string());
  for (const std::string& text : texts) {
    std::vector<int64_t>& ids = documents.emplace_back();
    for (uint32_t id : tok->encode(text)) ids.push_back(id);
  }
  return documents;
}

bool document_mask_override(const std::vector<std::string>& overrides, const std::string& verb) {
  bool mask = false;
  for (const std::string& override : overrides) {
    const std::string key = "data.document_mask=";
    MT_USER_CHECK(override.compare(0, key.size(), key) == 0,
                  "{} takes one training key, data.document_mask=true|false; got '{}'", verb, override);
    const std::string value = override.substr(key.size());
    MT_USER_CHECK(value == "true" || value == "false", "data.document_mask={}: expected true or false", value);
    mask = value == "true";
  }
  return mask;
}

std::shared_ptr<const tokenizer::Tokenizer> checkpoint_tokenizer(const fs::path& dir,
                                                                 const std::string& name_or_path) {
  if (!name_or_path.empty()) return tokenizer::load_tokenizer(name_or_path);
  if (fs::exists(dir / "tokenizer.json")) return tokenizer::load_tokenizer((dir / "tokenizer.json").string());
  if (!fs::exists(dir / checkpoint::kTrainingStateFile)) return nullptr;
  const nlohmann::json data = checkpoint::read_training_state(dir).data_state;
  const std::string source = (dir / checkpoint::kTrainingStateFile).string();
  MT_USER_CHECK(data.contains("tokenizer") && data["tokenizer"].is_string() &&
                    data.contains("tokenizer_fingerprint") && data["tokenizer_fingerprint"].is_string(),
                "{} does not record its data's tokenizer (data_state.tokenizer); pass --tokenizer", source);
  const std::string name = data["tokenizer"], fingerprint = data["tokenizer_fingerprint"];
  std::shared_ptr<const tokenizer::Tokenizer> tok = tokenizer::load_tokenizer(name);
  MT_USER_CHECK(tok->fingerprint() == fingerprint,
                "{}: the data was tokenized with {} ({}), but the installed '{}' is {}; pass --tokenizer with the "
                "data's tokenizer", source, name, fingerprint, name, tok->fingerprint());
  return tok;
}

}  // namespace meshtrain::cli
