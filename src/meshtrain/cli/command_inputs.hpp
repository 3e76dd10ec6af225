// command_inputs.hpp — what several verbs read from their options: token ids typed by a user, and the tokenizer that
// goes with a checkpoint.
#pragma once

#include "meshtrain/tokenizer/tokenizer.hpp"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace meshtrain::cli {

// The checkpoint directory `path` names: itself when it holds config.json (a checkpoint meshtrain saved, or a Hugging
// Face directory), else, for a run's output_dir, its newest complete checkpoint (<path>/checkpoints/step-N).
// UserError naming the path when it is neither.
std::filesystem::path resolve_checkpoint_dir(const std::filesystem::path& path);

// Token ids separated by spaces, commas or newlines ("1 2 3", "1,2,3"). UserError naming `option` for anything that
// is not a non-negative integer.
std::vector<int64_t> parse_token_ids(const std::string& text, const std::string& option);

// The prompt a verb was given as token ids: `tokens_text` parsed (--tokens) when not empty, else `text` encoded as is
// (no BOS) with `tok`. UserError naming `text_option` and the checkpoint `dir` when text needs a tokenizer and `tok`
// is null.
std::vector<int64_t> prompt_token_ids(const std::string& tokens_text, const std::string& text,
                                      const std::string& text_option, const tokenizer::Tokenizer* tok,
                                      const std::filesystem::path& dir);

// The tokenizer of the checkpoint in `dir`: `name_or_path` when given (--tokenizer); else <dir>/tokenizer.json (a
// Hugging Face directory); else the one a meshtrain checkpoint records (training_state.json: the tokenizer of the
// data it was trained on, checked against the recorded fingerprint). nullptr when none of these exists.
std::shared_ptr<const tokenizer::Tokenizer> checkpoint_tokenizer(const std::filesystem::path& dir,
                                                                 const std::string& name_or_path);

}  // namespace meshtrain::cli
