// fuzz_safetensors_index.cpp — fuzzes the weight map of a sharded Hugging Face checkpoint
// (model.safetensors.index.json) as model::load_hf_checkpoint reads it: the input replaces the index of a valid
// sharded checkpoint of a tiny Llama (Hugging Face style: no completion marker, so the index is not checksummed),
// which is then loaded into the model.
//
// Accepted: meshtrain::UserError (a malformed index, a file name that is not a plain name, a tensor mapped to the
// wrong file, a missing weight file, all naming the file and the check). Anything else is a finding.
#include "fuzz_target.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/model/hf_checkpoint.hpp"

namespace fs = std::filesystem;
using namespace meshtrain;

namespace {

model::LlamaConfig tiny_config() {
  model::LlamaConfig config;
  config.vocab_size = 8;
  config.hidden_size = 4;
  config.intermediate_size = 4;
  config.num_hidden_layers = 1;
  config.num_attention_heads = 1;
  config.num_key_value_heads = 1;
  config.head_dim = 4;
  return config;
}

struct Checkpoint {
  fs::path dir = fuzz::scratch_dir() / "checkpoint";
  model::LlamaForCausalLM model{tiny_config()};
  Checkpoint() {
    model::HfSaveOptions options;
    options.max_shard_bytes = 1;  // one tensor per file: a sharded checkpoint with an index
    model::save_hf_checkpoint(dir, model, options);
    // As Hugging Face ships it: no completion marker, no meshtrain key in config.json.
    fs::remove(dir / model::kCompletionMarker);
    const std::string config_json = model.config().to_hf_json("float32").dump();
    fuzz::write_input(dir / "config.json", config_json.data(), config_json.size());
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Checkpoint checkpoint;
  fuzz::write_input(checkpoint.dir / "model.safetensors.index.json", data, size);
  try {
    model::load_hf_checkpoint(checkpoint.dir, checkpoint.model);
  } catch (const UserError&) {
  }
  return 0;
}
