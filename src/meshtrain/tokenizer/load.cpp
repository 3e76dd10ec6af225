// load.cpp — load_tokenizer(): tokenizer names resolved to installed assets, file paths, the byte tokenizer.
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "meshtrain/common/checksum.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/tokenizer/tokenizer.hpp"

namespace meshtrain::tokenizer {
namespace fs = std::filesystem;

fs::path assets_dir() {
  const char* env = std::getenv("MESHTRAIN_ASSETS_DIR");
  if (env && *env) return env;
  return fs::path(MESHTRAIN_SOURCE_DIR) / "assets";
}

std::vector<std::pair<std::string, std::string>> known_tokenizer_names() {
  return {
      {"byte", "(built in: one token per byte, vocabulary 256)"},
      {"gpt2", "npm/gpt-tokenizer/data/r50k_base.tiktoken"},
      {"r50k_base", "npm/gpt-tokenizer/data/r50k_base.tiktoken"},
      {"p50k_base", "npm/gpt-tokenizer/data/p50k_base.tiktoken"},
      {"cl100k_base", "npm/gpt-tokenizer/data/cl100k_base.tiktoken"},
      {"o200k_base", "npm/gpt-tokenizer/data/o200k_base.tiktoken"},
      {"llama3", "npm/tokenizer-llama3/models/tokenizer.json"},
  };
}

std::string read_file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  MT_USER_CHECK(in, "cannot open {}", path.string());
  std::ostringstream buffer;
  buffer << in.rdbuf();
  MT_USER_CHECK(!in.bad(), "cannot read {}", path.string());
  return buffer.str();
}

std::string file_fingerprint(const std::string& bytes) {
  return fmt::format("crc32c:{:08x}:{}", crc32c(bytes.data(), bytes.size()), bytes.size());
}

TokenizerSpec byte_tokenizer_spec() {
  TokenizerSpec spec;
  spec.name = "byte";
  spec.kind = "byte";
  spec.fingerprint = "byte:256";
  spec.whole_piece_lookup = false;
  spec.splittable = true;
  for (int b = 0; b < 256; ++b) spec.token_bytes.emplace_back(1, static_cast<char>(b));
  return spec;
}

namespace {

TokenizerSpec spec_from_path(const fs::path& path, const std::string& name) {
  MT_USER_CHECK(fs::is_regular_file(path), "tokenizer file {} does not exist", path.string());
  if (path.extension() == ".json") return tokenizer_json_spec(path, name);
  if (path.extension() == ".tiktoken") return tiktoken_spec(path, path.stem().string());
  throw UserError(
      fmt::format("{}: expected a tiktoken rank file (<encoding>.tiktoken) or a tokenizer.json", path.string()));
}

}  // namespace

std::shared_ptr<const Tokenizer> load_tokenizer(const std::string& name_or_path) {
  if (name_or_path == "byte") return std::make_shared<const Tokenizer>(byte_tokenizer_spec());
  for (const auto& [name, asset] : known_tokenizer_names()) {
    if (name != name_or_path) continue;
    fs::path path = assets_dir() / asset;
    MT_USER_CHECK(fs::exists(path), "tokenizer '{}' needs {}, which is not installed: run scripts/fetch_assets.sh",
                  name, path.string());
    return std::make_shared<const Tokenizer>(spec_from_path(path, name == "gpt2" ? "r50k_base" : name));
  }
  fs::path path(name_or_path);
  if (!fs::exists(path)) {
    std::string names;
    for (const auto& known : known_tokenizer_names()) names += (names.empty() ? "" : ", ") + known.first;
    throw UserError(
        fmt::format("tokenizer '{}' is neither a known name ({}) nor an existing file", name_or_path, names));
  }
  return std::make_shared<const Tokenizer>(spec_from_path(path, path.stem().string()));
}

}  // namespace meshtrain::tokenizer
