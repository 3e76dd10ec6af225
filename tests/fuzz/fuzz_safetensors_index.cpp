// fuzz_safetensors_index.cpp — fuzzes the weight map of a sharded Hugging Face checkpoint
// (model.safetensors.index.json) as loading a checkpoint reads it (checkpoint::open_weight_files): the input replaces
// the index of a valid sharded checkpoint of a tiny Llama (one tensor per file, Hugging Face style: no completion
// marker, so the index is not checksummed); every weight file the index names is then opened and its tensors checked
// against the map. (Whether the tensors are the model's parameters, with its shapes, is model::CheckpointTensors'
// check, beyond the index.)
//
// Accepted: meshtrain::UserError (a malformed index, a file name that is not a plain name, a tensor mapped to the
// wrong file, a missing weight file, all naming the file and the check). Anything else is a finding.
#include "fuzz_target.hpp"

#include "meshtrain/checkpoint/hf_directory.hpp"
#include "meshtrain/common/error.hpp"

namespace fs = std::filesystem;
using namespace meshtrain;

namespace {

// The parameters of a one-layer Llama, in the order make_corpus.py's index lists them.
const char* const kTinyLlamaTensors[] = {
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",   "model.layers.0.self_attn.k_proj.weight",
    "model.layers.0.self_attn.v_proj.weight",   "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.mlp.gate_proj.weight",      "model.layers.0.mlp.up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",      "model.layers.0.input_layernorm.weight",
    "model.layers.0.post_attention_layernorm.weight", "model.norm.weight",
    "lm_head.weight"};

// A sharded checkpoint folder: config.json and one weight file per tensor (each a [4] fp32 tensor of zeros).
fs::path make_checkpoint() {
  const fs::path dir = fuzz::scratch_dir() / "checkpoint";
  fs::create_directories(dir);
  const size_t count = std::size(kTinyLlamaTensors);
  for (size_t i = 0; i < count; ++i) {
    std::vector<checkpoint::SafetensorsEntry> entries = {{kTinyLlamaTensors[i], checkpoint::SafetensorsDtype::F32, {4}}};
    const std::string bytes = checkpoint::safetensors_header(entries) + std::string(16, '\0');
    fuzz::write_input(dir / checkpoint::weights_file_name(i, count), bytes.data(), bytes.size());
  }
  const std::string config = R"({"model_type": "llama", "vocab_size": 8, "hidden_size": 4, "intermediate_size": 4,
    "num_hidden_layers": 1, "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 4})";
  fuzz::write_input(dir / checkpoint::kConfigFile, config.data(), config.size());
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const fs::path dir = make_checkpoint();
  fuzz::write_input(dir / checkpoint::kIndexFile, data, size);
  try {
    const checkpoint::CompletionMarker marker = checkpoint::read_completion_marker(dir);
    checkpoint::read_checked_hf_config(dir, marker);
    checkpoint::open_weight_files(dir, marker, checkpoint::Verify::against_marker);
  } catch (const UserError&) {
  }
  return 0;
}
