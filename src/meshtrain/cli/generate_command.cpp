// generate_command.cpp — `meshtrain generate`: text generation from a checkpoint that meshtrain wrote (any mesh) or
// a Hugging Face Llama directory, on one device with a KV cache (model/generation.hpp).
//
//   meshtrain generate --checkpoint DIR (--prompt TEXT | --tokens "ID ID ...")... --max-new-tokens N
//                      [--temperature T] [--top-k K] [--top-p P] [--seed S] [--tokenizer NAME] [--json]
//                      [data.document_mask=true]
//
// Prints the prompt and the generated text, or with --json one object {"tokens": [new ids], "text": their text}
// ("text" is null without a tokenizer). Exactly N tokens are generated. Several prompts are documents packed one
// after the other; with data.document_mask=true (the training key) the continuation sees only the last one, as a
// model trained with the key sees a document.
#include "meshtrain/cli/command_inputs.hpp"
#include "meshtrain/cli/commands.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/model/generation.hpp"
#include "meshtrain/model/hf_checkpoint.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <iostream>
#include <thread>

namespace meshtrain::cli {

int generate_command(int argc, char** argv) {
  CLI::App app{"Generate tokens after a prompt from a checkpoint (greedy, or sampled with a seed).",
               "meshtrain generate"};
  std::string checkpoint, tokenizer_name;
  DocumentOptions inputs;
  int64_t max_new_tokens = 32;
  model::SamplingOptions sampling;
  bool as_json = false;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  app.add_option("--checkpoint", checkpoint,
                 "a checkpoint directory (one meshtrain saved, or a Hugging Face Llama directory), or a run's "
                 "output_dir: its newest complete checkpoint")
      ->required();
  add_document_options(app, inputs, "--prompt",
                       "the prompt text (encoded as is: no BOS is added); repeated: documents packed one after the "
                       "other",
                       "the prompt as token ids, e.g. \"1 2 3\"; repeated: documents",
                       "data.document_mask=true: the continuation sees only the prompt's last document (as training "
                       "with the key does)");
  app.add_option("--max-new-tokens", max_new_tokens, "how many tokens to generate")->capture_default_str();
  app.add_option("--temperature", sampling.temperature, "0: greedy; more: sample from softmax(logits / T)")
      ->capture_default_str();
  app.add_option("--top-k", sampling.top_k, "sample among the K most likely tokens (0: all)")->capture_default_str();
  app.add_option("--top-p", sampling.top_p, "sample among the most likely tokens whose probability reaches P")
      ->capture_default_str();
  app.add_option("--seed", sampling.seed, "seed of the sampling (the same seed gives the same tokens)")
      ->capture_default_str();
  app.add_option("--tokenizer", tokenizer_name,
                 "a tokenizer name or file; default: <checkpoint>/tokenizer.json, or the tokenizer of the data a "
                 "meshtrain checkpoint was trained on");
  app.add_flag("--json", as_json, "print {\"tokens\": [new ids], \"text\": their text}");
  app.add_option("--threads", threads, "torch intra-op threads")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  MT_USER_CHECK(!inputs.texts.empty() || !inputs.tokens_texts.empty(), "give --prompt TEXT or --tokens \"ID ID ...\"");
  const bool document_mask = document_mask_override(inputs.overrides, "generate");
  MT_USER_CHECK(threads > 0, "--threads must be positive, got {}", threads);
  sampling.validate();
  at::set_num_threads(threads);
  checkpoint = resolve_checkpoint_dir(checkpoint).string();

  const std::shared_ptr<const tokenizer::Tokenizer> tok = checkpoint_tokenizer(checkpoint, tokenizer_name);
  // With documents kept apart the new tokens attend to their own document only: the last one, from its position 0.
  const std::vector<std::vector<int64_t>> documents =
      prompt_documents(inputs.tokens_texts, inputs.texts, "--prompt", tok.get(), checkpoint);
  std::vector<int64_t> prompt_ids;
  for (size_t d = document_mask ? documents.size() - 1 : 0; d < documents.size(); ++d)
    prompt_ids.insert(prompt_ids.end(), documents[d].begin(), documents[d].end());
  MT_USER_CHECK(!prompt_ids.empty(), "the prompt{} has no tokens", document_mask ? "'s last document" : "");

  const std::unique_ptr<model::LlamaForCausalLM> loaded = model::load_hf_model(checkpoint);
  model::LlamaForCausalLM& llama = *loaded;
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int64_t> generated = model::generate(llama, prompt_ids, max_new_tokens, sampling);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  // A model's vocabulary may be wider than its tokenizer's (padded for speed): such ids read as U+FFFD.
  auto text_of = [&](const std::vector<int64_t>& ids) {
    std::string text;
    for (int64_t id : ids) {
      const uint32_t narrow = static_cast<uint32_t>(id);
      text += id < tok->vocab_size() ? tok->decode(&narrow, 1) : "\xEF\xBF\xBD";
    }
    return text;
  };
  if (as_json) {
    const nlohmann::json text = tok ? nlohmann::json(text_of(generated)) : nlohmann::json(nullptr);
    std::cout << nlohmann::json{{"tokens", generated}, {"text", text}}.dump(
                     -1, ' ', false, nlohmann::json::error_handler_t::replace)
              << "\n";
    return 0;
  }
  if (tok) {
    std::cout << text_of(prompt_ids) << text_of(generated) << "\n";
  } else {
    std::string ids;
    for (int64_t id : generated) ids += (ids.empty() ? "" : " ") + std::to_string(id);
    std::cout << ids << "\n";
  }
  std::cerr << fmt::format("generated {} tokens after a prompt of {} in {:.2f} s ({}, KV cache)\n", generated.size(),
                           prompt_ids.size(), seconds,
                           sampling.temperature == 0 ? "greedy"
                                                     : fmt::format("temperature {}, top-k {}, top-p {}, seed {}",
                                                                   sampling.temperature, sampling.top_k,
                                                                   sampling.top_p, sampling.seed));
  return 0;
}

}  // namespace meshtrain::cli
