// command_inputs.hpp — what several verbs read from their options: token ids and documents typed by a user, and the
// tokenizer that goes with a checkpoint.
#pragma once

#include "meshtrain/tokenizer/tokenizer.hpp"

#include <CLI/CLI.hpp>

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

// The options that give a verb its documents: `text_flag` (text, encoded with the tokenizer) or --tokens (ids), each
// repeatable with one value per occurrence (documents packed one after the other in a row), one kind or the other;
// and the positional overrides, where the training key data.document_mask goes (document_mask_override).
struct DocumentOptions {
  std::vector<std::string> texts, tokens_texts, overrides;
};
void add_document_options(CLI::App& app, DocumentOptions& into, const std::string& text_flag,
                          const std::string& text_help, const std::string& tokens_help, const std::string& mask_help);

// The documents a verb was given, each as token ids: every `tokens_texts` entry parsed (--tokens, repeatable) when
// there are any, else every `texts` entry encoded as is (no BOS) with `tok`. In a row they follow one another, as
// `prepare` packs documents. UserError naming `text_option` and the checkpoint `dir` when text needs a tokenizer and
// `tok` is null.
std::vector<std::vector<int64_t>> prompt_documents(const std::vector<std::string>& tokens_texts,
                                                   const std::vector<std::string>& texts,
                                                   const std::string& text_option, const tokenizer::Tokenizer* tok,
                                                   const std::filesystem::path& dir);

// The training key `data.document_mask` given to a verb as overrides ("data.document_mask=true"): whether the
// documents of a row are kept apart (false when not given). UserError naming any other override or value.
bool document_mask_override(const std::vector<std::string>& overrides, const std::string& verb);

// The tokenizer of the checkpoint in `dir`: `name_or_path` when given (--tokenizer); else <dir>/tokenizer.json (a
// Hugging Face directory); else the one a meshtrain checkpoint records (training_state.json: the tokenizer of the
// data it was trained on, checked against the recorded fingerprint). nullptr when none of these exists.
std::shared_ptr<const tokenizer::Tokenizer> checkpoint_tokenizer(const std::filesystem::path& dir,
                                                                 const std::string& name_or_path);

}  // namespace meshtrain::cli
