// simulated_devices.hpp — every device of a mesh as a thread of this test process (every host simulated here), with
// real Gloo groups over an in-memory store: for unit tests of code that communicates, without starting processes.
#pragma once

#include "meshtrain/mesh/mesh.hpp"
#include "meshtrain/runtime/host_runtime.hpp"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace meshtrain::testing {

inline mesh::AxisSizes axis_sizes(int data, int fsdp, int tensor, int expert, int context = 1, int pipeline = 1) {
  return mesh::AxisSizes{{data, fsdp, tensor, expert, context, pipeline}};
}

// Runs `fn` on one thread per device of `mesh`; returns each device's exception message ("" when it returned
// normally). Collectives time out after 30 s rather than hang a test. As in the host runtime, a group within one of
// the mesh's hosts moves its collectives through memory, a group across hosts through Gloo, in two levels where it
// has several members on each host (runtime/comm.hpp HostSplit).
inline std::vector<std::string> run_on_all_devices(const mesh::Mesh& mesh,
                                                   const std::function<void(runtime::DeviceContext&)>& fn) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto gloo_device = c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  std::vector<std::shared_ptr<runtime::LocalGroups>> local_groups;
  for (int host = 0; host < mesh.hosts(); ++host)
    local_groups.push_back(std::make_shared<runtime::LocalGroups>(mesh, host));
  std::vector<std::string> failures(mesh.num_devices());
  std::vector<std::thread> threads;
  for (int device = 0; device < mesh.num_devices(); ++device) {
    threads.emplace_back([&, device] {
      auto counters = std::make_shared<runtime::CollectiveCounters>();
      runtime::DeviceContext ctx(
          mesh, device,
          runtime::gloo_group_factory(store, gloo_device, counters, 30, local_groups[mesh.device(device).host]),
          counters);
      try {
        fn(ctx);
      } catch (const std::exception& e) {
        failures[device] = e.what();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return failures;
}

inline void expect_no_failures(const std::vector<std::string>& failures) {
  for (size_t device = 0; device < failures.size(); ++device)
    EXPECT_EQ(failures[device], "") << "device " << device;
}

}  // namespace meshtrain::testing
