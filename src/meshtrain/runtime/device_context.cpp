// device_context.cpp — lazily created per-axis groups for one device.
#include "meshtrain/runtime/device_context.hpp"

#include "meshtrain/common/error.hpp"

#include <chrono>

namespace meshtrain::runtime {
namespace {

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

DeviceProgress::DeviceProgress() : reported_at_ns_(steady_now_ns()) {}

void DeviceProgress::report(int64_t step) {
  step_.store(step);
  reported_at_ns_.store(steady_now_ns());
}

double DeviceProgress::seconds_since_progress() const {
  return static_cast<double>(steady_now_ns() - reported_at_ns_.load()) * 1e-9;
}

DeviceContext::DeviceContext(const mesh::Mesh& mesh, int device, GroupFactory factory,
                             std::shared_ptr<CollectiveCounters> counters)
    : mesh_(mesh), device_(device), factory_(std::move(factory)), counters_(std::move(counters)) {
  MT_CHECK(device >= 0 && device < mesh.num_devices(), "device {} is not in a mesh of {} devices", device,
           mesh.num_devices());
}

Comm& DeviceContext::world() {
  return over(std::vector<mesh::Axis>(mesh::kAllAxes.begin(), mesh::kAllAxes.end()));
}

Comm& DeviceContext::over(const std::vector<mesh::Axis>& axes) {
  auto found = groups_.find(axes);
  if (found != groups_.end()) return found->second;
  const std::vector<int> members = mesh_.group_of(device_, axes);
  const int rank = mesh_.index_along(device_, axes);
  const bool is_world = axes == std::vector<mesh::Axis>(mesh::kAllAxes.begin(), mesh::kAllAxes.end());
  const std::string label = is_world ? "world" : mesh::axes_label(axes);
  const std::string key = fmt::format("{}/{}", mesh::axes_label(axes), members[0]);
  Comm comm = members.size() == 1 ? Comm(label, counters_) : factory_(label, key, members, rank);
  return groups_.emplace(axes, std::move(comm)).first->second;
}

DeviceContext make_single_device_context(const mesh::Mesh& mesh) {
  MT_CHECK(mesh.num_devices() == 1, "a single-device context needs a 1-device mesh, got {} devices",
           mesh.num_devices());
  return DeviceContext(
      mesh, 0,
      [](const std::string&, const std::string&, const std::vector<int>&, int) -> Comm {
        MT_CHECK(false, "a single-device context has no multi-device group");
      },
      std::make_shared<CollectiveCounters>());
}

}  // namespace meshtrain::runtime
