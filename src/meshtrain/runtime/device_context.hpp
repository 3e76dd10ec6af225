// device_context.hpp — what one device's worker thread sees: its place in the mesh and its communicators.
//
// The runtime (host_runtime.hpp) starts one thread per local device and hands each a DeviceContext. `over(axes)`
// returns the Comm of the device's group along those mesh axes; groups are created on first use, and creating one
// is collective over the group's members (every member must ask for it, in the same order as its other groups).
#pragma once

#include "meshtrain/mesh/mesh.hpp"
#include "meshtrain/runtime/comm.hpp"

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <vector>

namespace meshtrain::runtime {

// How far one device has got, for the runtime's hang detection (runtime.step_timeout_s): written by the device's
// thread, read by the host's watchdog thread, hence atomics.
class DeviceProgress {
 public:
  DeviceProgress();
  // The device finished `step` (or another unit of work: start-up, a checkpoint save) just now.
  void report(int64_t step);
  int64_t step() const { return step_.load(); }
  double seconds_since_progress() const;

 private:
  std::atomic<int64_t> step_{0};
  std::atomic<int64_t> reported_at_ns_;  // steady_clock, nanoseconds since its epoch
};

class DeviceContext {
 public:
  // Builds the c10d group of `devices` in which this device has `rank` (called by over()); the runtime supplies it.
  // `label` names the group in logs ("fsdp", "world"); `key` ("(data,fsdp)/4": the axes as asked for, then the first
  // member) is unique to the group within the job, for the group's rendezvous keys.
  using GroupFactory = std::function<Comm(const std::string& label, const std::string& key,
                                          const std::vector<int>& devices, int rank)>;

  DeviceContext(const mesh::Mesh& mesh, int device, GroupFactory factory, std::shared_ptr<CollectiveCounters> counters);

  const mesh::Mesh& mesh() const { return mesh_; }
  int device() const { return device_; }
  const mesh::DeviceInfo& info() const { return mesh_.device(device_); }
  int host() const { return info().host; }

  Comm& world();
  Comm& over(const std::vector<mesh::Axis>& axes);
  Comm& over(mesh::Axis axis) { return over(std::vector<mesh::Axis>{axis}); }

  // Every collective this device issued, over any group, and the last ones it entered (the flight recorder).
  const CollectiveCounters& counters() const { return *counters_; }
  // Tells the runtime this device is making progress (the trainer calls it after every step and save).
  void report_progress(int64_t step) { progress_->report(step); }
  std::shared_ptr<const DeviceProgress> progress() const { return progress_; }

 private:
  const mesh::Mesh& mesh_;
  int device_;
  GroupFactory factory_;
  std::shared_ptr<CollectiveCounters> counters_;
  std::shared_ptr<DeviceProgress> progress_ = std::make_shared<DeviceProgress>();
  std::map<std::vector<mesh::Axis>, Comm> groups_;
};

// A context for one device outside any runtime (a single-device run or a unit test): every group is solo.
// The mesh must have exactly one device.
DeviceContext make_single_device_context(const mesh::Mesh& mesh);

}  // namespace meshtrain::runtime
