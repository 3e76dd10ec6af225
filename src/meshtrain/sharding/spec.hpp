// spec.hpp — how a global tensor is split over the mesh: the partition spec, every device's shard bounds, what a
// host holds of it (its process-local data), and the one-line type string `i32[8@(data,fsdp), 4096]`.
//
// A PartitionSpec gives, per tensor dimension, the mesh axes the dimension is sharded over (outermost first; none
// means the dimension is whole on every device), and the axes over which the tensor is *partial*: devices that
// differ only along those axes hold addends of a pending sum (a loss before its all-reduce). Along a dimension
// sharded over axes A, device d holds block `mesh.index_along(d, A)` of `size / mesh.size_along(A)` indices. Devices
// that differ only along the axes the spec does not mention hold the same block: they are replicas.
#pragma once

#include "meshtrain/common/shape_text.hpp"
#include "meshtrain/mesh/mesh.hpp"
#include "meshtrain/mesh/mesh_roles.hpp"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain::sharding {

using Shape = std::vector<int64_t>;

struct PartitionSpec {
  std::vector<std::vector<mesh::Axis>> dims;  // per tensor dimension: the axes it is sharded over; empty: not sharded
  std::vector<mesh::Axis> partial;            // axes over which the shards are addends of a pending sum

  // Every dimension whole on every device.
  static PartitionSpec replicated(int rank);
  // Dimension 0 sharded over `axes`, the other `rank - 1` dimensions whole (a batch split over data parallelism).
  static PartitionSpec sharded_rows(int rank, const std::vector<mesh::Axis>& axes);
  // Parses "(data,fsdp),None" (one entry per dimension: an axis, "(a,b)" or "[a, b]" for several, "None"/"null"/"()"
  // for none; an outer "[...]" is allowed, so torchprime's "[[data, fsdp], null]" parses too). UserError naming the
  // entry otherwise.
  static PartitionSpec parse(const std::string& text);

  int rank() const { return static_cast<int>(dims.size()); }
  // The axes the spec shards over or is partial over; the rest are replica axes.
  std::vector<mesh::Axis> used_axes() const;
  // Axes not used by the spec, in mesh order: devices that differ only along them hold identical shards.
  std::vector<mesh::Axis> replica_axes() const;
  // "[(data,fsdp), None]", with " partial over tensor" appended when partial.
  std::string to_string() const;
  bool operator==(const PartitionSpec& other) const { return dims == other.dims && partial == other.partial; }
  bool operator!=(const PartitionSpec& other) const { return !(*this == other); }
};

// UserError unless `spec` fits `shape` on `mesh`: one entry per dimension, no axis used twice, and every sharded
// dimension divisible by the product of its axes (the message names the dimension, its size, the axes, the product).
void check_spec(const mesh::Mesh& mesh, const Shape& shape, const PartitionSpec& spec);

// The part of the global tensor one device holds: shard[i] = global[offset + i] per dimension.
struct ShardBounds {
  Shape offset;
  Shape shape;
  bool operator==(const ShardBounds& other) const { return offset == other.offset && shape == other.shape; }
};

// The shard of `device`; `spec` must have passed check_spec.
ShardBounds shard_bounds(const mesh::Mesh& mesh, const Shape& shape, const PartitionSpec& spec, int device);

// "0:4" (half-open index range [offset, offset + size)).
std::string range_string(int64_t offset, int64_t size);
// "0:1024, 7168:8192" (half-open token ranges, in the given order).
std::string ranges_string(const std::vector<mesh::TokenRange>& ranges);
// "[0:4, 0:4096]"
std::string bounds_string(const ShardBounds& bounds);

// What one host holds of a global tensor, JAX's process-local data: along each dimension, the distinct blocks the
// host's devices need, ascending, packed densely. A dimension no local device shards keeps its full size. The host
// reads exactly these indices (rows needed by several of its devices once), and each of its devices finds its shard
// at local_offset() in the buffer, so building the per-device shards needs no communication.
struct HostLocalLayout {
  Shape block_shape;                                // one device's shard shape
  std::vector<std::vector<int64_t>> block_indices;  // per dimension: the host's distinct block indices, ascending

  // The host-local buffer's shape.
  Shape shape() const;
  // Global index of every position along `dim` of the buffer (for dimension 0 of a batch: the rows to read).
  std::vector<int64_t> global_indices(int dim) const;
  // Where a shard of this host (given by its global bounds) starts in the buffer.
  Shape local_offset(const ShardBounds& bounds) const;
};

HostLocalLayout host_local_layout(const mesh::Mesh& mesh, const Shape& shape, const PartitionSpec& spec, int host);

// "f32", "bf16", "i32", ...: JAX's short dtype names.
std::string dtype_short_name(c10::ScalarType dtype);
// "i32[8@(data,fsdp), 4096]": the global shape with, per sharded dimension, "@" and its axes; a partial tensor ends
// with " partial over tensor". Scalars print as "f32[]".
std::string type_string(c10::ScalarType dtype, const Shape& shape, const PartitionSpec& spec);

// Parses "8,4096" or "[8, 4096]" into a shape (UserError naming the entry otherwise).
Shape parse_shape(const std::string& text);

}  // namespace meshtrain::sharding
