// mesh.hpp — the named device mesh: axes, hybrid (ICI x DCN) device order, and device <-> coordinate maps.
//
// Axes, outermost first: data, fsdp, tensor, expert, context (torchprime's order), then pipeline. A job has `hosts` host processes
// with `devices_per_host` devices each; global device id = host * devices_per_host + local index. Devices are cut
// into slices of prod(ici_mesh) consecutive ids; slice s has DCN coordinates unravel(s, dcn_mesh) and a device at
// position i inside its slice has ICI coordinates unravel(i, ici_mesh). As in JAX's create_hybrid_device_mesh,
// along every axis
//     mesh coordinate = dcn coordinate * ici size + ici coordinate,
// and the mesh shape is the element-wise product of the two. A device's rank in collectives is its global id.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::mesh {

enum class Axis : int { data = 0, fsdp = 1, tensor = 2, expert = 3, context = 4, pipeline = 5 };
constexpr int kNumAxes = 6;
constexpr std::array<Axis, kNumAxes> kAllAxes = {Axis::data,   Axis::fsdp,    Axis::tensor,
                                                 Axis::expert, Axis::context, Axis::pipeline};

std::string_view axis_name(Axis axis);
std::optional<Axis> axis_from_name(std::string_view name);
// "(data,fsdp)" or "fsdp" for one axis; "()" for none.
std::string axes_label(const std::vector<Axis>& axes);

// Sizes per axis, in axis order. A size of -1 means "whatever the device count leaves" (resolved by Mesh::create).
struct AxisSizes {
  std::array<int, kNumAxes> sizes{1, 1, 1, 1, 1, 1};
  int operator[](Axis axis) const { return sizes[static_cast<int>(axis)]; }
  int& operator[](Axis axis) { return sizes[static_cast<int>(axis)]; }
  long product() const;
  // "data=1 x fsdp=4 x tensor=1 x expert=1 x context=1 x pipeline=1"
  std::string equation() const;
  bool operator==(const AxisSizes& other) const { return sizes == other.sizes; }
};

using Coords = std::array<int, kNumAxes>;

struct DeviceInfo {
  int device = 0;  // global id, also the rank in collectives
  int host = 0;
  int local = 0;   // index among the host's devices
  int slice = 0;
  Coords coords{};  // mesh coordinates per axis
};

class Mesh {
 public:
  // Validates sizes against the device count (the error spells out the equation) and resolves one -1 per mesh.
  static Mesh create(AxisSizes ici, AxisSizes dcn, int hosts, int devices_per_host);

  const AxisSizes& ici() const { return ici_; }
  const AxisSizes& dcn() const { return dcn_; }
  const AxisSizes& shape() const { return shape_; }
  int size(Axis axis) const { return shape_[axis]; }
  int num_devices() const { return static_cast<int>(devices_.size()); }
  int hosts() const { return hosts_; }
  int devices_per_host() const { return devices_per_host_; }
  int num_slices() const { return static_cast<int>(dcn_.product()); }

  const std::vector<DeviceInfo>& devices() const { return devices_; }
  const DeviceInfo& device(int id) const;
  int device_at(const Coords& coords) const;
  std::vector<int> devices_of_host(int host) const;

  // Device ids in mesh order (row-major over the mesh coordinates): torchprime's "device assignments".
  const std::vector<int>& device_ids_in_mesh_order() const { return mesh_order_; }

  // The devices that share every coordinate except those along `axes`, i.e. `device`'s group when communicating
  // over `axes`; ordered row-major over `axes` in the given order. The group rank of a device is its position.
  std::vector<int> group_of(int device, const std::vector<Axis>& axes) const;
  // Every such group, each once, ordered by their first device.
  std::vector<std::vector<int>> groups_along(const std::vector<Axis>& axes) const;
  // Position of `device` along `axes` (row-major in the given order): its rank in group_of(device, axes).
  int index_along(int device, const std::vector<Axis>& axes) const;
  // Product of the sizes of `axes`.
  int size_along(const std::vector<Axis>& axes) const;

  // Log text: "OrderedDict([('data', 1), ('fsdp', 8), ('tensor', 1), ('expert', 1), ('context', 1), ('pipeline', 1)])" as torchprime prints it.
  std::string shape_string() const;
  // Log text: "[0 1 2 3 4 5 6 7]" (device ids in mesh order).
  std::string assignments_string() const;
  // "data=0 fsdp=3 tensor=0 expert=0 context=0 pipeline=0"
  std::string coords_string(int device) const;
  // A table, one line per device: id, host, local index, slice, mesh coordinates.
  std::string device_table() const;

 private:
  AxisSizes ici_, dcn_, shape_;
  int hosts_ = 1, devices_per_host_ = 1;
  std::vector<DeviceInfo> devices_;
  std::vector<int> mesh_order_;  // flat row-major mesh position -> device id
};

}  // namespace meshtrain::mesh
