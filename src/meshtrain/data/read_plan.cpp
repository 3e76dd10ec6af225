// read_plan.cpp — the read plan from the host-local layout of the input batch: its rows, its sequence blocks (the
// load-balanced chunks of the context ranks of the host's devices) and the token ranges the host loader copies.
#include "meshtrain/data/read_plan.hpp"

#include "meshtrain/common/error.hpp"

#include <algorithm>
#include <numeric>

namespace meshtrain::data {
namespace {

bool names(const std::vector<mesh::Axis>& axes, mesh::Axis axis) {
  return std::find(axes.begin(), axes.end(), axis) != axes.end();
}

// UserError naming data.input_sharding unless the sequence dimension (the second) is whole or split over context.
void check_sequence_axes(const sharding::PartitionSpec& spec) {
  if (spec.rank() < 2) return;
  const std::vector<mesh::Axis>& axes = spec.dims[1];
  MT_USER_CHECK(axes.empty() || axes == std::vector<mesh::Axis>{mesh::Axis::context},
                "data.input_sharding={}: the sequence dimension may be split over context only, not over {} "
                "(sequence sharding is context parallelism); use \"(data,fsdp),context\" or \"(data,fsdp),None\"",
                spec.to_string(), mesh::axes_label(axes));
}

// The natural token ranges of a row that context rank `rank` of `context` holds, in load-balanced order.
std::vector<mesh::TokenRange> chunks_of(int64_t block_size, int context, int rank) {
  if (context == 1) return {{0, block_size}};
  return mesh::MeshRoles::context_chunks(block_size, context, rank);
}

}  // namespace

sharding::PartitionSpec input_sharding(const std::string& text, const mesh::Mesh& mesh) {
  sharding::PartitionSpec spec;
  try {
    spec = sharding::PartitionSpec::parse(text);
  } catch (const UserError& e) {
    throw UserError(fmt::format("data.input_sharding=\"{}\": {}", text, e.what()));
  }
  auto named = [&](mesh::Axis axis) {
    return std::any_of(spec.dims.begin(), spec.dims.end(), [&](const auto& axes) { return names(axes, axis); });
  };
  // Split experts split the batch too (mesh_roles.hpp): the rows go over expert unless the spec places it.
  const mesh::MeshRoles roles(mesh);
  if (roles.experts_split() && !spec.dims.empty() && !named(mesh::Axis::expert))
    spec.dims[0].push_back(mesh::Axis::expert);
  // Context splits each row's tokens: the sequence goes over context unless the spec places it.
  if (roles.context_split() && spec.rank() >= 2 && spec.dims[1].empty() && !named(mesh::Axis::context))
    spec.dims[1].push_back(mesh::Axis::context);
  check_sequence_axes(spec);
  return spec;
}

int64_t SequenceBlock::size() const {
  int64_t tokens = 0;
  for (const mesh::TokenRange& chunk : chunks) tokens += chunk.size();
  return tokens;
}

std::vector<int64_t> DeviceTile::rows() const {
  std::vector<int64_t> rows(count);
  std::iota(rows.begin(), rows.end(), begin);
  return rows;
}

sharding::ShardBounds DeviceTile::bounds() const { return {{begin, sequence.begin}, {count, sequence.size()}}; }

sharding::Shape DeviceTile::local_offset() const { return {local_begin, sequence.local_begin}; }

ReadPlan ReadPlan::make(const mesh::Mesh& mesh, int64_t global_batch_size, int64_t block_size,
                        const sharding::PartitionSpec& spec, int host) {
  MT_USER_CHECK(spec.rank() == 2 && spec.partial.empty(),
                "data.input_sharding={}: the input batch [global_batch_size, block_size] needs a 2-D spec that is not "
                "partial (e.g. \"(data,fsdp),None\", or \"(data,fsdp),context\" for context parallelism)",
                spec.to_string());
  check_sequence_axes(spec);
  mesh::MeshRoles(mesh).row_replicas(spec.dims[0]);  // UserError when the rows go over tensor or context
  const int ways = mesh.size_along(spec.dims[0]);
  MT_USER_CHECK(global_batch_size % ways == 0,
                "global_batch_size={} is not divisible by the {} row blocks of data.input_sharding={} on this mesh "
                "({} = {}); use a multiple of {}", global_batch_size, ways, spec.to_string(),
                mesh::axes_label(spec.dims[0]), ways, ways);
  ReadPlan plan;
  plan.host = host;
  plan.block_size = block_size;
  plan.context = mesh.size_along(spec.dims[1]);
  chunks_of(block_size, plan.context, 0);  // UserError naming block_size unless it splits into 2C chunks
  const sharding::Shape shape = {global_batch_size, block_size};
  const sharding::HostLocalLayout layout = sharding::host_local_layout(mesh, shape, spec, host);
  plan.rows = layout.global_indices(0);
  const int64_t block = layout.block_shape[1];
  for (int64_t rank : layout.block_indices[1]) {
    const int64_t local_begin = static_cast<int64_t>(plan.sequence.size()) * block;
    plan.sequence.push_back({static_cast<int>(rank), chunks_of(block_size, plan.context, static_cast<int>(rank)),
                             rank * block, local_begin});
    int64_t at = local_begin;
    for (const mesh::TokenRange& chunk : plan.sequence.back().chunks) {
      if (!plan.pieces.empty() && plan.pieces.back().range.end == chunk.begin &&
          plan.pieces.back().local_begin + plan.pieces.back().range.size() == at)
        plan.pieces.back().range.end = chunk.end;  // continues the previous range in both orders
      else
        plan.pieces.push_back({chunk, at});
      at += chunk.size();
    }
  }
  for (int device : mesh.devices_of_host(host)) {
    const sharding::ShardBounds bounds = sharding::shard_bounds(mesh, shape, spec, device);
    const sharding::Shape local = layout.local_offset(bounds);
    plan.devices.push_back({device, bounds.offset[0], bounds.shape[0], local[0], plan.sequence.at(local[1] / block)});
  }
  plan.minibatch = int64_t{ways} * plan.context == mesh.num_devices();
  return plan;
}

std::vector<mesh::TokenRange> ReadPlan::token_ranges() const {
  std::vector<mesh::TokenRange> ranges;
  for (const SequenceBlock& block : sequence) ranges.insert(ranges.end(), block.chunks.begin(), block.chunks.end());
  std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) { return a.begin < b.begin; });
  std::vector<mesh::TokenRange> merged;
  for (const mesh::TokenRange& range : ranges) {
    if (!merged.empty() && merged.back().end == range.begin)
      merged.back().end = range.end;
    else
      merged.push_back(range);
  }
  return merged;
}

int64_t ReadPlan::local_tokens() const {
  int64_t tokens = 0;
  for (const SequenceBlock& block : sequence) tokens += block.size();
  return tokens;
}

std::string ReadPlan::summary(int64_t global_batch_size) const {
  std::string text = fmt::format("host {} reads rows {} of {}", host, rows_string(rows), global_batch_size);
  if (sequence_split())
    text += fmt::format(", tokens [{}] of {} in load-balanced order", sharding::ranges_string(token_ranges()),
                        block_size);
  for (size_t i = 0; i < devices.size(); ++i) {
    text += fmt::format("{} device {} holds rows {}", i == 0 ? ";" : ",", devices[i].device,
                        sharding::range_string(devices[i].begin, devices[i].count));
    if (sequence_split()) text += fmt::format(" x tokens [{}]", sharding::ranges_string(devices[i].sequence.chunks));
  }
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
