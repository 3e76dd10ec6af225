// hf_directory.cpp — config.json, the weight index and the completion marker of a checkpoint directory: written,
// read and checked.
#include "meshtrain/checkpoint/hf_directory.hpp"

#include "meshtrain/common/atomic_file.hpp"
#include "meshtrain/common/checksum.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/common/file_names.hpp"
#include "meshtrain/common/json_read.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <set>
#include <sstream>

namespace fs = std::filesystem;

namespace meshtrain::checkpoint {
namespace {

// config.json key that marks a directory meshtrain wrote (Hugging Face ignores unknown keys).
constexpr const char* kMeshtrainKey = "meshtrain_format_version";

std::string read_text_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  MT_USER_CHECK(in, "cannot open {}", path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A file name from an untrusted marker or index: a plain name inside the checkpoint directory ("../x", "/x", "a/b"
// and names with a NUL byte are refused, naming `source` and the field).
std::string plain_file_name(const nlohmann::json& value, const fs::path& source, const char* field) {
  MT_USER_CHECK(value.is_string(), "{}: {} {} is not a file name", source.string(), field, json_excerpt(value));
  const std::string name = value.get<std::string>();
  MT_USER_CHECK(is_plain_file_name(name),
                "{}: file name check failed: {} {} must be a plain file name in the checkpoint directory",
                source.string(), field, json_excerpt(value));
  return name;
}

// Checks a file's size and checksum against the marker (when the directory has one).
void check_against_marker(const CompletionMarker& marker, const fs::path& dir, const std::string& name,
                          uint64_t bytes, uint32_t crc) {
  if (marker.empty()) return;
  auto it = marker.find(name);
  MT_USER_CHECK(it != marker.end(), "{}: the file is not listed in the completion marker {}", (dir / name).string(),
                kCompletionMarker);
  MT_USER_CHECK(it->second.bytes == bytes, "{}: size check failed: {} bytes, the completion marker says {}",
                (dir / name).string(), bytes, it->second.bytes);
  MT_USER_CHECK(it->second.crc32c == crc, "{}: checksum check failed: CRC-32C {:08x}, the completion marker says {:08x}",
                (dir / name).string(), crc, it->second.crc32c);
}

// Reads the small file `name` of `dir` whole and checks it against the marker.
std::string read_checked_text_file(const fs::path& dir, const std::string& name, const CompletionMarker& marker) {
  const std::string text = read_text_file(dir / name);
  check_against_marker(marker, dir, name, text.size(), crc32c(text.data(), text.size()));
  return text;
}

// Fields that change what the network computes; the others (token ids, init range, context limit) may differ.
nlohmann::json architecture_of(const config::LlamaConfig& config) {
  nlohmann::json j = config.to_hf_json("");
  for (const char* k : {"bos_token_id", "eos_token_id", "initializer_range", "max_position_embeddings", "torch_dtype"})
    j.erase(k);
  return j;
}

}  // namespace

CompletionMarker read_completion_marker(const fs::path& dir) {
  CompletionMarker files;
  const fs::path path = dir / kCompletionMarker;
  if (!fs::exists(path)) return files;
  const nlohmann::json marker = parse_json(read_text_file(path), path.string());
  MT_USER_CHECK(marker.is_object() && marker.contains("files") && marker["files"].is_array(), "{}: no 'files' list",
                path.string());
  for (const auto& f : marker["files"]) {
    auto is_unsigned = [&](const char* key, uint64_t max) {
      return f.contains(key) && f.at(key).is_number_unsigned() && f.at(key).get<uint64_t>() <= max;
    };
    MT_USER_CHECK(f.is_object() && f.contains("name") && is_unsigned("bytes", UINT64_MAX) &&
                      is_unsigned("crc32c", UINT32_MAX),
                  "{}: a file entry lacks a name, a byte count or a 32-bit crc32c: {}", path.string(),
                  json_excerpt(f));
    CheckpointFile file{plain_file_name(f.at("name"), path, "name"), f.at("bytes").get<uint64_t>(),
                        f.at("crc32c").get<uint32_t>()};
    files[file.name] = file;
  }
  return files;
}

CheckpointFile write_checkpoint_file(const fs::path& dir, const std::string& name, const std::string& text) {
  AtomicFileWriter writer(dir / name);
  writer.write(text.data(), text.size());
  writer.commit();
  return {name, writer.bytes_written(), writer.crc32c()};
}

void write_completion_marker(const fs::path& dir, const std::vector<CheckpointFile>& files) {
  nlohmann::json list = nlohmann::json::array();
  for (const CheckpointFile& f : files) list.push_back({{"name", f.name}, {"bytes", f.bytes}, {"crc32c", f.crc32c}});
  write_checkpoint_file(dir, kCompletionMarker, nlohmann::json{{"files", list}}.dump(2) + "\n");
}

bool is_complete_checkpoint(const fs::path& dir) { return fs::exists(dir / kCompletionMarker); }

void verify_checkpoint_files(const fs::path& dir) {
  const CompletionMarker marker = read_completion_marker(dir);
  MT_USER_CHECK(!marker.empty(), "{}: incomplete checkpoint: there is no completion marker {}", dir.string(),
                kCompletionMarker);
  for (const auto& [name, file] : marker) {
    MT_USER_CHECK(fs::exists(dir / name), "{}: the file is missing (listed in the completion marker)",
                  (dir / name).string());
    const FileChecksum sum = file_crc32c(dir / name);
    check_against_marker(marker, dir, name, sum.bytes, sum.crc32c);
  }
}

std::string weights_file_name(size_t index, size_t count) {
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", index + 1, count);
}

CheckpointFile write_hf_config(const fs::path& dir, const config::LlamaConfig& config, const std::string& torch_dtype) {
  nlohmann::json config_json = config.to_hf_json(torch_dtype);
  config_json[kMeshtrainKey] = 1;
  return write_checkpoint_file(dir, kConfigFile, config_json.dump(2) + "\n");
}

CheckpointFile write_hf_index(const fs::path& dir, const std::map<std::string, std::string>& weight_map,
                              uint64_t total_bytes) {
  nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  return write_checkpoint_file(dir, kIndexFile, index.dump(2) + "\n");
}

config::LlamaConfig read_hf_config(const fs::path& dir) {
  const fs::path path = dir / kConfigFile;
  MT_USER_CHECK(fs::is_directory(dir), "checkpoint directory {} does not exist", dir.string());
  MT_USER_CHECK(fs::exists(path), "{} is not a checkpoint: it has no {}", dir.string(), kConfigFile);
  return config::LlamaConfig::from_hf_json(parse_json(read_text_file(path), path.string()), path.string());
}

config::LlamaConfig read_checked_hf_config(const fs::path& dir, const CompletionMarker& marker) {
  const fs::path path = dir / kConfigFile;
  MT_USER_CHECK(fs::exists(path), "{} is not a checkpoint: it has no {}", dir.string(), kConfigFile);
  const nlohmann::json config_json = parse_json(read_checked_text_file(dir, kConfigFile, marker), path.string());
  MT_USER_CHECK(!marker.empty() || !config_json.contains(kMeshtrainKey),
                "{}: incomplete checkpoint: meshtrain wrote it but the completion marker {} is missing "
                "(the save was interrupted)",
                dir.string(), kCompletionMarker);
  return config::LlamaConfig::from_hf_json(config_json, path.string());
}

void check_same_architecture(const fs::path& dir, const config::LlamaConfig& stored,
                             const config::LlamaConfig& model) {
  const nlohmann::json stored_arch = architecture_of(stored), model_arch = architecture_of(model);
  for (const auto& [key, value] : model_arch.items())
    MT_USER_CHECK(stored_arch.contains(key) && stored_arch[key] == value,
                  "{}: {} is {} in the checkpoint but {} in the model", (dir / kConfigFile).string(), key,
                  stored_arch.contains(key) ? stored_arch[key].dump() : "absent", value.dump());
}

std::vector<SafetensorsFile> open_weight_files(const fs::path& dir, const CompletionMarker& marker, Verify verify) {
  // Which file holds each tensor (empty without an index).
  std::map<std::string, std::string> file_of;
  std::set<std::string> weight_files;
  // A meshtrain directory has what its marker lists, whatever else lies there; a Hugging Face one what it holds.
  const bool indexed = marker.empty() ? fs::exists(dir / kIndexFile) : marker.count(kIndexFile) != 0;
  if (indexed) {
    const nlohmann::json index =
        parse_json(read_checked_text_file(dir, kIndexFile, marker), (dir / kIndexFile).string());
    MT_USER_CHECK(index.contains("weight_map") && index["weight_map"].is_object(), "{}: no weight_map object",
                  (dir / kIndexFile).string());
    for (const auto& [name, file] : index["weight_map"].items()) {
      file_of[name] = plain_file_name(file, dir / kIndexFile, "weight_map file");
      weight_files.insert(file_of[name]);
    }
  } else {
    MT_USER_CHECK(fs::exists(dir / kSingleWeightsFile), "{}: no weights: neither {} nor {}", dir.string(),
                  kSingleWeightsFile, kIndexFile);
    weight_files.insert(kSingleWeightsFile);
  }

  std::vector<SafetensorsFile> files;
  for (const std::string& name : weight_files) {
    MT_USER_CHECK(marker.empty() || marker.count(name), "{}: the weight file is not listed in the completion marker {}",
                  (dir / name).string(), kCompletionMarker);
    MT_USER_CHECK(fs::exists(dir / name), "{}: the weight file is missing", (dir / name).string());
    if (verify == Verify::against_marker && !marker.empty()) {
      const FileChecksum sum = file_crc32c(dir / name);
      check_against_marker(marker, dir, name, sum.bytes, sum.crc32c);
    }
    files.push_back(SafetensorsFile::open(dir / name));
    if (file_of.empty()) continue;
    for (const SafetensorsEntry& e : files.back().entries())
      MT_USER_CHECK(file_of.count(e.name) && file_of[e.name] == name, "{}: tensor '{}' is not mapped to this file by {}",
                    (dir / name).string(), e.name, kIndexFile);
  }
  return files;
}

}  // namespace meshtrain::checkpoint
