// mesh_config.hpp — the mesh of a run from its config (ici_mesh.*, dcn_mesh.*) and its device count.
#pragma once

#include "meshtrain/config/config.hpp"
#include "meshtrain/mesh/mesh.hpp"

namespace meshtrain::mesh {

// Reads `<prefix>.data`, `<prefix>.fsdp`, ... (prefix "ici_mesh" or "dcn_mesh").
AxisSizes axis_sizes_from_config(const config::Config& config, const std::string& prefix);

Mesh mesh_from_config(const config::Config& config, int hosts, int devices_per_host);

}  // namespace meshtrain::mesh
