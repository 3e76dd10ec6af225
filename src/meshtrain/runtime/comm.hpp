// comm.hpp — `Comm`, meshtrain's handle on a group of devices for collectives, and the per-device counters.
//
// A Comm is a small value type over a backend: a c10d ProcessGroup (Gloo on CPU) or, for a group of one device, a
// local no-op backend, so single-device runs take the same code path. Every collective is counted (calls and bytes
// per kind) in the CollectiveCounters of the device that issued it, so tests and logs can prove where communication
// happens. All collectives are blocking and operate on CPU tensors along dim 0 where a layout matters.
#pragma once

#include <ATen/ATen.h>
#include <torch/version.h>

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <string>

namespace c10d {
class ProcessGroup;
class Backend;
}  // namespace c10d

namespace meshtrain::runtime {

// The c10d class that collective implementations (Gloo, NCCL) derive from: ProcessGroup in libtorch 1.x, Backend in
// 2.x (where ProcessGroup became a dispatcher over backends). Both have the collectives Comm uses.
#if TORCH_VERSION_MAJOR >= 2
using C10dGroup = c10d::Backend;
#else
using C10dGroup = c10d::ProcessGroup;
#endif

enum class Collective : int { allreduce = 0, allgather, broadcast, reduce_scatter, all_to_all, barrier };
constexpr int kNumCollectives = 6;
const char* collective_name(Collective kind);

// Calls, payload bytes (the local tensor's bytes as passed in) and wall time spent inside the call, per collective
// kind, for one device. The time is what the issuing thread waited: the communication cost a step pays.
class CollectiveCounters {
 public:
  void record(Collective kind, int64_t bytes, double seconds = 0);
  int64_t calls(Collective kind) const { return calls_[static_cast<int>(kind)].load(); }
  int64_t bytes(Collective kind) const { return bytes_[static_cast<int>(kind)].load(); }
  int64_t total_calls() const;
  int64_t total_bytes() const;
  double total_seconds() const { return static_cast<double>(nanoseconds_.load()) * 1e-9; }
  // "allreduce 3 calls 1.2 KB, allgather 1 call 256 B" (kinds with no calls left out; "none" if empty).
  std::string summary() const;

 private:
  std::array<std::atomic<int64_t>, kNumCollectives> calls_{};
  std::array<std::atomic<int64_t>, kNumCollectives> bytes_{};
  std::atomic<int64_t> nanoseconds_{0};
};

class CommBackend;

// An all-gather in flight (Comm::allgather_async): the communication proceeds on the backend's threads while the
// caller computes; wait() returns what allgather() would have, and counts the call with the time it spent issuing
// and waiting (the part of the communication that was not hidden).
class PendingGather {
 public:
  at::Tensor wait();

 private:
  friend class Comm;
  std::function<at::Tensor()> finish_;
  std::shared_ptr<CollectiveCounters> counters_;
  int64_t bytes_ = 0;
  double issue_seconds_ = 0;
};

class Comm {
 public:
  // A group of one device: every collective is the identity (and still counted).
  explicit Comm(std::string label = "solo", std::shared_ptr<CollectiveCounters> counters = nullptr);
  // A group over a c10d process group (rank and size come from it).
  Comm(std::string label, c10::intrusive_ptr<C10dGroup> group, std::shared_ptr<CollectiveCounters> counters);

  int rank() const;
  int size() const;
  const std::string& label() const { return label_; }  // the mesh axes it spans, e.g. "(data,fsdp)" or "world"

  // Sum over the group, in place.
  void allreduce_sum(at::Tensor& tensor);
  // Concatenation of every rank's `local` along dim 0, in rank order: [size * n, ...].
  at::Tensor allgather(const at::Tensor& local);
  // The same, started now and finished by wait() (every rank must start it at the same point of its sequence).
  PendingGather allgather_async(const at::Tensor& local);
  // Root's tensor everywhere, in place.
  void broadcast(at::Tensor& tensor, int root);
  // `input` is [size * n, ...]: rank r receives the sum over ranks of chunk r, [n, ...]. Summed in rank order,
  // so the result does not depend on arrival order (exact and reproducible).
  at::Tensor reduce_scatter_sum(const at::Tensor& input);
  // `input` is [size * n, ...]: chunk j goes to rank j; the result holds the chunks received, in rank order.
  at::Tensor all_to_all(const at::Tensor& input);
  void barrier();

  const CollectiveCounters& counters() const { return *counters_; }

 private:
  std::string label_;
  std::shared_ptr<CommBackend> backend_;
  std::shared_ptr<CollectiveCounters> counters_;
};

}  // namespace meshtrain::runtime
