// mesh.cpp — hybrid device order (JAX's create_hybrid_device_mesh rule), validation with equations, groups.
#include "meshtrain/mesh/mesh.hpp"

#include "meshtrain/common/error.hpp"

#include <fmt/format.h>

#include <numeric>

namespace meshtrain::mesh {
namespace {

Coords unravel(long index, const AxisSizes& sizes) {
  Coords coords{};
  for (int a = kNumAxes - 1; a >= 0; --a) {
    coords[a] = static_cast<int>(index % sizes.sizes[a]);
    index /= sizes.sizes[a];
  }
  return coords;
}

long ravel(const Coords& coords, const AxisSizes& sizes) {
  long index = 0;
  for (int a = 0; a < kNumAxes; ++a) index = index * sizes.sizes[a] + coords[a];
  return index;
}

// Replaces the one -1 in `sizes` so that the product becomes `target`; checks the product otherwise.
void resolve_sizes(AxisSizes& sizes, long target, const char* name, const std::string& target_text) {
  int auto_axis = -1;
  long known = 1;
  for (int a = 0; a < kNumAxes; ++a) {
    int s = sizes.sizes[a];
    if (s == -1) {
      MT_USER_CHECK(auto_axis < 0, "{}: only one axis may be -1 (auto), got {}", name, sizes.equation());
      auto_axis = a;
    } else {
      MT_USER_CHECK(s >= 1, "{}.{} must be a positive integer or -1 (auto), got {}", name,
                    axis_name(static_cast<Axis>(a)), s);
      known *= s;
    }
  }
  if (auto_axis >= 0) {
    MT_USER_CHECK(target % known == 0, "{}: {} = {} does not divide {}, so {}.{}=-1 cannot be resolved", name,
                  sizes.equation(), known, target_text, name, axis_name(static_cast<Axis>(auto_axis)));
    sizes.sizes[auto_axis] = static_cast<int>(target / known);
  }
}

}  // namespace

std::string_view axis_name(Axis axis) {
  switch (axis) {
    case Axis::data: return "data";
    case Axis::fsdp: return "fsdp";
    case Axis::tensor: return "tensor";
    case Axis::expert: return "expert";
    case Axis::context: return "context";
    case Axis::pipeline: return "pipeline";
  }
  return "?";
}

std::optional<Axis> axis_from_name(std::string_view name) {
  for (Axis a : kAllAxes)
    if (axis_name(a) == name) return a;
  return std::nullopt;
}

std::string axes_label(const std::vector<Axis>& axes) {
  if (axes.size() == 1) return std::string(axis_name(axes[0]));
  std::string out = "(";
  for (size_t i = 0; i < axes.size(); ++i) out += (i ? "," : "") + std::string(axis_name(axes[i]));
  return out + ")";
}

long AxisSizes::product() const {
  return std::accumulate(sizes.begin(), sizes.end(), 1L, [](long p, int s) { return p * s; });
}

std::string AxisSizes::equation() const {
  std::string out;
  for (Axis a : kAllAxes) out += fmt::format("{}{}={}", out.empty() ? "" : " x ", axis_name(a), (*this)[a]);
  return out;
}

Mesh Mesh::create(AxisSizes ici, AxisSizes dcn, int hosts, int devices_per_host) {
  MT_USER_CHECK(hosts >= 1, "the host count must be at least 1, got {}", hosts);
  MT_USER_CHECK(devices_per_host >= 1, "devices per host must be at least 1, got {}", devices_per_host);
  const long total = static_cast<long>(hosts) * devices_per_host;
  const std::string total_text = fmt::format("{} hosts x {} devices per host = {} devices", hosts, devices_per_host, total);

  bool ici_auto = false, dcn_auto = false;
  for (int s : ici.sizes) ici_auto |= (s == -1);
  for (int s : dcn.sizes) dcn_auto |= (s == -1);
  MT_USER_CHECK(!(ici_auto && dcn_auto), "ici_mesh and dcn_mesh cannot both have an axis set to -1 (auto): {} and {}",
                ici.equation(), dcn.equation());
  if (dcn_auto) {
    resolve_sizes(ici, ici.product(), "ici_mesh", "");  // validates positivity
    MT_USER_CHECK(total % ici.product() == 0, "ici_mesh: {} = {} devices per slice does not divide the {}",
                  ici.equation(), ici.product(), total_text);
    resolve_sizes(dcn, total / ici.product(), "dcn_mesh", fmt::format("{} slices", total / ici.product()));
  } else {
    resolve_sizes(dcn, dcn.product(), "dcn_mesh", "");
    MT_USER_CHECK(total % dcn.product() == 0, "dcn_mesh: {} = {} slices does not divide the {}", dcn.equation(),
                  dcn.product(), total_text);
    resolve_sizes(ici, total / dcn.product(), "ici_mesh",
                  fmt::format("{} devices per slice ({} / {} slices)", total / dcn.product(), total_text, dcn.product()));
  }
  MT_USER_CHECK(ici.product() * dcn.product() == total,
                "mesh does not match the devices: ici_mesh ({} = {} devices per slice) x dcn_mesh ({} = {} slices) = "
                "{} devices, but the job has {}",
                ici.equation(), ici.product(), dcn.equation(), dcn.product(), ici.product() * dcn.product(), total_text);

  Mesh mesh;
  mesh.ici_ = ici;
  mesh.dcn_ = dcn;
  for (int a = 0; a < kNumAxes; ++a) mesh.shape_.sizes[a] = ici.sizes[a] * dcn.sizes[a];
  mesh.hosts_ = hosts;
  mesh.devices_per_host_ = devices_per_host;
  const long per_slice = ici.product();
  mesh.devices_.resize(total);
  mesh.mesh_order_.assign(total, -1);
  for (int id = 0; id < total; ++id) {
    DeviceInfo& d = mesh.devices_[id];
    d.device = id;
    d.host = id / devices_per_host;
    d.local = id % devices_per_host;
    d.slice = static_cast<int>(id / per_slice);
    Coords ici_coords = unravel(id % per_slice, ici);
    Coords dcn_coords = unravel(d.slice, dcn);
    for (int a = 0; a < kNumAxes; ++a) d.coords[a] = dcn_coords[a] * ici.sizes[a] + ici_coords[a];
    mesh.mesh_order_[ravel(d.coords, mesh.shape_)] = id;
  }
  return mesh;
}

const DeviceInfo& Mesh::device(int id) const {
  MT_CHECK(id >= 0 && id < num_devices(), "device id {} is out of range [0, {})", id, num_devices());
  return devices_[id];
}

int Mesh::device_at(const Coords& coords) const {
  for (int a = 0; a < kNumAxes; ++a)
    MT_CHECK(coords[a] >= 0 && coords[a] < shape_.sizes[a], "mesh coordinate {}={} is out of range [0, {})",
             axis_name(static_cast<Axis>(a)), coords[a], shape_.sizes[a]);
  return mesh_order_[ravel(coords, shape_)];
}

std::vector<int> Mesh::devices_of_host(int host) const {
  std::vector<int> ids;
  for (const DeviceInfo& d : devices_)
    if (d.host == host) ids.push_back(d.device);
  return ids;
}

int Mesh::size_along(const std::vector<Axis>& axes) const {
  int n = 1;
  for (Axis a : axes) n *= shape_[a];
  return n;
}

int Mesh::index_along(int device_id, const std::vector<Axis>& axes) const {
  const Coords& c = device(device_id).coords;
  int index = 0;
  for (Axis a : axes) index = index * shape_[a] + c[static_cast<int>(a)];
  return index;
}

std::vector<int> Mesh::group_of(int device_id, const std::vector<Axis>& axes) const {
  const int n = size_along(axes);
  std::vector<int> group(n);
  Coords c = device(device_id).coords;
  for (int i = 0; i < n; ++i) {
    int rest = i;
    for (int k = static_cast<int>(axes.size()) - 1; k >= 0; --k) {
      int a = static_cast<int>(axes[k]);
      c[a] = rest % shape_.sizes[a];
      rest /= shape_.sizes[a];
    }
    group[i] = device_at(c);
  }
  return group;
}

std::vector<std::vector<int>> Mesh::groups_along(const std::vector<Axis>& axes) const {
  std::vector<std::vector<int>> groups;
  std::vector<bool> seen(devices_.size(), false);
  for (const DeviceInfo& d : devices_) {
    if (seen[d.device]) continue;
    groups.push_back(group_of(d.device, axes));
    for (int id : groups.back()) seen[id] = true;
  }
  return groups;
}

std::string Mesh::shape_string() const {
  std::string out = "OrderedDict([";
  for (Axis a : kAllAxes) out += fmt::format("{}('{}', {})", a == Axis::data ? "" : ", ", axis_name(a), shape_[a]);
  return out + "])";
}

std::string Mesh::assignments_string() const {
  std::string out = "[";
  for (size_t i = 0; i < mesh_order_.size(); ++i) out += fmt::format("{}{}", i ? " " : "", mesh_order_[i]);
  return out + "]";
}

std::string Mesh::coords_string(int device_id) const {
  const DeviceInfo& d = device(device_id);
  std::string out;
  for (Axis a : kAllAxes) out += fmt::format("{}{}={}", out.empty() ? "" : " ", axis_name(a), d.coords[static_cast<int>(a)]);
  return out;
}

std::string Mesh::device_table() const {
  std::string out = fmt::format("{:>6} {:>5} {:>6} {:>6}  {}\n", "device", "host", "local", "slice", "mesh coordinates");
  for (const DeviceInfo& d : devices_)
    out += fmt::format("{:>6} {:>5} {:>6} {:>6}  {}\n", d.device, d.host, d.local, d.slice, coords_string(d.device));
  return out;
}

}  // namespace meshtrain::mesh
