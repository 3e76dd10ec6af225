// global_tensor.hpp — GlobalTensor: one device's view of a tensor with a global shape split over the mesh, carrying
// (global shape, mesh, partition spec, this device's shard). SPMD: every device thread holds one per global tensor.
//
// from_host_local, from_global, the shard bounds and the type string communicate nothing; gather, redistribute and
// check_replicas are collectives (what each moves: docs/sharding.md, "What communicates"), which every device of the
// group must call in the same order with the same specs, as SPMD code does.
#pragma once

#include "meshtrain/mesh/mesh.hpp"
#include "meshtrain/runtime/device_context.hpp"
#include "meshtrain/sharding/spec.hpp"

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

namespace meshtrain::sharding {

class GlobalTensor {
 public:
  // Wraps `shard` as `device`'s part of a global tensor; checks the spec and that the shard has the expected shape.
  GlobalTensor(const mesh::Mesh& mesh, int device, Shape global_shape, PartitionSpec spec, at::Tensor shard);

  // The device loader's step, JAX's make_array_from_process_local_data: `host_local` is what `device`'s host holds
  // (host_local_layout(mesh, global_shape, spec, host).shape()); the device's shard is copied out of it. No
  // communication. Hosts whose devices hold replicas must pass identical data (check_replicas verifies it).
  static GlobalTensor from_host_local(const mesh::Mesh& mesh, int device, const Shape& global_shape,
                                      const PartitionSpec& spec, const at::Tensor& host_local);
  // from_host_local where the caller computed the layout once (the data pipeline's read plan): `block` is the
  // device's shard_bounds, and it starts at `offset_in_host_local` in `host_local`. Error if it does not fit there,
  // or is not the device's block under `spec`.
  static GlobalTensor from_host_local_block(const mesh::Mesh& mesh, int device, const Shape& global_shape,
                                            const PartitionSpec& spec, const at::Tensor& host_local,
                                            const ShardBounds& block, const Shape& offset_in_host_local);
  // Every device holds the full tensor and keeps its shard (a copy). No communication.
  static GlobalTensor from_global(const mesh::Mesh& mesh, int device, const at::Tensor& full, const PartitionSpec& spec);

  const mesh::Mesh& mesh() const { return *mesh_; }
  int device() const { return device_; }
  const Shape& global_shape() const { return global_shape_; }
  const PartitionSpec& spec() const { return spec_; }
  const at::Tensor& local() const { return shard_; }
  c10::ScalarType dtype() const { return shard_.scalar_type(); }
  ShardBounds bounds() const { return shard_bounds(*mesh_, global_shape_, spec_, device_); }
  // "i32[8@(data,fsdp), 4096]"
  std::string type_string() const;
  // "device 3 (host 0, fsdp=3) holds [3:4, 0:4096]"
  std::string placement_string() const;

  // The full tensor on this device (partial axes summed). Communicates; `ctx` must be this device's context.
  at::Tensor gather(runtime::DeviceContext& ctx) const;
  // The same global tensor under `target` (see the header comment for what communicates).
  GlobalTensor redistribute(runtime::DeviceContext& ctx, const PartitionSpec& target) const;
  // Compares a hash of this shard with those of the devices that must hold the same data (the devices that differ
  // only along spec().replica_axes()); throws Error naming the devices that differ from the majority, on every
  // device of the group. Collective over the replica axes.
  void check_replicas(runtime::DeviceContext& ctx) const;

 private:
  void check_context(const runtime::DeviceContext& ctx, const char* operation) const;

  const mesh::Mesh* mesh_;
  int device_;
  Shape global_shape_;
  PartitionSpec spec_;
  at::Tensor shard_;
};

// A 64-bit hash of a tensor's bytes (contiguous row-major order) and its shape: cheap, for comparing replicas.
uint64_t shard_hash(const at::Tensor& tensor);

// Exercises global tensors across every device of a running job (the `commcheck` verb calls it on every device
// thread): builds from host-local data with zero collectives (checked with the counters), gathers back and compares
// with the expected global tensor, redistributes shard <-> replicate and partial -> replicate, and runs the replica
// check on consistent data and on a deliberately corrupted replica. Throws Error on any mismatch.
void check_global_tensors(runtime::DeviceContext& ctx);

}  // namespace meshtrain::sharding
