// mesh_config.cpp — ici_mesh/dcn_mesh config keys to a validated Mesh.
#include "meshtrain/mesh/mesh_config.hpp"

namespace meshtrain::mesh {

AxisSizes axis_sizes_from_config(const config::Config& config, const std::string& prefix) {
  AxisSizes sizes;
  for (Axis a : kAllAxes) sizes[a] = static_cast<int>(config.get_int(prefix + "." + std::string(axis_name(a))));
  return sizes;
}

Mesh mesh_from_config(const config::Config& config, int hosts, int devices_per_host) {
  return Mesh::create(axis_sizes_from_config(config, "ici_mesh"), axis_sizes_from_config(config, "dcn_mesh"), hosts,
                      devices_per_host);
}

}  // namespace meshtrain::mesh
