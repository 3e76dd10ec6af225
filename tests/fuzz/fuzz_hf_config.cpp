// fuzz_hf_config.cpp — fuzzes a Hugging Face config.json as `generate`, `score` and `init_from` read it
// (parse_json, then config::LlamaConfig::from_hf_json with its validation), then writes it back.
//
// Accepted: meshtrain::UserError (not JSON, nested too deep, a missing or mistyped key, a value out of range or an
// unsupported feature, naming the file and the key). Anything else is a finding.
#include "fuzz_target.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/common/json_read.hpp"
#include "meshtrain/config/llama_config.hpp"

using namespace meshtrain;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const config::LlamaConfig config = config::LlamaConfig::from_hf_json(
        parse_json(std::string_view(reinterpret_cast<const char*>(data), size), "config.json"), "config.json");
    config.to_hf_json("float32").dump();
    config.parameter_count();
    config.training_flops_per_token(2048);
  } catch (const UserError&) {
  }
  return 0;
}
