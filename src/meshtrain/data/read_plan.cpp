// read_plan.cpp — the read plan from the host-local layout of the input batch.
#include "meshtrain/data/read_plan.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/mesh/mesh_roles.hpp"

#include <algorithm>
#include <numeric>

namespace meshtrain::data {

sharding::PartitionSpec input_sharding(const std::string& text, const mesh::Mesh& mesh) {
  sharding::PartitionSpec spec;
  try {
    spec = sharding::PartitionSpec::parse(text);
  } catch (const UserError& e) {
    throw UserError(fmt::format("data.input_sharding=\"{}\": {}", text, e.what()));
  }
  // Split experts split the batch too (mesh_roles.hpp): the rows go over expert unless the spec places it.
  auto names_expert = [](const std::vector<mesh::Axis>& axes) {
    return std::find(axes.begin(), axes.end(), mesh::Axis::expert) != axes.end();
  };
  if (mesh::MeshRoles(mesh).experts_split() && !spec.dims.empty() &&
      std::none_of(spec.dims.begin(), spec.dims.end(), names_expert))
    spec.dims[0].push_back(mesh::Axis::expert);
  return spec;
}

std::vector<int64_t> DeviceRows::rows() const {
  std::vector<int64_t> rows(count);
  std::iota(rows.begin(), rows.end(), begin);
  return rows;
}

ReadPlan ReadPlan::make(const mesh::Mesh& mesh, int64_t global_batch_size, int64_t block_size,
                        const sharding::PartitionSpec& spec, int host) {
  MT_USER_CHECK(spec.rank() == 2 && spec.dims[1].empty() && spec.partial.empty(),
                "data.input_sharding={}: the input batch [global_batch_size, block_size] needs a 2-D spec that splits "
                "rows only (e.g. \"(data,fsdp),None\"); sequence sharding and partial specs are not supported",
                spec.to_string());
  const int ways = mesh.size_along(spec.dims[0]);
  MT_USER_CHECK(global_batch_size % ways == 0,
                "global_batch_size={} is not divisible by the {} row blocks of data.input_sharding={} on this mesh "
                "({} = {}); use a multiple of {}", global_batch_size, ways, spec.to_string(),
                mesh::axes_label(spec.dims[0]), ways, ways);
  const sharding::Shape shape = {global_batch_size, block_size};
  const sharding::HostLocalLayout layout = sharding::host_local_layout(mesh, shape, spec, host);
  ReadPlan plan;
  plan.host = host;
  plan.rows = layout.global_indices(0);
  for (int device : mesh.devices_of_host(host)) {
    const sharding::ShardBounds bounds = sharding::shard_bounds(mesh, shape, spec, device);
    plan.devices.push_back({device, bounds.offset[0], bounds.shape[0], layout.local_offset(bounds)[0]});
  }
  plan.minibatch = ways == mesh.num_devices();
  return plan;
}

std::string ReadPlan::summary(int64_t global_batch_size) const {
  std::string text = fmt::format("host {} reads rows {} of {}", host, rows_string(rows), global_batch_size);
  for (size_t i = 0; i < devices.size(); ++i)
    text += fmt::format("{} device {} holds rows {}", i == 0 ? ";" : ",", devices[i].device,
                        sharding::range_string(devices[i].begin, devices[i].count));
  return text;
}

std::string rows_string(const std::vector<int64_t>& rows) {
  std::string text;
  for (size_t i = 0; i < rows.size();) {
    size_t j = i + 1;
    while (j < rows.size() && rows[j] == rows[j - 1] + 1) ++j;
    text += (text.empty() ? "" : ", ") + sharding::range_string(rows[i], static_cast<int64_t>(j - i));
    i = j;
  }
  return text;
}

}  // namespace meshtrain::data
