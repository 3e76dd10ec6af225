// plan_command.cpp — `meshtrain plan`: the mesh and device assignment of a job, without starting anything.
#include "meshtrain/cli/commands.hpp"
#include "meshtrain/cli/job_options.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/mesh/mesh_config.hpp"
#include "meshtrain/sharding/visualize.hpp"

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

}  // namespace

int plan_command(int argc, char** argv) {
  CLI::App app{"Print the mesh and the device assignment of a job without starting it.", "meshtrain plan"};
  int hosts = 1, devices_per_host = 1;
  bool as_json = false;
  std::string config_dir;
  std::vector<std::string> overrides;
  app.add_option("--hosts", hosts, "hosts in the job")->capture_default_str();
  app.add_option("--devices-per-host", devices_per_host, "devices per host")->capture_default_str();
  app.add_flag("--json", as_json, "print one JSON object");
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
  config::Config config =
      config::Config::load(
      config_dir.empty() ? config::default_config_dir() : std::filesystem::path(config_dir), overrides);
  mesh::Mesh mesh = mesh::mesh_from_config(config, hosts, devices_per_host);
  if (as_json) {
    std::cout << nlohmann::json{{"mesh", mesh_json(mesh)}}.dump() << "\n";
    return 0;
  }
  std::cout << "Logical mesh shape: " << mesh.shape_string() << "\n"
            << "Logical mesh device assignments: " << mesh.assignments_string() << "\n"
            << "ici_mesh " << mesh.ici().equation() << " per slice, dcn_mesh " << mesh.dcn().equation()
            << " slices, " << mesh.hosts() << " hosts x " << mesh.devices_per_host() << " devices per host\n\n"
            << mesh.device_table();
  if (show_sharding) {
    const sharding::PictureOptions picture{sharding::wants_color(STDOUT_FILENO)};
    std::cout << "\n"
              << sharding::render_input_batch(mesh, config.get_int("global_batch_size"), config.get_int("block_size"),
                                              picture);
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
