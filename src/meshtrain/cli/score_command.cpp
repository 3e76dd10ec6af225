// score_command.cpp — `meshtrain score`: per-token log-probabilities and the mean next-token loss of a text or token
// sequence under a Hugging Face-format checkpoint. logprobs[i] = log p(token i+1 | tokens 0..i).
//
// Several --text (or --tokens) are documents packed in one row, in order, as training packs them; with
// data.document_mask=true (the training key) each token sees only the earlier tokens of its own document and the
// positions restart at each document, as in a run trained with the key (the first token of a document is still
// predicted, from the end of the one before, as the training loss counts it).
//
// A Mixtral also reports Hugging Face's aux_loss (the load-balancing loss of model/moe.hpp over the sequence).
//
// A hidden option, --dump-reference FILE, also backpropagates the mean loss (plus router_aux_loss_coef x aux_loss for
// a Mixtral, as Hugging Face's MixtralForCausalLM does) and writes the logits, log-probs, loss, aux_loss and every
// parameter's gradient ("grad.<name>") to a safetensors file: the Python reference tests read it.
#include "meshtrain/cli/command_inputs.hpp"
#include "meshtrain/cli/commands.hpp"
#include "meshtrain/common/atomic_file.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/model/hf_checkpoint.hpp"
#include "meshtrain/model/moe.hpp"
#include "meshtrain/model/safetensors.hpp"
#include "meshtrain/tokenizer/tokenizer.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <iostream>
#include <thread>

namespace meshtrain::cli {

int score_command(int argc, char** argv) {
  CLI::App app{"Score a text or token sequence: per-token log-probabilities and the mean next-token loss.",
               "meshtrain score"};
  std::string checkpoint, tokenizer_name, dump_path;
  DocumentOptions inputs;
  bool as_json = false;
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  app.add_option("--checkpoint", checkpoint,
                 "Hugging Face-format checkpoint directory (config.json + safetensors), or a run's output_dir: its "
                 "newest complete checkpoint")
      ->required();
  add_document_options(app, inputs, "--text",
                       "text to score (encoded as is: no BOS is added); repeated: documents packed in one row",
                       "token ids to score, e.g. \"1 2 3\"; repeated: documents packed in one row",
                       "data.document_mask=true: keep the documents apart (as training does)");
  app.add_option("--tokenizer", tokenizer_name,
                 "tokenizer for --text: a name (llama3, gpt2, byte, ...) or a file; default <checkpoint>/tokenizer.json, "
                 "or the tokenizer of the data a meshtrain checkpoint was trained on");
  app.add_flag("--json", as_json, "print {\"loss\": mean, \"logprobs\": [...]}");
  app.add_option("--threads", threads, "torch intra-op threads")->capture_default_str();
  app.add_option("--dump-reference", dump_path)->group("");  // hidden: for the Python reference tests
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  MT_USER_CHECK(!inputs.texts.empty() || !inputs.tokens_texts.empty(), "give --text TEXT or --tokens \"ID ID ...\"");
  const bool document_mask = document_mask_override(inputs.overrides, "score");
  MT_USER_CHECK(threads > 0, "--threads must be positive, got {}", threads);
  at::set_num_threads(threads);
  checkpoint = resolve_checkpoint_dir(checkpoint).string();

  const std::shared_ptr<const tokenizer::Tokenizer> tok = checkpoint_tokenizer(checkpoint, tokenizer_name);
  std::vector<int64_t> ids, documents;  // the row, and each token's document
  for (const std::vector<int64_t>& document : prompt_documents(inputs.tokens_texts, inputs.texts, "--text", tok.get(),
                                                                         checkpoint)) {
    ids.insert(ids.end(), document.begin(), document.end());
    documents.insert(documents.end(), document.size(), documents.empty() ? 0 : documents.back() + 1);
  }
  MT_USER_CHECK(ids.size() >= 2, "scoring needs at least 2 tokens (each is predicted from those before it), got {}",
                ids.size());

  const std::unique_ptr<model::LlamaForCausalLM> loaded = model::load_hf_model(checkpoint);
  model::LlamaForCausalLM& llama = *loaded;
  const int64_t vocab = llama.config().vocab_size;
  for (int64_t id : ids) MT_USER_CHECK(id < vocab, "token id {} is outside the model's vocabulary of {}", id, vocab);

  const int64_t T = static_cast<int64_t>(ids.size());
  torch::Tensor tokens_BT = torch::tensor(ids, torch::kInt64).view({1, T});
  torch::Tensor inputs_BT = tokens_BT.narrow(1, 0, T - 1), targets_BT = tokens_BT.narrow(1, 1, T - 1);
  std::optional<torch::NoGradGuard> no_grad;
  if (dump_path.empty()) no_grad.emplace();
  const torch::Tensor documents_BT =
      document_mask ? torch::tensor(documents, torch::kInt64).view({1, T}).narrow(1, 0, T - 1) : torch::Tensor();
  torch::Tensor logits_BTV = llama.forward(inputs_BT, documents_BT);
  torch::Tensor loss = model::token_cross_entropy(logits_BTV, targets_BT);
  torch::Tensor logprobs_T = model::target_logprobs(logits_BTV, targets_BT).squeeze(0).detach();
  const model::RouterStats* router = llama.router_stats().get();  // a Mixtral's routing of this sequence

  if (!dump_path.empty()) {
    loss.backward();
    std::vector<std::pair<std::string, torch::Tensor>> tensors = {
        {"logits", logits_BTV.detach()}, {"loss", loss.detach()}, {"logprobs", logprobs_T}};
    if (router) tensors.emplace_back("aux_loss", torch::tensor(router->aux_loss(), torch::kFloat64));
    for (const auto& p : llama.named_parameters()) tensors.emplace_back("grad." + p.key(), p.value().grad());
    AtomicFileWriter writer(dump_path);
    model::write_safetensors(writer, tensors);
    writer.commit();
  }

  const double mean_loss = loss.item<double>();
  std::vector<double> logprobs(logprobs_T.data_ptr<float>(), logprobs_T.data_ptr<float>() + logprobs_T.numel());
  if (as_json) {
    nlohmann::json printed = {{"loss", mean_loss}, {"logprobs", logprobs}};
    if (router) printed["aux_loss"] = router->aux_loss();
    std::cout << printed.dump() << "\n";
    return 0;
  }
  std::cout << fmt::format("{:>6}  {:>8}  {:>10}  {}\n", "pos", "token", "logprob", tok ? "text" : "");
  for (size_t i = 0; i < logprobs.size(); ++i) {
    const uint32_t id = static_cast<uint32_t>(ids[i + 1]);
    std::cout << fmt::format("{:>6}  {:>8}  {:>10.4f}  {}\n", i + 1, id, logprobs[i],
                             tok ? nlohmann::json(tok->decode(&id, 1)).dump(-1, ' ', false,
                                                                         nlohmann::json::error_handler_t::replace)
                                 : "");
  }
  std::cout << fmt::format("mean loss {:.6f} (perplexity {:.4f}) over {} predicted tokens\n", mean_loss,
                           std::exp(mean_loss), logprobs.size());
  if (router)
    std::cout << fmt::format("load-balancing aux_loss {:.6f} (router_aux_loss_coef {})\n", router->aux_loss(),
                             llama.config().router_aux_loss_coef);
  return 0;
}

}  // namespace meshtrain::cli
