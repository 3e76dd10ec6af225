// hf_checkpoint.cpp — a model's weights in Hugging Face checkpoint directories: save (sharded, atomic, completion
// marker) and load (checked against the model's parameters).
#include "meshtrain/model/hf_checkpoint.hpp"

#include "meshtrain/common/atomic_file.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/common/shape_text.hpp"
#include "meshtrain/common/host_memory.hpp"
#include "meshtrain/common/log.hpp"

namespace fs = std::filesystem;

namespace meshtrain::model {

using checkpoint::CheckpointFile;
using checkpoint::SafetensorsEntry;
using checkpoint::SafetensorsFile;

namespace {

// Creates `dir` for save_hf_weights and removes an old marker from it.
void begin_checkpoint_directory(const fs::path& dir) {
  fs::create_directories(dir);
  fs::remove(dir / checkpoint::kCompletionMarker);
  fsync_directory(dir);
}

}  // namespace

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

  std::vector<CheckpointFile> files{checkpoint::write_hf_config(
      dir, model.config(), options.dtype == torch::kBFloat16 ? "bfloat16" : "float32")};
  std::map<std::string, std::string> weight_map;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string name =
        shards.size() == 1 ? checkpoint::kSingleWeightsFile : checkpoint::weights_file_name(i, shards.size());
    AtomicFileWriter writer(dir / name);
    write_safetensors(writer, shards[i], {{"format", "pt"}});
    writer.commit();
    files.push_back({name, writer.bytes_written(), writer.crc32c()});
    for (const auto& [tensor_name, tensor] : shards[i]) weight_map[tensor_name] = name;
  }
  if (shards.size() > 1) {
    files.push_back(checkpoint::write_hf_index(dir, weight_map, total_bytes));
  } else {
    fs::remove(dir / checkpoint::kIndexFile);  // a stale index from an earlier sharded save would shadow the weights
  }
  return files;
}

void save_hf_checkpoint(const fs::path& dir, LlamaForCausalLM& model, const HfSaveOptions& options) {
  checkpoint::write_completion_marker(dir, save_hf_weights(dir, model, options));
  log::info("saved checkpoint {} ({} parameters, {})", dir.string(), model.config().parameter_count(),
            options.dtype == torch::kBFloat16 ? "bf16" : "fp32");
}

CheckpointTensors CheckpointTensors::weights(const fs::path& dir, const LlamaConfig& config,
                                             checkpoint::Verify verify) {
  const checkpoint::CompletionMarker marker = checkpoint::read_completion_marker(dir);
  checkpoint::check_same_architecture(dir, checkpoint::read_checked_hf_config(dir, marker), config);

  // The names and shapes of the parameters of the model the config describes (built without storage).
  std::map<std::string, std::vector<int64_t>> params;
  {
    const ParametersWithoutStorage without_storage;
    for (const auto& named : LlamaForCausalLM(config).named_parameters())
      params[named.key()] = named.value().sizes().vec();
  }

  CheckpointTensors tensors;
  tensors.dir_ = dir;
  tensors.files_ = checkpoint::open_weight_files(dir, marker, verify);
  for (size_t f = 0; f < tensors.files_.size(); ++f) {
    const SafetensorsFile& file = tensors.files_[f];
    for (size_t k = 0; k < file.entries().size(); ++k) {
      const SafetensorsEntry& e = file.entries()[k];
      auto param = params.find(e.name);
      if (param == params.end()) {
        // Tensors HF may store that the model derives: the rotary table, a tied head.
        const std::string rotary_buffer = "rotary_emb.inv_freq";
        const bool derived = e.name.size() >= rotary_buffer.size() &&
                             e.name.compare(e.name.size() - rotary_buffer.size(), rotary_buffer.size(), rotary_buffer) == 0;
        const bool tied_head = e.name == "lm_head.weight" && config.tie_word_embeddings;
        MT_USER_CHECK(derived || tied_head, "{}: tensor '{}' is not a parameter of the model", file.path().string(),
                      e.name);
        continue;
      }
      MT_USER_CHECK(param->second == e.shape, "{}: tensor '{}' has shape {} but the model's is {}",
                    file.path().string(), e.name, shape_text(e.shape), shape_text(param->second));
      tensors.where_[e.name] = {f, k};
    }
  }
  for (const auto& [name, shape] : params)
    MT_USER_CHECK(tensors.contains(name), "{}: parameter '{}' is not in the checkpoint", dir.string(), name);
  return tensors;
}

CheckpointTensors CheckpointTensors::listed_files_starting_with(const fs::path& dir, const std::string& file_prefix) {
  const checkpoint::CompletionMarker marker = checkpoint::read_completion_marker(dir);
  MT_USER_CHECK(!marker.empty(), "{}: incomplete checkpoint: there is no completion marker {} to list its {}* files",
                dir.string(), checkpoint::kCompletionMarker, file_prefix);
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
  at::Tensor out = at::empty({slice.numel()}, at::kFloat);
  read_into(slice, out, suffix);
  return out;
}

void CheckpointTensors::read_into(const ParameterSlice& slice, const at::Tensor& out, const std::string& suffix) const {
  MT_CHECK(out.scalar_type() == at::kFloat && out.is_contiguous() && out.numel() == slice.numel(),
           "{} read into a tensor of {} {} elements", slice.describe(), out.numel(), c10::toString(out.scalar_type()));
  const std::string name = slice.name + suffix;
  auto it = where_.find(name);
  MT_USER_CHECK(it != where_.end(), "{}: the checkpoint has no tensor '{}'", dir_.string(), name);
  const SafetensorsFile& file = files_[it->second.first];
  const SafetensorsEntry& e = file.entries()[it->second.second];
  MT_USER_CHECK(e.shape == slice.full_shape, "{}: tensor '{}' has shape {}, expected {}", file.path().string(), name,
                shape_text(e.shape), shape_text(slice.full_shape));
  float* out_data = out.data_ptr<float>();
  slice.for_each_run([&](int64_t whole_index, int64_t count, int64_t offset) {
    if (e.dtype == checkpoint::SafetensorsDtype::F32)
      file.read_elements(e, whole_index, count, out_data + offset);
    else
      out.narrow(0, offset, count).copy_(read_elements(file, e, whole_index, count));
  });
}

SliceSource CheckpointTensors::source(const std::string& suffix) const {
  return [this, suffix](const ParameterSlice& slice, const at::Tensor& out) { read_into(slice, out, suffix); };
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
  copy_weights(dir, CheckpointTensors::weights(dir, model.config(), checkpoint::Verify::against_marker), model);
}

std::unique_ptr<LlamaForCausalLM> load_hf_model(const fs::path& dir) {
  const LlamaConfig config = checkpoint::read_hf_config(dir);
  const CheckpointTensors tensors = CheckpointTensors::weights(dir, config, checkpoint::Verify::against_marker);
  const int64_t bytes = config.parameter_count() * static_cast<int64_t>(sizeof(float));
  const MemoryAvailable available = available_memory();
  MT_USER_CHECK(bytes <= available.bytes,
                "{}: the model has {} parameters, {} in fp32, more than this host can still allocate ({}, {})",
                (dir / checkpoint::kConfigFile).string(), config.parameter_count(), gigabytes(bytes),
                gigabytes(available.bytes), available.source);
  auto model = std::make_unique<LlamaForCausalLM>(config);
  copy_weights(dir, tensors, *model);
  return model;
}

}  // namespace meshtrain::model
