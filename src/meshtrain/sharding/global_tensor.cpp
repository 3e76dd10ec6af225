// global_tensor.cpp — building shards without communication, gather, redistribution, replica hashes, and the
// multi-device self-check that the `commcheck` verb runs.
#include "meshtrain/sharding/global_tensor.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/common/log.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>

namespace meshtrain::sharding {
namespace {

using mesh::Axis;

// `tensor` narrowed to `bounds`, where `tensor` itself covers the global region starting at `origin`.
at::Tensor narrow_to(at::Tensor tensor, const Shape& origin, const ShardBounds& bounds) {
  for (size_t d = 0; d < bounds.shape.size(); ++d)
    tensor = tensor.narrow(static_cast<int64_t>(d), bounds.offset[d] - origin[d], bounds.shape[d]);
  return tensor;
}

// The axes of `axes` that are not in `removed`, in order.
std::vector<Axis> axes_without(const std::vector<Axis>& axes, const std::vector<Axis>& removed) {
  std::vector<Axis> rest;
  for (Axis axis : axes)
    if (std::find(removed.begin(), removed.end(), axis) == removed.end()) rest.push_back(axis);
  return rest;
}

bool starts_with(const std::vector<Axis>& axes, const std::vector<Axis>& prefix) {
  return prefix.size() <= axes.size() && std::equal(prefix.begin(), prefix.end(), axes.begin());
}

int64_t tensor_bytes(const at::Tensor& tensor) { return tensor.numel() * static_cast<int64_t>(tensor.element_size()); }

// Sums `tensor` over the devices along `axes` (a copy; the input is left alone). Returns the bytes this device
// receives in a ring all-reduce, for the logs.
at::Tensor sum_over(runtime::DeviceContext& ctx, const at::Tensor& tensor, const std::vector<Axis>& axes,
                    int64_t& bytes_received) {
  at::Tensor sum = tensor.clone(at::MemoryFormat::Contiguous);
  const int n = ctx.mesh().size_along(axes);
  if (n == 1) return sum;
  ctx.over(axes).allreduce_sum(sum);
  bytes_received += 2 * (n - 1) * tensor_bytes(sum) / n;
  return sum;
}

// Concatenates the devices' `tensor` along dimension `dim` over `axes`, in the order of their index along the axes.
at::Tensor concat_over(runtime::DeviceContext& ctx, const at::Tensor& tensor, int64_t dim,
                       const std::vector<Axis>& axes, int64_t& bytes_received) {
  const int n = ctx.mesh().size_along(axes);
  if (n == 1) return tensor;
  at::Tensor gathered = ctx.over(axes).allgather(tensor.movedim(dim, 0).contiguous());
  bytes_received += (n - 1) * tensor_bytes(tensor);
  return gathered.movedim(0, dim);
}

}  // namespace

GlobalTensor::GlobalTensor(const mesh::Mesh& mesh, int device, Shape global_shape, PartitionSpec spec,
                           at::Tensor shard)
    : mesh_(&mesh), device_(device), global_shape_(std::move(global_shape)), spec_(std::move(spec)),
      shard_(std::move(shard)) {
  check_spec(mesh, global_shape_, spec_);
  const Shape expected = bounds().shape;
  MT_CHECK(shard_.sizes().vec() == expected, "device {}'s shard of {} has shape {}, expected {}", device_,
           type_string(), shape_text(shard_.sizes().vec()), shape_text(expected));
}

GlobalTensor GlobalTensor::from_host_local(const mesh::Mesh& mesh, int device, const Shape& global_shape,
                                           const PartitionSpec& spec, const at::Tensor& host_local) {
  const int host = mesh.device(device).host;
  const HostLocalLayout layout = host_local_layout(mesh, global_shape, spec, host);
  MT_USER_CHECK(host_local.sizes().vec() == layout.shape(),
                "host {}'s local data for {} has shape {}, expected {} (the blocks of the global tensor its devices "
                "hold)", host, sharding::type_string(host_local.scalar_type(), global_shape, spec),
                shape_text(host_local.sizes().vec()), shape_text(layout.shape()));
  const ShardBounds bounds = shard_bounds(mesh, global_shape, spec, device);
  return from_host_local_block(mesh, device, global_shape, spec, host_local, bounds, layout.local_offset(bounds));
}

GlobalTensor GlobalTensor::from_host_local_block(const mesh::Mesh& mesh, int device, const Shape& global_shape,
                                                 const PartitionSpec& spec, const at::Tensor& host_local,
                                                 const ShardBounds& block, const Shape& offset_in_host_local) {
  const ShardBounds in_buffer{offset_in_host_local, block.shape};
  bool fits = host_local.dim() == static_cast<int64_t>(block.shape.size());
  for (size_t d = 0; fits && d < block.shape.size(); ++d)
    fits = in_buffer.offset[d] >= 0 &&
           in_buffer.offset[d] + in_buffer.shape[d] <= host_local.size(static_cast<int64_t>(d));
  MT_CHECK(fits, "device {}'s block {} at {} does not fit in the host-local data of shape {}", device,
           shape_text(block.shape), shape_text(offset_in_host_local), shape_text(host_local.sizes().vec()));
  const at::Tensor shard = narrow_to(host_local, Shape(global_shape.size(), 0), in_buffer);
  GlobalTensor out(mesh, device, global_shape, spec, shard.clone(at::MemoryFormat::Contiguous));
  MT_CHECK(out.bounds() == block, "device {}'s block starts at {}, but {} places it at {}", device,
           shape_text(block.offset), out.type_string(), shape_text(out.bounds().offset));
  return out;
}

GlobalTensor GlobalTensor::from_global(const mesh::Mesh& mesh, int device, const at::Tensor& full,
                                       const PartitionSpec& spec) {
  const Shape shape = full.sizes().vec();
  check_spec(mesh, shape, spec);
  const at::Tensor shard = narrow_to(full, Shape(shape.size(), 0), shard_bounds(mesh, shape, spec, device));
  return GlobalTensor(mesh, device, shape, spec, shard.clone(at::MemoryFormat::Contiguous));
}

std::string GlobalTensor::type_string() const { return sharding::type_string(dtype(), global_shape_, spec_); }

std::string GlobalTensor::placement_string() const {
  const mesh::DeviceInfo& info = mesh_->device(device_);
  std::string coords;
  for (Axis axis : mesh::kAllAxes)
    if (mesh_->size(axis) > 1)
      coords += fmt::format(", {}={}", mesh::axis_name(axis), info.coords[static_cast<int>(axis)]);
  return fmt::format("device {} (host {}{}) holds {}", device_, info.host, coords, bounds_string(bounds()));
}

void GlobalTensor::check_context(const runtime::DeviceContext& ctx, const char* operation) const {
  MT_CHECK(ctx.device() == device_ && ctx.mesh().num_devices() == mesh_->num_devices(),
           "{} of {}: the tensor belongs to device {} but was called from device {}'s context", operation,
           type_string(), device_, ctx.device());
}

at::Tensor GlobalTensor::gather(runtime::DeviceContext& ctx) const {
  check_context(ctx, "gather");
  int64_t bytes_received = 0;
  at::Tensor full = spec_.partial.empty() ? shard_ : sum_over(ctx, shard_, spec_.partial, bytes_received);
  for (size_t d = 0; d < global_shape_.size(); ++d)
    full = concat_over(ctx, full, static_cast<int64_t>(d), spec_.dims[d], bytes_received);
  log::debug("gather {} on device {}: {} bytes received (communication)", type_string(), device_, bytes_received);
  return full.clone(at::MemoryFormat::Contiguous);
}

GlobalTensor GlobalTensor::redistribute(runtime::DeviceContext& ctx, const PartitionSpec& target) const {
  check_context(ctx, "redistribute");
  check_spec(*mesh_, global_shape_, target);
  int64_t bytes_received = 0;
  // Pending sums the target does not keep are completed first (an all-reduce over those axes).
  const std::vector<Axis> summed = axes_without(spec_.partial, target.partial);
  at::Tensor local = summed.empty() ? shard_ : sum_over(ctx, shard_, summed, bytes_received);
  // Along each dimension the new shard lies inside the old one exactly when the old axes are a prefix of the new
  // ones; otherwise the dimension is gathered whole first.
  ShardBounds held = bounds();
  for (size_t d = 0; d < global_shape_.size(); ++d) {
    if (starts_with(target.dims[d], spec_.dims[d])) continue;
    local = concat_over(ctx, local, static_cast<int64_t>(d), spec_.dims[d], bytes_received);
    held.offset[d] = 0;
    held.shape[d] = global_shape_[d];
  }
  local = narrow_to(local, held.offset, shard_bounds(*mesh_, global_shape_, target, device_));
  // A new pending sum over axes: the device at index 0 along them keeps the value, the others hold zeros.
  const std::vector<Axis> new_partial = axes_without(target.partial, spec_.partial);
  if (mesh_->index_along(device_, new_partial) != 0) local = at::zeros_like(local);
  log::debug("redistribute {} -> {} on device {}: {} bytes received", type_string(),
             sharding::type_string(dtype(), global_shape_, target), device_, bytes_received);
  return GlobalTensor(*mesh_, device_, global_shape_, target, local.clone(at::MemoryFormat::Contiguous));
}

void GlobalTensor::check_replicas(runtime::DeviceContext& ctx) const {
  check_context(ctx, "check_replicas");
  const std::vector<Axis> axes = spec_.replica_axes();
  if (mesh_->size_along(axes) == 1) return;
  const at::Tensor mine = at::full({1}, static_cast<int64_t>(shard_hash(shard_)), at::kLong);
  const at::Tensor hashes = ctx.over(axes).allgather(mine);
  const std::vector<int> members = mesh_->group_of(device_, axes);
  std::map<int64_t, std::vector<int>> devices_by_hash;
  for (size_t i = 0; i < members.size(); ++i) devices_by_hash[hashes[i].item<int64_t>()].push_back(members[i]);
  if (devices_by_hash.size() == 1) return;

  // The majority hash is taken as the reference (ties: the one held by the group's first device).
  auto reference = devices_by_hash.find(hashes[0].item<int64_t>());
  for (auto it = devices_by_hash.begin(); it != devices_by_hash.end(); ++it)
    if (it->second.size() > reference->second.size()) reference = it;
  auto describe = [&](const std::vector<int>& devices) {
    std::string out;
    for (int d : devices) out += fmt::format("{}{} (host {})", out.empty() ? "" : ", ", d, mesh_->device(d).host);
    return out;
  };
  std::string differing;
  for (const auto& [hash, devices] : devices_by_hash)
    if (hash != reference->first)
      differing += fmt::format("{}devices {} hash {:016x}", differing.empty() ? "" : "; ", describe(devices),
                               static_cast<uint64_t>(hash));
  throw Error(fmt::format(
      "replica check failed for {} shard {}: the devices along {} must hold identical data; differing: {}; "
      "majority: devices {} hash {:016x}", type_string(), bounds_string(bounds()), mesh::axes_label(axes), differing,
      describe(reference->second), static_cast<uint64_t>(reference->first)));
}

uint64_t shard_hash(const at::Tensor& tensor) {
  const at::Tensor bytes = tensor.contiguous();
  const auto* data = static_cast<const unsigned char*>(bytes.data_ptr());
  const size_t size = static_cast<size_t>(tensor_bytes(bytes));
  constexpr uint64_t kMultiplier = 0x9E3779B97F4A7C15ull;
  uint64_t hash = 0xCBF29CE484222325ull;
  auto mix = [&](uint64_t word) {
    hash ^= word;
    hash *= kMultiplier;
    hash ^= hash >> 29;
  };
  for (int64_t size_d : tensor.sizes()) mix(static_cast<uint64_t>(size_d));
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t word;
    std::memcpy(&word, data + i, 8);
    mix(word);
  }
  uint64_t tail = 0;
  if (size > i) std::memcpy(&tail, data + i, size - i);  // `data` may be null when size is 0
  mix(tail ^ (static_cast<uint64_t>(size - i) << 56));
  return hash;
}

void check_global_tensors(runtime::DeviceContext& ctx) {
  const mesh::Mesh& mesh = ctx.mesh();
  const int device = ctx.device();
  const int n = mesh.num_devices();
  // Every dimension divides by the whole mesh, so any spec below fits any mesh.
  const Shape shape{2 * n, n, 3};
  const at::Tensor expected = at::arange(2 * n * n * 3, at::kInt).reshape(shape);
  auto check_equal = [&](const at::Tensor& got, const at::Tensor& want, const std::string& what) {
    if (!at::equal(got, want))
      throw Error(fmt::format("global tensor check on device {}: {} differs from the expected values", device, what));
  };

  const std::vector<PartitionSpec> specs = {
      PartitionSpec::sharded_rows(3, {Axis::data, Axis::fsdp}),
      PartitionSpec::parse("fsdp, (data,tensor), expert"),
      PartitionSpec::parse("None, (expert,tensor,fsdp,data), None"),
      PartitionSpec::replicated(3),
  };
  for (const PartitionSpec& spec : specs) {
    // What this host reads: the distinct blocks its devices need, packed (as the host loader produces them).
    const HostLocalLayout layout = host_local_layout(mesh, shape, spec, ctx.host());
    at::Tensor host_local = expected;
    for (int d = 0; d < 3; ++d)
      host_local = host_local.index_select(d, at::tensor(layout.global_indices(d), at::kLong));
    const int64_t calls_before = ctx.counters().total_calls();
    const GlobalTensor built = GlobalTensor::from_host_local(mesh, device, shape, spec, host_local);
    const int64_t build_calls = ctx.counters().total_calls() - calls_before;
    if (build_calls != 0)
      throw Error(fmt::format("building {} from host-local data issued {} collectives on device {}, expected none",
                              built.type_string(), build_calls, device));
    check_equal(built.local(), narrow_to(expected, Shape(3, 0), built.bounds()), built.placement_string());
    check_equal(built.gather(ctx), expected, "the gather of " + built.type_string());
    built.check_replicas(ctx);
  }

  // shard -> replicate -> shard (the second step slices locally: no collective).
  const PartitionSpec rows = PartitionSpec::sharded_rows(3, {Axis::data, Axis::fsdp});
  const GlobalTensor sharded = GlobalTensor::from_global(mesh, device, expected, rows);
  const GlobalTensor replicated = sharded.redistribute(ctx, PartitionSpec::replicated(3));
  check_equal(replicated.local(), expected, "shard -> replicate of " + sharded.type_string());
  const int64_t calls_before = ctx.counters().total_calls();
  const GlobalTensor resharded = replicated.redistribute(ctx, rows);
  if (ctx.counters().total_calls() != calls_before)
    throw Error(fmt::format("replicate -> shard of {} communicated on device {}", rows.to_string(), device));
  check_equal(resharded.local(), sharded.local(), "replicate -> shard of " + sharded.type_string());
  // One sharding to another: dimension 0 moves from fsdp to data, dimension 1 from data to fsdp.
  const PartitionSpec from_spec = PartitionSpec::parse("fsdp, data, None");
  const PartitionSpec to_spec = PartitionSpec::parse("data, fsdp, None");
  check_equal(GlobalTensor::from_global(mesh, device, expected, from_spec).redistribute(ctx, to_spec).local(),
              GlobalTensor::from_global(mesh, device, expected, to_spec).local(), "redistribute [fsdp, data, None] "
              "-> [data, fsdp, None]");

  // partial -> replicate: device k holds (k + 1) * its rows, pending a sum over every axis but data and fsdp.
  PartitionSpec partial = rows;
  partial.partial = {Axis::tensor, Axis::expert};
  const int addends = mesh.size_along(partial.partial);
  const int64_t weight = mesh.index_along(device, partial.partial) + 1;
  const GlobalTensor pending(mesh, device, shape, partial, sharded.local() * weight);
  check_equal(pending.redistribute(ctx, PartitionSpec::replicated(3)).local(), expected * (addends * (addends + 1) / 2),
              "partial -> replicate of " + pending.type_string());

  // The replica check catches a corrupted replica: the last device flips one value of its copy.
  if (n > 1) {
    at::Tensor copy = expected.clone();
    if (device == n - 1) copy.view(-1)[0] += 1;
    const GlobalTensor suspect(mesh, device, shape, PartitionSpec::replicated(3), copy);
    bool caught = false;
    try {
      suspect.check_replicas(ctx);
    } catch (const Error& e) {
      const std::string culprit = fmt::format("differing: devices {} (host {})", n - 1, mesh.device(n - 1).host);
      caught = std::string(e.what()).find(culprit) != std::string::npos;
    }
    if (!caught)
      throw Error(fmt::format("the replica check on device {} did not report the corrupted replica on device {}",
                              device, n - 1));
  }
  log::debug("global tensors checked on device {}", device);
}

}  // namespace meshtrain::sharding
