// mesh_checkpoint.cpp — save (every device writes its files) and optimizer-state load of mesh checkpoints.
#include "meshtrain/train/mesh_checkpoint.hpp"

#include "meshtrain/checkpoint/checkpoint_dirs.hpp"
#include "meshtrain/common/atomic_file.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/common/log.hpp"
#include "meshtrain/model/hf_checkpoint.hpp"
#include "meshtrain/model/safetensors.hpp"
#include "meshtrain/runtime/comm.hpp"

#include <fmt/format.h>

#include <map>
#include <memory>

namespace fs = std::filesystem;

namespace meshtrain::train {
namespace {

std::string optimizer_file_name(size_t index, size_t count) {
  return fmt::format("optimizer-{:05d}-of-{:05d}.safetensors", index + 1, count);
}

// One file this device writes, streamed a part of a tensor at a time (ParallelModel::assemble_whole_tensors), its
// checksum computed as it is written.
struct StreamedFile {
  StreamedFile(const fs::path& path, std::vector<checkpoint::SafetensorsEntry> entries)
      : name(path.filename().string()), writer(path), tensors(writer, std::move(entries), {{"format", "pt"}}) {}
  checkpoint::CheckpointFile commit() {
    tensors.finish();
    writer.commit();
    return {name, writer.bytes_written(), writer.crc32c()};
  }
  std::string name;
  AtomicFileWriter writer;
  model::SafetensorsStreamWriter tensors;
};

// save_mesh_checkpoint's work: every file into checkpoint::partial_checkpoint_dir(dir), published as `dir` by device 0.
void write_mesh_checkpoint(const fs::path& dir, runtime::DeviceContext& ctx, parallel::ParallelModel& model,
                           AdamW& optimizer, const checkpoint::TrainingState& state, const std::function<void()>& after_own_files) {
  runtime::Comm& world = ctx.world();
  const int device = world.rank();
  const fs::path partial = checkpoint::partial_checkpoint_dir(dir);
  if (device == 0) checkpoint::begin_partial_checkpoint(dir);
  world.barrier();

  // Parameter i (in unit order) is assembled on, and written by, world rank i mod writers.
  const std::vector<std::pair<std::string, std::vector<int64_t>>> shapes = model.whole_parameter_shapes();
  const size_t writers = std::min<size_t>(world.size(), shapes.size());
  auto owner = [&](size_t index) { return static_cast<int>(index % writers); };
  const bool writes = static_cast<size_t>(device) < writers;
  std::unique_ptr<StreamedFile> weights_file, optimizer_file;
  if (writes) {
    std::vector<checkpoint::SafetensorsEntry> weights, moments;
    for (const char* suffix : {"", ".exp_avg", ".exp_avg_sq"})
      for (size_t i = 0; i < shapes.size(); ++i)
        if (owner(i) == device)
          (*suffix ? moments : weights).push_back({shapes[i].first + suffix, checkpoint::SafetensorsDtype::F32, shapes[i].second});
    weights_file =
        std::make_unique<StreamedFile>(partial / checkpoint::weights_file_name(device, writers), std::move(weights));
    optimizer_file = std::make_unique<StreamedFile>(partial / optimizer_file_name(device, writers), std::move(moments));
  }
  model.assemble_whole_tensors(model.parameter_shards(), owner,
                               [&](size_t, const std::string&, const at::Tensor& part, int64_t) {
                                 weights_file->tensors.write_part(part);
                               });
  for (const std::vector<at::Tensor>* moments : {&optimizer.exp_avg(), &optimizer.exp_avg_sq()})
    model.assemble_whole_tensors(*moments, owner, [&](size_t, const std::string&, const at::Tensor& part, int64_t) {
      optimizer_file->tensors.write_part(part);
    });

  // Every writer's two files, with their sizes and checksums, for device 0's completion marker.
  std::vector<int64_t> written(4, 0);
  if (writes) {
    const checkpoint::CheckpointFile w = weights_file->commit(), o = optimizer_file->commit();
    written = {static_cast<int64_t>(w.bytes), w.crc32c, static_cast<int64_t>(o.bytes), o.crc32c};
  }
  std::vector<checkpoint::CheckpointFile> small_files;
  if (device == 0) {
    std::map<std::string, std::string> weight_map;
    uint64_t total_bytes = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      weight_map[shapes[i].first] = checkpoint::weights_file_name(owner(i), writers);
      int64_t numel = 1;
      for (int64_t d : shapes[i].second) numel *= d;
      total_bytes += static_cast<uint64_t>(numel) * sizeof(float);
    }
    small_files.push_back(checkpoint::write_hf_config(partial, model.model().config(), "float32"));
    small_files.push_back(checkpoint::write_hf_index(partial, weight_map, total_bytes));
    small_files.push_back(checkpoint::write_training_state(partial, state));
  }
  if (after_own_files) after_own_files();
  // Also the barrier: every device's files are on disk once every device has contributed.
  const at::Tensor all_written = world.allgather(at::tensor(written, at::kLong).view({1, 4}));
  if (device == 0) {
    std::vector<checkpoint::CheckpointFile> files = small_files;
    for (size_t k = 0; k < writers; ++k) {
      const at::Tensor row = all_written[static_cast<int64_t>(k)];
      files.push_back({checkpoint::weights_file_name(k, writers), static_cast<uint64_t>(row[0].item<int64_t>()),
                       static_cast<uint32_t>(row[1].item<int64_t>())});
      files.push_back({optimizer_file_name(k, writers), static_cast<uint64_t>(row[2].item<int64_t>()),
                       static_cast<uint32_t>(row[3].item<int64_t>())});
    }
    checkpoint::write_completion_marker(partial, files);
    checkpoint::publish_checkpoint(dir);
    log::info("saved checkpoint {}: {} tensors in {} weight and {} optimizer files written by {} devices", dir.string(),
              shapes.size(), writers, writers, writers);
  }
  world.barrier();  // published before anyone moves on (or removes an older one)
}

}  // namespace

void save_mesh_checkpoint(const fs::path& dir, runtime::DeviceContext& ctx, parallel::ParallelModel& model,
                          AdamW& optimizer, const checkpoint::TrainingState& state, const std::function<void()>& after_own_files) {
  try {
    write_mesh_checkpoint(dir, ctx, model, optimizer, state, after_own_files);
  } catch (const runtime::CollectiveError&) {
    throw;  // the consequence of a failure elsewhere: the device that failed removes the partial folder
  } catch (const std::exception& e) {
    checkpoint::abandon_partial_checkpoint(dir);
    throw Error(fmt::format("saving checkpoint {} failed: {} (its partial folder is removed; the newest complete "
                            "checkpoint is kept)", dir.string(), e.what()));
  }
}

void load_optimizer_state(const fs::path& dir, parallel::ParallelModel& model, AdamW& optimizer) {
  const model::CheckpointTensors moments = model::CheckpointTensors::listed_files_starting_with(dir, "optimizer-");
  model.load_shards(optimizer.exp_avg(), moments.source(".exp_avg"));
  model.load_shards(optimizer.exp_avg_sq(), moments.source(".exp_avg_sq"));
  optimizer.set_steps_taken(checkpoint::read_training_state(dir).step);
}

}  // namespace meshtrain::train
