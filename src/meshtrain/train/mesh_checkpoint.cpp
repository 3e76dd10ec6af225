// mesh_checkpoint.cpp — save (every device writes its files) and optimizer-state load of mesh checkpoints.
#include "meshtrain/train/mesh_checkpoint.hpp"

#include "meshtrain/common/atomic_file.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/common/log.hpp"
#include "meshtrain/model/hf_checkpoint.hpp"
#include "meshtrain/model/safetensors.hpp"

#include <fmt/format.h>

#include <map>

namespace fs = std::filesystem;

namespace meshtrain::train {
namespace {

std::string optimizer_file_name(size_t index, size_t count) {
  return fmt::format("optimizer-{:05d}-of-{:05d}.safetensors", index + 1, count);
}

void write_tensor_file(const fs::path& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  AtomicFileWriter writer(path);
  model::write_safetensors(writer, tensors, {{"format", "pt"}});
  writer.commit();
}

}  // namespace

void save_mesh_checkpoint(const fs::path& dir, runtime::DeviceContext& ctx, parallel::ParallelModel& model,
                          AdamW& optimizer, const TrainingState& state, const std::function<void()>& after_own_files) {
  runtime::Comm& world = ctx.world();
  const int device = world.rank();
  if (device == 0) model::begin_checkpoint_directory(dir);
  world.barrier();

  // Tensor i (in unit order) is written by device i mod writers; each device keeps only the full tensors it writes.
  const size_t num_tensors = model.model().named_parameters().size();
  const size_t writers = std::min<size_t>(world.size(), num_tensors);
  auto mine = [&](size_t index) { return index % writers == static_cast<size_t>(device); };
  std::vector<std::string> names;
  std::vector<std::pair<std::string, torch::Tensor>> weights, moments;
  uint64_t total_bytes = 0;
  model.for_each_full_tensor(model.parameter_shards(), [&](const std::string& name, const at::Tensor& full) {
    if (mine(names.size())) weights.emplace_back(name, full);
    names.push_back(name);
    total_bytes += full.nbytes();
  });
  MT_CHECK(names.size() == num_tensors, "{} full tensors for {} parameters", names.size(), num_tensors);
  const std::pair<const char*, const std::vector<at::Tensor>*> moment_buffers[] = {
      {".exp_avg", &optimizer.exp_avg()}, {".exp_avg_sq", &optimizer.exp_avg_sq()}};
  for (const auto& [suffix, buffers] : moment_buffers) {
    size_t index = 0;
    model.for_each_full_tensor(*buffers, [&, suffix = suffix](const std::string& name, const at::Tensor& full) {
      if (mine(index++)) moments.emplace_back(name + suffix, full);
    });
  }
  if (static_cast<size_t>(device) < writers) {
    write_tensor_file(dir / model::weights_file_name(device, writers), weights);
    write_tensor_file(dir / optimizer_file_name(device, writers), moments);
  }

  std::vector<model::CheckpointFile> small_files;
  if (device == 0) {
    std::map<std::string, std::string> weight_map;
    for (size_t i = 0; i < names.size(); ++i) weight_map[names[i]] = model::weights_file_name(i % writers, writers);
    small_files.push_back(model::write_hf_config(dir, model.model().config(), torch::kFloat32));
    small_files.push_back(model::write_hf_index(dir, weight_map, total_bytes));
    small_files.push_back(write_training_state(dir, state));
  }
  if (after_own_files) after_own_files();
  world.barrier();  // every device's files are on disk
  if (device == 0) {
    std::vector<model::CheckpointFile> files = small_files;
    for (size_t k = 0; k < writers; ++k) {
      files.push_back(model::describe_checkpoint_file(dir, model::weights_file_name(k, writers)));
      files.push_back(model::describe_checkpoint_file(dir, optimizer_file_name(k, writers)));
    }
    model::write_completion_marker(dir, files);
    log::info("saved checkpoint {}: {} tensors in {} weight and {} optimizer files written by {} devices", dir.string(),
              names.size(), writers, writers, writers);
  }
  world.barrier();  // complete before anyone moves on (or removes an older one)
}

void load_optimizer_state(const fs::path& dir, parallel::ParallelModel& model, AdamW& optimizer) {
  std::map<std::string, at::Tensor> moments;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("optimizer-", 0) != 0 || entry.path().extension() != ".safetensors") continue;
    const model::SafetensorsFile file = model::SafetensorsFile::read(entry.path());
    for (const model::SafetensorsEntry& e : file.entries()) moments[e.name] = file.tensor(e.name);
  }
  auto moment = [&](const std::string& name) -> at::Tensor {
    auto it = moments.find(name);
    MT_USER_CHECK(it != moments.end(), "{}: the optimizer state has no tensor '{}'", dir.string(), name);
    return it->second;
  };
  model.load_shards(optimizer.exp_avg(), [&](const std::string& name) { return moment(name + ".exp_avg"); });
  model.load_shards(optimizer.exp_avg_sq(), [&](const std::string& name) { return moment(name + ".exp_avg_sq"); });
  optimizer.set_steps_taken(read_training_state(dir).step);
}

}  // namespace meshtrain::train
