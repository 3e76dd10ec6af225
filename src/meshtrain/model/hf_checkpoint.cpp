// hf_checkpoint.cpp — Hugging Face checkpoint directories: save (sharded, atomic, completion marker) and load.
#include "meshtrain/model/hf_checkpoint.hpp"

#include "meshtrain/common/atomic_file.hpp"
#include "meshtrain/common/checksum.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/common/file_names.hpp"
#include "meshtrain/common/host_memory.hpp"
#include "meshtrain/common/json_read.hpp"
#include "meshtrain/common/log.hpp"
#include "meshtrain/model/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace fs = std::filesystem;

namespace meshtrain::model {
namespace {

constexpr const char* kConfigFile = "config.json";
constexpr const char* kSingleWeightsFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
// config.json key that marks a directory meshtrain wrote (Hugging Face ignores unknown keys).
constexpr const char* kMeshtrainKey = "meshtrain_format_version";

CheckpointFile write_text_file(const fs::path& dir, const std::string& name, const std::string& text) {
  AtomicFileWriter writer(dir / name);
  writer.write(text.data(), text.size());
  writer.commit();
  return {name, writer.bytes_written(), writer.crc32c()};
}

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

// The files listed in the completion marker, by name; empty if there is no marker.
std::map<std::string, CheckpointFile> read_marker(const fs::path& dir) {
  std::map<std::string, CheckpointFile> files;
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

// Checks a file's size and checksum against the marker (when the directory has one).
void check_against_marker(const std::map<std::string, CheckpointFile>& marker, const fs::path& dir,
                          const std::string& name, uint64_t bytes, uint32_t crc) {
  if (marker.empty()) return;
  auto it = marker.find(name);
  MT_USER_CHECK(it != marker.end(), "{}: the file is not listed in the completion marker {}", (dir / name).string(),
                kCompletionMarker);
  MT_USER_CHECK(it->second.bytes == bytes, "{}: size check failed: {} bytes, the completion marker says {}",
                (dir / name).string(), bytes, it->second.bytes);
  MT_USER_CHECK(it->second.crc32c == crc, "{}: checksum check failed: CRC-32C {:08x}, the completion marker says {:08x}",
                (dir / name).string(), crc, it->second.crc32c);
}

// Fields that change what the network computes; the others (token ids, init range, context limit) may differ.
nlohmann::json architecture_of(const LlamaConfig& config) {
  nlohmann::json j = config.to_hf_json("");
  for (const char* k : {"bos_token_id", "eos_token_id", "initializer_range", "max_position_embeddings", "torch_dtype"})
    j.erase(k);
  return j;
}

// Creates `dir` for save_hf_weights and removes an old marker from it.
void begin_checkpoint_directory(const fs::path& dir) {
  fs::create_directories(dir);
  fs::remove(dir / kCompletionMarker);
  fsync_directory(dir);
}

}  // namespace

std::string weights_file_name(size_t index, size_t count) {
  return fmt::format("model-{:05d}-of-{:05d}.safetensors", index + 1, count);
}

CheckpointFile write_hf_config(const fs::path& dir, const LlamaConfig& config, torch::Dtype dtype) {
  nlohmann::json config_json = config.to_hf_json(dtype == torch::kBFloat16 ? "bfloat16" : "float32");
  config_json[kMeshtrainKey] = 1;
  return write_text_file(dir, kConfigFile, config_json.dump(2) + "\n");
}

CheckpointFile write_hf_index(const fs::path& dir, const std::map<std::string, std::string>& weight_map,
                              uint64_t total_bytes) {
  nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  return write_text_file(dir, kIndexFile, index.dump(2) + "\n");
}

std::vector<CheckpointFile> save_hf_weights(const fs::path& dir, LlamaForCausalLM& model,
                                            const HfSaveOptions& options) {
  MT_USER_CHECK(options.dtype == torch::kFloat32 || options.dtype == torch::kBFloat16,
                "checkpoint dtype must be float32 or bfloat16, got {}", c10::toString(options.dtype));
  begin_checkpoint_directory(dir);

  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> shards(1);
  uint64_t shard_bytes = 0, total_bytes = 0;
  for (const auto& named : model.named_parameters()) {
    torch::Tensor stored = named.value().detach().to(torch::kCPU, options.dtype).contiguous();
    const uint64_t nbytes = stored.nbytes();
    if (!shards.back().empty() && shard_bytes + nbytes > options.max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().emplace_back(named.key(), std::move(stored));
    shard_bytes += nbytes;
    total_bytes += nbytes;
  }

  std::vector<CheckpointFile> files{write_hf_config(dir, model.config(), options.dtype)};
  std::map<std::string, std::string> weight_map;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name = shards.size() == 1 ? kSingleWeightsFile : weights_file_name(i, shards.size());
    AtomicFileWriter writer(dir / name);
    write_safetensors(writer, shards[i], {{"format", "pt"}});
    writer.commit();
    files.push_back({name, writer.bytes_written(), writer.crc32c()});
    for (const auto& [tensor_name, tensor] : shards[i]) weight_map[tensor_name] = name;
  }
  if (shards.size() > 1) {
    files.push_back(write_hf_index(dir, weight_map, total_bytes));
  } else {
    fs::remove(dir / kIndexFile);  // a stale index from an earlier sharded save would shadow model.safetensors
  }
  return files;
}

void write_completion_marker(const fs::path& dir, const std::vector<CheckpointFile>& files) {
  nlohmann::json list = nlohmann::json::array();
  for (const CheckpointFile& f : files) list.push_back({{"name", f.name}, {"bytes", f.bytes}, {"crc32c", f.crc32c}});
  write_text_file(dir, kCompletionMarker, nlohmann::json{{"files", list}}.dump(2) + "\n");
}

void save_hf_checkpoint(const fs::path& dir, LlamaForCausalLM& model, const HfSaveOptions& options) {
  write_completion_marker(dir, save_hf_weights(dir, model, options));
  log::info("saved checkpoint {} ({} parameters, {})", dir.string(), model.config().parameter_count(),
            options.dtype == torch::kBFloat16 ? "bf16" : "fp32");
}

bool is_complete_checkpoint(const fs::path& dir) { return fs::exists(dir / kCompletionMarker); }

void verify_checkpoint_files(const fs::path& dir) {
  auto marker = read_marker(dir);
  MT_USER_CHECK(!marker.empty(), "{}: incomplete checkpoint: there is no completion marker {}", dir.string(),
                kCompletionMarker);
  for (const auto& [name, file] : marker) {
    MT_USER_CHECK(fs::exists(dir / name), "{}: the file is missing (listed in the completion marker)",
                  (dir / name).string());
    const FileChecksum sum = file_crc32c(dir / name);
    check_against_marker(marker, dir, name, sum.bytes, sum.crc32c);
  }
}

LlamaConfig read_hf_config(const fs::path& dir) {
  const fs::path path = dir / kConfigFile;
  MT_USER_CHECK(fs::is_directory(dir), "checkpoint directory {} does not exist", dir.string());
  MT_USER_CHECK(fs::exists(path), "{} is not a checkpoint: it has no {}", dir.string(), kConfigFile);
  return LlamaConfig::from_hf_json(parse_json(read_text_file(path), path.string()), path.string());
}

CheckpointTensors CheckpointTensors::weights(const fs::path& dir, const LlamaConfig& config, Verify verify) {
  const auto marker = read_marker(dir);
  const fs::path config_path = dir / kConfigFile;
  MT_USER_CHECK(fs::exists(config_path), "{} is not a checkpoint: it has no {}", dir.string(), kConfigFile);
  const std::string config_text = read_text_file(config_path);
  const nlohmann::json config_json = parse_json(config_text, config_path.string());
  MT_USER_CHECK(!marker.empty() || !config_json.contains(kMeshtrainKey),
                "{}: incomplete checkpoint: meshtrain wrote it but the completion marker {} is missing "
                "(the save was interrupted)",
                dir.string(), kCompletionMarker);
  check_against_marker(marker, dir, kConfigFile, config_text.size(), crc32c(config_text.data(), config_text.size()));
  const LlamaConfig stored = LlamaConfig::from_hf_json(config_json, config_path.string());
  const nlohmann::json stored_arch = architecture_of(stored), model_arch = architecture_of(config);
  for (const auto& [key, value] : model_arch.items())
    MT_USER_CHECK(stored_arch.contains(key) && stored_arch[key] == value,
                  "{}: {} is {} in the checkpoint but {} in the model", config_path.string(), key,
                  stored_arch.contains(key) ? stored_arch[key].dump() : "absent", value.dump());

  // Which file holds each tensor.
  std::map<std::string, std::string> file_of;
  std::set<std::string> weight_files;
  // A meshtrain directory has what its marker lists, whatever else lies there; a Hugging Face one what it holds.
  const bool listed = marker.empty() ? fs::exists(dir / kIndexFile) : marker.count(kIndexFile) != 0;
  if (listed) {
    const std::string index_text = read_text_file(dir / kIndexFile);
    check_against_marker(marker, dir, kIndexFile, index_text.size(), crc32c(index_text.data(), index_text.size()));
    const nlohmann::json index = parse_json(index_text, (dir / kIndexFile).string());
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

  // The names and shapes of the parameters of the model the config describes (built without storage).
  std::map<std::string, std::vector<int64_t>> params;
  {
    const ParametersWithoutStorage without_storage;
    for (const auto& named : LlamaForCausalLM(config).named_parameters())
      params[named.key()] = named.value().sizes().vec();
  }

  CheckpointTensors tensors;
  tensors.dir_ = dir;
  tensors.files_.reserve(weight_files.size());
  for (const std::string& name : weight_files) {
    MT_USER_CHECK(marker.empty() || marker.count(name), "{}: the weight file is not listed in the completion marker {}",
                  (dir / name).string(), kCompletionMarker);
    MT_USER_CHECK(fs::exists(dir / name), "{}: the weight file is missing", (dir / name).string());
    if (verify == Verify::against_marker && !marker.empty()) {
      const FileChecksum sum = file_crc32c(dir / name);
      check_against_marker(marker, dir, name, sum.bytes, sum.crc32c);
    }
    tensors.files_.push_back(SafetensorsFile::open(dir / name));
    const SafetensorsFile& file = tensors.files_.back();
    for (size_t k = 0; k < file.entries().size(); ++k) {
      const SafetensorsEntry& e = file.entries()[k];
      if (!file_of.empty()) {
        MT_USER_CHECK(file_of.count(e.name) && file_of[e.name] == name,
                      "{}: tensor '{}' is not mapped to this file by {}", (dir / name).string(), e.name, kIndexFile);
      }
      auto param = params.find(e.name);
      if (param == params.end()) {
        // Tensors HF may store that the model derives: the rotary table, a tied head.
        const std::string rotary_buffer = "rotary_emb.inv_freq";
        const bool derived = e.name.size() >= rotary_buffer.size() &&
                             e.name.compare(e.name.size() - rotary_buffer.size(), rotary_buffer.size(), rotary_buffer) == 0;
        const bool tied_head = e.name == "lm_head.weight" && config.tie_word_embeddings;
        MT_USER_CHECK(derived || tied_head, "{}: tensor '{}' is not a parameter of the model", (dir / name).string(),
                      e.name);
        continue;
      }
      MT_USER_CHECK(param->second == e.shape, "{}: tensor '{}' has shape {} but the model's is {}",
                    (dir / name).string(), e.name, c10::str(c10::IntArrayRef(e.shape)),
                    c10::str(c10::IntArrayRef(param->second)));
      tensors.where_[e.name] = {tensors.files_.size() - 1, k};
    }
  }
  for (const auto& [name, shape] : params)
    MT_USER_CHECK(tensors.contains(name), "{}: parameter '{}' is not in the checkpoint", dir.string(), name);
  return tensors;
}

CheckpointTensors CheckpointTensors::listed_files_starting_with(const fs::path& dir, const std::string& file_prefix) {
  const auto marker = read_marker(dir);
  MT_USER_CHECK(!marker.empty(), "{}: incomplete checkpoint: there is no completion marker {} to list its {}* files",
                dir.string(), kCompletionMarker, file_prefix);
  std::vector<fs::path> paths;  // in name order (the marker's map)
  for (const auto& [name, file] : marker)
    if (name.rfind(file_prefix, 0) == 0 && fs::path(name).extension() == ".safetensors") paths.push_back(dir / name);
  CheckpointTensors tensors;
  tensors.dir_ = dir;
  tensors.files_.reserve(paths.size());
  for (const fs::path& path : paths) {
    tensors.files_.push_back(SafetensorsFile::open(path));
    const std::vector<SafetensorsEntry>& entries = tensors.files_.back().entries();
    for (size_t k = 0; k < entries.size(); ++k) {
      MT_USER_CHECK(!tensors.contains(entries[k].name), "{}: tensor '{}' is stored twice", path.string(),
                    entries[k].name);
      tensors.where_[entries[k].name] = {tensors.files_.size() - 1, k};
    }
  }
  return tensors;
}

at::Tensor CheckpointTensors::read(const ParameterSlice& slice, const std::string& suffix) const {
  const std::string name = slice.name + suffix;
  auto it = where_.find(name);
  MT_USER_CHECK(it != where_.end(), "{}: the checkpoint has no tensor '{}'", dir_.string(), name);
  const SafetensorsFile& file = files_[it->second.first];
  const SafetensorsEntry& e = file.entries()[it->second.second];
  MT_USER_CHECK(e.shape == slice.full_shape, "{}: tensor '{}' has shape {}, expected {}", file.path().string(), name,
                c10::str(c10::IntArrayRef(e.shape)), c10::str(c10::IntArrayRef(slice.full_shape)));
  at::Tensor out = at::empty({slice.numel()}, at::kFloat);
  slice.for_each_run([&](int64_t whole_index, int64_t count, int64_t offset) {
    out.narrow(0, offset, count).copy_(file.read_elements(e, whole_index, count));
  });
  return out;
}

SliceSource CheckpointTensors::source(const std::string& suffix) const {
  return [this, suffix](const ParameterSlice& slice) { return read(slice, suffix); };
}

namespace {

void copy_weights(const fs::path& dir, const CheckpointTensors& tensors, LlamaForCausalLM& model) {
  torch::NoGradGuard no_grad;
  auto params = model.named_parameters();
  for (auto& named : params) {
    at::Tensor& p = named.value();
    p.copy_(tensors.read(ParameterSlice::whole(named.key(), p.sizes().vec())).view(p.sizes()));
  }
  log::info("loaded checkpoint {} ({} tensors)", dir.string(), params.size());
}

}  // namespace

void load_hf_checkpoint(const fs::path& dir, LlamaForCausalLM& model) {
  copy_weights(dir, CheckpointTensors::weights(dir, model.config(), CheckpointTensors::Verify::against_marker), model);
}

std::unique_ptr<LlamaForCausalLM> load_hf_model(const fs::path& dir) {
  const LlamaConfig config = read_hf_config(dir);
  const CheckpointTensors tensors = CheckpointTensors::weights(dir, config, CheckpointTensors::Verify::against_marker);
  const int64_t bytes = config.parameter_count() * static_cast<int64_t>(sizeof(float));
  const MemoryAvailable available = available_memory();
  MT_USER_CHECK(bytes <= available.bytes,
                "{}: the model has {} parameters, {} in fp32, more than this host can still allocate ({}, {})",
                (dir / kConfigFile).string(), config.parameter_count(), gigabytes(bytes), gigabytes(available.bytes),
                available.source);
  auto model = std::make_unique<LlamaForCausalLM>(config);
  copy_weights(dir, tensors, *model);
  return model;
}

}  // namespace meshtrain::model
