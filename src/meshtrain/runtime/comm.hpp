// comm.hpp — `Comm`, meshtrain's handle on a group of devices for collectives, and the per-device counters.
//
// A Comm is a small value type over a backend: a c10d ProcessGroup (Gloo on CPU), the shared memory of the device
// threads of one process (runtime/local_group.hpp), both in two levels for a group with several members on each of
// several hosts (HostSplit) or, for a group of one device, a local no-op backend, so single-device runs take the same
// code path. Every collective is counted (calls and bytes per kind) in the
// CollectiveCounters of the device that issued it, so tests and logs can prove where communication
// happens. All collectives are blocking and operate on CPU tensors along dim 0 where a layout matters.
#pragma once

#include "meshtrain/common/error.hpp"

#include <ATen/ATen.h>
#include <torch/version.h>

#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

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

// point_to_point: Comm::exchange (sends and receives between chosen ranks), counted with the bytes sent.
// kv_exchange: context parallelism's gathers of keys, values and document numbers and the reduce-scatters of the
// keys' and values' gradients (parallel/context_parallel.hpp), counted apart from the other gathers.
// stage_transfer: pipeline parallelism's activations sent to the next stage and their gradients sent back
// (point to point, counted with the bytes sent).
enum class Collective : int {
  allreduce = 0, allgather, broadcast, reduce_scatter, all_to_all, barrier, point_to_point, kv_exchange, stage_transfer
};
constexpr int kNumCollectives = 9;
const char* collective_name(Collective kind);

// Calls, payload bytes (the local tensor's bytes as passed in) and wall time spent inside the call, per collective
// kind, for one device. The time is what the issuing thread waited: the communication cost a step pays.
//
// It is also the device's flight recorder (like NCCL's, on every backend): the last kRecentCollectives collectives it
// entered, each with its group, kind, the group's sequence number, bytes, when it started and whether it completed.
// On a hang or a failure the runtime prints them for every local device, so the device that never arrived at a
// collective (its peers' entry is not completed, its own sequence number is behind) is visible.
struct CollectiveEntry {
  std::string group;    // the mesh axes it spans, e.g. "(data,fsdp)" or "world"
  Collective kind = Collective::barrier;
  int64_t sequence = 0;  // 1 for the group's first collective on this device, and so on
  int64_t bytes = 0;
  std::chrono::steady_clock::time_point started;
  bool completed = false;
};

class CollectiveCounters {
 public:
  static constexpr size_t kRecentCollectives = 8;

  // Enters a collective in the flight recorder; returns its ticket for finish().
  int64_t begin(const std::string& group, Collective kind, int64_t sequence, int64_t bytes);
  // Marks the collective of `ticket` completed (if still in the recorder) and counts it with the `seconds` spent in it.
  void finish(int64_t ticket, Collective kind, int64_t bytes, double seconds);
  int64_t calls(Collective kind) const { return calls_[static_cast<int>(kind)].load(); }
  int64_t bytes(Collective kind) const { return bytes_[static_cast<int>(kind)].load(); }
  int64_t total_calls() const;
  int64_t total_bytes() const;
  double total_seconds() const { return static_cast<double>(nanoseconds_.load()) * 1e-9; }
  double seconds(Collective kind) const {
    return static_cast<double>(nanoseconds_by_kind_[static_cast<int>(kind)].load()) * 1e-9;
  }
  // "allreduce 3 calls 1.2 KB, allgather 1 call 256 B" (kinds with no calls left out; "none" if empty).
  std::string summary() const;
  // The recorder's entries, oldest first (a copy: safe from any thread).
  std::vector<CollectiveEntry> recent() const;
  // One line per entry: "(data,fsdp) #42 allgather 1.2 MB: completed in 0.01 s" / "...: NOT completed, waiting 31.0 s".
  std::vector<std::string> recent_lines() const;

 private:
  void record(Collective kind, int64_t bytes, double seconds);

  std::array<std::atomic<int64_t>, kNumCollectives> calls_{};
  std::array<std::atomic<int64_t>, kNumCollectives> bytes_{};
  std::atomic<int64_t> nanoseconds_{0};
  std::array<std::atomic<int64_t>, kNumCollectives> nanoseconds_by_kind_{};
  // The recorder is written by the device thread and read by the host's watchdog thread (on a hang): a mutex, held
  // only to copy a few small entries.
  mutable std::mutex recent_mutex_;
  std::deque<std::pair<int64_t, CollectiveEntry>> recent_;  // (ticket, entry)
  int64_t next_ticket_ = 0;
};

class CommBackend;
class LocalGroup;

// A collective that failed inside the transport (a peer closed its connection, a timeout): usually the consequence
// of a failure elsewhere, so the runtime looks for the job's first published reason before reporting this one.
class CollectiveError : public Error {
 public:
  explicit CollectiveError(const std::string& message) : Error(message) {}
};

// A collective in flight (Comm::allgather_async, Comm::reduce_scatter_sum_async): the communication proceeds on the
// backend's threads while the caller computes; wait() returns what the blocking call would have, and counts the call
// with the time it spent issuing and waiting (the part of the communication that was not hidden).
class PendingCollective {
 public:
  at::Tensor wait();
  // Whether wait() would return at once: waited already, or (a point-to-point exchange) completed in the transport.
  // False for a collective that cannot tell.
  bool done() const;

 private:
  friend class Comm;
  std::function<at::Tensor()> finish_;
  std::function<bool()> done_;
  std::shared_ptr<CollectiveCounters> counters_;
  std::string label_;
  Collective kind_ = Collective::allgather;
  int64_t ticket_ = 0, bytes_ = 0;
  double issue_seconds_ = 0;
};

// A group that spans hosts with the same number (>= 2) of its members on each (fsdp=8 over 2 hosts x 4 devices): its
// gathers and reduce-scatters go in two levels, between the members of one host through memory and between hosts
// over Gloo groups of one member per host, so that a host sends its data once per peer host instead of once per
// remote member, and no member holds a Gloo buffer of the whole result.
struct HostSplit {
  std::shared_ptr<LocalGroup> on_host;          // this host's members, in group rank order
  int on_host_rank = 0;                         // this member's index among them
  c10::intrusive_ptr<C10dGroup> across_hosts;   // the members of this on-host index, one per host, in host order
  std::vector<std::vector<int>> group_rank;     // [host index][on-host index] -> rank in the whole group
};

class Comm {
 public:
  // A group of one device: every collective is the identity (and still counted).
  explicit Comm(std::string label = "solo", std::shared_ptr<CollectiveCounters> counters = nullptr);
  // A group over a c10d process group (rank and size come from it).
  Comm(std::string label, c10::intrusive_ptr<C10dGroup> group, std::shared_ptr<CollectiveCounters> counters);
  // A group of device threads of this process, member `rank` of `local`; `for_exchange` (the same members over
  // Gloo) carries exchange().
  Comm(std::string label, std::shared_ptr<LocalGroup> local, int rank, c10::intrusive_ptr<C10dGroup> for_exchange,
       std::shared_ptr<CollectiveCounters> counters);

  // A group across hosts over `whole` (which carries every collective but gathers and reduce-scatters) and `split`.
  Comm(std::string label, c10::intrusive_ptr<C10dGroup> whole, HostSplit split,
       std::shared_ptr<CollectiveCounters> counters);

  int rank() const;
  int size() const;
  const std::string& label() const { return label_; }  // the mesh axes it spans, e.g. "(data,fsdp)" or "world"

  // Sum over the group, in place.
  void allreduce_sum(at::Tensor& tensor);
  // Concatenation of every rank's `local` along dim 0, in rank order: [size * n, ...], written into `into` when
  // given (a contiguous tensor of that shape and local's dtype: no buffer of the result's size allocated here).
  // Counted as `counted_as` (an allgather unless said otherwise).
  at::Tensor allgather(const at::Tensor& local, const at::Tensor& into = {},
                       Collective counted_as = Collective::allgather);
  // The same, started now and finished by wait() (every rank must start it at the same point of its sequence).
  PendingCollective allgather_async(const at::Tensor& local, const at::Tensor& into = {},
                                    Collective counted_as = Collective::allgather);
  // The same into the tensor make_into(shape) returns, asked for when the transport first writes to it: at once over
  // Gloo, at wait() between the devices of one host (LocalGroup), so that a gather started early (an FSDP prefetch)
  // holds no buffer of the result's size before it is needed.
  using MakeDestination = std::function<at::Tensor(c10::IntArrayRef shape)>;
  PendingCollective allgather_async(const at::Tensor& local, const MakeDestination& make_into,
                                    Collective counted_as = Collective::allgather);
  // Root's tensor everywhere, in place.
  void broadcast(at::Tensor& tensor, int root);
  // `input` is [size * n, ...]: rank r receives the sum over ranks of chunk r, [n, ...]. Summed in rank order,
  // so the result does not depend on arrival order (exact and reproducible). Counted as `counted_as`.
  at::Tensor reduce_scatter_sum(const at::Tensor& input, Collective counted_as = Collective::reduce_scatter);
  // The same, started now and finished by wait() (every rank must start it at the same point of its sequence;
  // `input` must not change until then).
  PendingCollective reduce_scatter_sum_async(const at::Tensor& input,
                                             Collective counted_as = Collective::reduce_scatter);
  // `input` is [size * n, ...]: chunk j goes to rank j; the result holds the chunks received, in rank order.
  at::Tensor all_to_all(const at::Tensor& input);
  void barrier();
  // Point to point: sends each (rank, tensor) of `sends` and fills each (rank, buffer) of `receives` from that rank,
  // all started at once; returns when all are done. The peers call it with the matching receives and sends and the
  // same `tag`. Not for a group of one (nothing to exchange with). Counted as `counted_as` (an all-to-all of variable
  // sizes is made of one exchange: parallel/autograd_collectives.hpp).
  void exchange(const std::vector<std::pair<int, at::Tensor>>& sends,
                const std::vector<std::pair<int, at::Tensor>>& receives, int tag,
                Collective counted_as = Collective::point_to_point);
  // The same, started now and finished by wait() (the tensors must live and stay unchanged until then). `what`
  // names what travels in the flight recorder ("activations of micro-batch 3 from stage 0"), so that a device stuck
  // waiting for a peer says for what.
  PendingCollective exchange_async(const std::vector<std::pair<int, at::Tensor>>& sends,
                                   const std::vector<std::pair<int, at::Tensor>>& receives, int tag,
                                   Collective counted_as = Collective::point_to_point, const std::string& what = "");

  const CollectiveCounters& counters() const { return *counters_; }

 private:
  // Runs `call` as one collective of `kind`: entered in the flight recorder with the group's next sequence number,
  // counted with its time, and a transport failure rethrown as a CollectiveError naming the group and collective.
  template <typename Call>
  auto run(Collective kind, int64_t bytes, Call&& call);
  // Starts `issue`'s collective as one of `kind` (entered and counted as run() does, when it is waited for).
  // `what`, when given, follows the group's label in the flight recorder.
  PendingCollective start(Collective kind, int64_t bytes, const std::function<std::function<at::Tensor()>()>& issue,
                          const std::string& what = "");

  std::string label_;
  std::shared_ptr<CommBackend> backend_;
  std::shared_ptr<CollectiveCounters> counters_;
  int64_t sequence_ = 0;  // collectives issued over this group by this device (only its thread uses a Comm)
};

}  // namespace meshtrain::runtime
