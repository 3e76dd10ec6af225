// plan_command.cpp — `meshtrain plan`: the mesh and device assignment of a job, and which samples, rows and token
// ranges each host and device reads at a given step, without starting anything.
#include "meshtrain/cli/commands.hpp"
#include "meshtrain/cli/job_options.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/common/host_memory.hpp"
#include "meshtrain/config/llama_config.hpp"
#include "meshtrain/data/dataset.hpp"
#include "meshtrain/data/pipeline.hpp"
#include "meshtrain/data/read_plan.hpp"
#include "meshtrain/settings/settings.hpp"
#include "meshtrain/sharding/visualize.hpp"
#include "meshtrain/parallel/pipeline_schedule.hpp"
#include "meshtrain/train/memory_plan.hpp"

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <iostream>

namespace meshtrain::cli {
namespace {

nlohmann::json mesh_json(const mesh::Mesh& mesh) {
  nlohmann::json axes = nlohmann::json::array(), shape = nlohmann::json::array(), devices = nlohmann::json::array();
  for (mesh::Axis a : mesh::kAllAxes) {
    axes.push_back(std::string(mesh::axis_name(a)));
    shape.push_back(mesh.size(a));
  }
  for (const mesh::DeviceInfo& d : mesh.devices()) {
    nlohmann::json coords = nlohmann::json::object();
    for (mesh::Axis a : mesh::kAllAxes) coords[std::string(mesh::axis_name(a))] = d.coords[static_cast<int>(a)];
    devices.push_back({{"device", d.device}, {"host", d.host}, {"local", d.local}, {"slice", d.slice},
                       {"coords", coords}});
  }
  return {{"axes", axes}, {"shape", shape}, {"ici_shape", mesh.ici().sizes}, {"dcn_shape", mesh.dcn().sizes},
          {"device_assignments", mesh.device_ids_in_mesh_order()}, {"devices", devices}};
}

// What the job reads at global step `global_step` (counted from the start of training, over epochs).
struct StepPlan {
  data::DataCursor cursor;
  int64_t batches_per_epoch = 0;
  std::vector<int64_t> global_batch;  // sample id of every global row
  std::vector<data::ReadPlan> hosts;
  sharding::PartitionSpec spec;  // of the input batch
};

StepPlan step_plan(const settings::Settings& settings, const mesh::Mesh& mesh, int64_t global_step) {
  MT_USER_CHECK(global_step >= 0, "--step must be 0 or more, got {}", global_step);
  const int64_t global_batch_size = settings.global_batch_size, block_size = settings.block_size;
  // The index is enough for the sample count: no need to read every byte for a CRC.
  const data::TokenDataset dataset(data::TokenDataset::resolve(settings.data.dataset_path), block_size,
                                   token_shards::PayloadCheck::never);
  const data::GlobalSampler sampler = data::sampler_for(settings, dataset, data::DataPipeline::Purpose::training);
  const sharding::PartitionSpec spec = data::input_sharding(settings.data.input_sharding, mesh);
  StepPlan plan;
  plan.batches_per_epoch = sampler.batches_per_epoch();
  plan.cursor = {global_step / plan.batches_per_epoch, global_step % plan.batches_per_epoch};
  plan.global_batch = sampler.global_batch(plan.cursor.epoch, plan.cursor.step);
  plan.spec = spec;
  for (int host = 0; host < mesh.hosts(); ++host)
    plan.hosts.push_back(data::ReadPlan::make(mesh, global_batch_size, block_size, spec, host));
  return plan;
}

// [[begin, end], ...]
nlohmann::json ranges_json(const std::vector<mesh::TokenRange>& ranges) {
  nlohmann::json out = nlohmann::json::array();
  for (const mesh::TokenRange& range : ranges) out.push_back({range.begin, range.end});
  return out;
}

// With the sequence split over context, each host also names its token ranges of every row ("tokens", natural
// positions) and each device its context rank and chunks, in load-balanced order.
nlohmann::json data_json(const StepPlan& plan) {
  nlohmann::json hosts = nlohmann::json::array();
  const bool split = plan.hosts.front().sequence_split();
  for (const data::ReadPlan& host : plan.hosts) {
    nlohmann::json devices = nlohmann::json::array();
    for (const data::DeviceTile& device : host.devices) {
      devices.push_back({{"device", device.device}, {"rows", device.rows()}});
      if (split) {
        devices.back()["context_rank"] = device.sequence.context_rank;
        devices.back()["tokens"] = ranges_json(device.sequence.chunks);
      }
    }
    hosts.push_back({{"host", host.host}, {"rows", host.rows}, {"devices", devices}});
    if (split) hosts.back()["tokens"] = ranges_json(host.token_ranges());
  }
  nlohmann::json data = {{"epoch", plan.cursor.epoch}, {"step", plan.cursor.step},
                         {"global_batch", plan.global_batch}, {"hosts", hosts}};
  if (split)
    data["sequence"] = {{"context", plan.hosts.front().context}, {"order", "load-balanced"},
                        {"type", sharding::type_string(at::kInt, {static_cast<int64_t>(plan.global_batch.size()),
                                                                  plan.hosts.front().block_size}, plan.spec)}};
  return data;
}

// "17, 3, 99" for the sample ids of `rows`.
std::string samples_of(const StepPlan& plan, const std::vector<int64_t>& rows) {
  std::vector<int64_t> ids;
  for (int64_t row : rows) ids.push_back(plan.global_batch[row]);
  return fmt::format("{}", fmt::join(ids, ", "));
}

void print_data_plan(const StepPlan& plan, const mesh::Mesh& mesh, const settings::Settings& settings,
                     int64_t global_step) {
  const data::ReadPlan& first = plan.hosts.front();
  const std::string type =
      first.sequence_split()
          ? sharding::type_string(at::kInt, {settings.global_batch_size, settings.block_size}, plan.spec)
          : fmt::format("i32[{}, {}]", settings.global_batch_size, settings.block_size);
  std::cout << "Data at step " << global_step << " = epoch " << plan.cursor.epoch << " step " << plan.cursor.step
            << " (" << plan.batches_per_epoch << " global batches per epoch): input_ids/labels " << type << ", "
            << "data.input_sharding=" << settings.data.input_sharding
            << "; Minibatch dataloading: " << (first.minibatch ? "True" : "False") << "\n";
  if (first.sequence_split())
    std::cout << "  sequence over context in load-balanced order: context rank r holds chunks r and "
              << 2 * first.context - 1 << "-r of the " << 2 * first.context << " chunks of each row (a host reads "
              << "the token after each of its ranges too, for the labels)\n";
  std::cout << "  global batch: samples " << fmt::format("{}", fmt::join(plan.global_batch, ", ")) << "\n";
  for (const data::ReadPlan& host : plan.hosts) {
    std::cout << "  host " << host.host << " reads rows " << data::rows_string(host.rows);
    if (host.sequence_split()) std::cout << " x tokens [" << sharding::ranges_string(host.token_ranges()) << "]";
    std::cout << " (samples " << samples_of(plan, host.rows) << ")\n";
    for (const data::DeviceTile& device : host.devices) {
      std::cout << "    device " << device.device << " (" << mesh.coords_string(device.device) << ") holds rows "
                << sharding::range_string(device.begin, device.count);
      if (host.sequence_split())
        std::cout << " x tokens [" << sharding::ranges_string(device.sequence.chunks) << "]";
      std::cout << " (samples " << samples_of(plan, device.rows()) << ")\n";
    }
  }
}

// The memory plan of the job (train/memory_plan.hpp) and whether it fits this machine.
nlohmann::json memory_json(const settings::Settings& settings, const mesh::Mesh& mesh) {
  const train::MemoryPlan plan = train::plan_memory(
      settings, train::memory_layout(settings, mesh, data::input_sharding(settings.data.input_sharding, mesh)));
  const MemoryAvailable available = available_memory();
  std::string verdict = "fits";
  try {
    train::check_memory_fits(settings, plan, available);
  } catch (const UserError& e) {
    verdict = e.what();
  }
  const train::DeviceMemory& d = plan.device;
  return {{"model_parameters", settings.model.parameter_count()},
          {"per_device", {{"parameters", d.parameters}, {"gradients", d.gradients}, {"optimizer", d.optimizer},
                          {"gathered", d.gathered}, {"activations", d.activations}, {"logits", d.logits},
                          {"total", d.total()}}},
          {"rows_per_device", plan.layout.rows_per_device}, {"devices_per_host", plan.layout.devices_per_host},
          {"process", train::kProcessBytes}, {"per_host", plan.host_total()}, {"describe", plan.describe()},
          {"available", available.bytes}, {"available_source", available.source}, {"verdict", verdict}};
}

// The pipeline's stages and schedule timeline (parallel/pipeline_schedule.hpp); none without a pipeline.
std::vector<std::string> pipeline_lines(const settings::Settings& settings, const mesh::Mesh& mesh) {
  const int64_t rows = train::memory_layout(settings, mesh, data::input_sharding(settings.data.input_sharding, mesh))
                           .rows_per_device;
  return parallel::describe_pipeline(settings, mesh, rows / settings.gradient_accumulation_steps);
}

}  // namespace

int plan_command(int argc, char** argv) {
  CLI::App app{"Print the mesh, the device assignment and which samples and rows each host and device reads at a step, "
               "without starting the job.", "meshtrain plan"};
  int hosts = 1, devices_per_host = 1;
  bool as_json = false;
  std::string config_dir;
  std::vector<std::string> overrides;
  app.add_option("--hosts", hosts, "hosts in the job")->capture_default_str();
  app.add_option("--devices-per-host", devices_per_host, "devices per host")->capture_default_str();
  app.add_flag("--json", as_json, "print one JSON object");
  bool show_memory = false;
  app.add_flag("--memory", show_memory,
               "print the memory plan per device and per host (and whether it fits this machine) instead of the data "
               "plan; needs no dataset");
  int64_t global_step = 0;
  app.add_option("--step", global_step, "the training step whose samples and rows to show (counted over epochs)")
      ->capture_default_str();
  bool show_sharding = false;
  std::string shape_text, spec_text;
  app.add_flag("--show-sharding", show_sharding, "draw which device holds which part of the input batch");
  app.add_option("--shape", shape_text, "with --show-sharding, also draw a tensor of this global shape, e.g. 8,4096");
  app.add_option("--spec", spec_text, "the partition spec of --shape, e.g. \"(data,fsdp),None\" (default: whole)");
  app.add_option("--config-dir", config_dir, "folder with defaults.yaml and config groups");
  app.add_option("overrides", overrides, "config overrides: key=value, group=name");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  const settings::Settings settings = settings::Settings::from_config(config::Config::load(
      config_dir.empty() ? config::default_config_dir() : std::filesystem::path(config_dir), overrides));
  mesh::Mesh mesh = mesh::Mesh::create(settings.mesh.ici, settings.mesh.dcn, hosts, devices_per_host);
  if (show_memory) {
    const nlohmann::json memory = memory_json(settings, mesh);
    if (as_json) {
      std::cout << nlohmann::json{{"mesh", mesh_json(mesh)}, {"memory", memory}}.dump() << "\n";
      return 0;
    }
    std::cout << "Logical mesh shape: " << mesh.shape_string() << "\n"
              << "Model: " << memory["model_parameters"].get<int64_t>() << " parameters ("
              << settings.model.num_hidden_layers << " layers x " << settings.model.hidden_size << " hidden, vocab "
              << settings.model.vocab_size << "); global batch " << settings.global_batch_size << " x "
              << settings.block_size << ", " << mesh.hosts()
              << " hosts x " << mesh.devices_per_host()
              << " devices per host\n"
              << "Memory plan: " << memory["describe"].get<std::string>() << "\n"
              << "This machine: " << gigabytes(memory["available"].get<int64_t>()) << " available ("
              << memory["available_source"].get<std::string>() << "): " << memory["verdict"].get<std::string>()
              << "\n";
    return 0;
  }
  const StepPlan plan = step_plan(settings, mesh, global_step);
  if (as_json) {
    nlohmann::json out{{"mesh", mesh_json(mesh)}, {"data", data_json(plan)}};
    if (mesh.size(mesh::Axis::pipeline) > 1) out["pipeline"] = pipeline_lines(settings, mesh);
    std::cout << out.dump() << "\n";
    return 0;
  }
  std::cout << "Logical mesh shape: " << mesh.shape_string() << "\n"
            << "Logical mesh device assignments: " << mesh.assignments_string() << "\n"
            << "ici_mesh " << mesh.ici().equation() << " per slice, dcn_mesh " << mesh.dcn().equation()
            << " slices, " << mesh.hosts() << " hosts x " << mesh.devices_per_host() << " devices per host\n\n"
            << mesh.device_table() << "\n";
  for (const std::string& line : pipeline_lines(settings, mesh)) std::cout << line << "\n";
  print_data_plan(plan, mesh, settings, global_step);
  if (show_sharding) {
    const sharding::PictureOptions picture{sharding::wants_color(STDOUT_FILENO)};
    std::cout << "\n"
              << sharding::render_input_batch(mesh, settings.global_batch_size, settings.block_size, picture,
                                              data::input_sharding(settings.data.input_sharding, mesh));
    const config::LlamaConfig& model_config = settings.model;
    if (model_config.is_moe()) {
      // One layer's w1 of every expert, stacked: experts over `expert`, each expert's rows over `tensor` (and each
      // device's block then cut flat over `fsdp` by its FSDP unit).
      const sharding::Shape experts_shape = {model_config.num_local_experts, model_config.intermediate_size,
                                             model_config.hidden_size};
      std::cout << "\nA layer's experts (block_sparse_moe.experts.*.w1 stacked; each device's block is further cut "
                   "flat over fsdp):\n"
                << sharding::render_sharding(mesh, "experts.w1", c10::ScalarType::Float, experts_shape,
                                             sharding::PartitionSpec::parse("expert, tensor, None"), picture);
    }
    MT_USER_CHECK(!shape_text.empty() || spec_text.empty(), "--spec needs --shape (the tensor it partitions)");
    if (!shape_text.empty()) {
      const sharding::Shape shape = sharding::parse_shape(shape_text);
      const sharding::PartitionSpec spec = spec_text.empty() ? sharding::PartitionSpec::replicated(static_cast<int>(shape.size()))
                                                             : sharding::PartitionSpec::parse(spec_text);
      std::cout << "\n" << sharding::render_sharding(mesh, "tensor", c10::ScalarType::Float, shape, spec, picture);
    }
  }
  return 0;
}

}  // namespace meshtrain::cli
