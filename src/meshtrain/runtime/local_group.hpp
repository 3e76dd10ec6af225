// local_group.hpp — LocalGroup: collectives between the device threads of one host process through their shared
// memory, instead of through Gloo's TCP connections to itself (docs/runtime.md, "Collectives").
//
// Each collective is numbered per group and member. A member posts a private copy of its part, so its caller may
// change the tensor as soon as the collective returns or is waited for (as with Gloo), and reads the others' parts
// when it waits. Posting never blocks and waiting needs only that every member has posted, so the group deadlocks
// exactly where Gloo would. A wait gives up after the collective timeout with a CollectiveError naming the members
// that had not arrived (the runtime then finds the job's first failure, as for a Gloo timeout).
#pragma once

#include "meshtrain/mesh/mesh.hpp"

#include <ATen/ATen.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace meshtrain::runtime {

class LocalGroup {
 public:
  LocalGroup(std::string label, int size, double timeout_s);

  const std::string& label() const { return label_; }
  int size() const { return size_; }

  // Member `rank` publishes `part` (kept as given: pass a tensor nobody changes) as its part of collective `sequence`.
  void post(int64_t sequence, int rank, at::Tensor part);
  // Every member's part of collective `sequence`, in rank order, once all have posted; `rank` has read them when this
  // returns (the parts are released after the last member's read). CollectiveError after the timeout.
  std::vector<at::Tensor> read(int64_t sequence, int rank);

  // A sum instead of a collection: member `rank` gives `part` (read only, never written; all parts of one shape) to
  // collective `sequence`'s sum. The parts are added in rank order as soon as the next one in that order is there,
  // by whichever member posted it, and each is released once added: the group holds the sum and the parts that came
  // early, not every part until every member has read.
  void post_to_sum(int64_t sequence, int rank, at::Tensor part);
  // The sum of every member's part of `sequence` (part 0 + part 1 + ... in that order: the same bits whatever the
  // arrival order) once all are added; the sum is released after the last member's read. CollectiveError after the
  // timeout.
  at::Tensor read_sum(int64_t sequence, int rank);

 private:
  struct Collective {
    std::vector<at::Tensor> parts;  // per rank; undefined until posted (and, for a sum, again once added)
    std::vector<char> arrived;      // per rank: posted
    int posted = 0, read = 0;
    at::Tensor sum;                 // post_to_sum: parts [0, summed) added
    int summed = 0;
    bool summing = false;           // a member is adding a part (outside the lock)
  };
  // The collective `sequence` (created when absent) after member `rank` posts to it.
  Collective& arrive(int64_t sequence, int rank);
  // Waits (holding `lock`) until `ready` holds for collective `sequence`; CollectiveError naming the members that
  // had not posted after the timeout.
  Collective& wait_for(std::unique_lock<std::mutex>& lock, int64_t sequence, int rank,
                       const std::function<bool(const Collective&)>& ready);

  const std::string label_;
  const int size_;
  const double timeout_s_;
  std::mutex mutex_;
  std::condition_variable posted_;
  std::map<int64_t, Collective> open_;  // collectives posted by some member and not yet read by all
};

// Where the members of a group that spans hosts live, when every host has the same number (>= 2) of them: hosts in
// the order of their first member's group rank, and each host's members in group rank order.
struct HostLayout {
  std::vector<std::vector<int>> group_rank;  // [host index][index on the host] -> rank in the whole group
  std::vector<int> hosts;                    // [host index] -> the mesh's host id
};

// The local groups of one host process by group key: every member thread that asks for a group gets the same one.
class LocalGroups {
 public:
  // The groups of `host`'s device threads in `mesh`.
  LocalGroups(const mesh::Mesh& mesh, int host);
  // The group `key` of `devices` if they are all local (made by the first member to ask), else null.
  std::shared_ptr<LocalGroup> group(const std::string& key, const std::string& label, const std::vector<int>& devices,
                                    double timeout_s);
  // The layout of the group `devices` (in rank order) if it spans hosts with the same number (>= 2) of members on
  // each, else nullopt (a group of one member per host gains nothing from a host's memory).
  std::optional<HostLayout> layout_across_hosts(const std::vector<int>& devices) const;

 private:
  const std::vector<int> host_of_device_;  // mesh device id -> host id
  const int host_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<LocalGroup>> groups_;
};

}  // namespace meshtrain::runtime
