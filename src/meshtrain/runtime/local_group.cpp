// local_group.cpp — the posting and reading of a LocalGroup's collectives.
#include "meshtrain/runtime/local_group.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/runtime/comm.hpp"

#include <algorithm>
#include <chrono>

namespace meshtrain::runtime {

LocalGroup::LocalGroup(std::string label, int size, double timeout_s)
    : label_(std::move(label)), size_(size), timeout_s_(timeout_s) {
  MT_CHECK(size >= 2, "a local group of {} members", size);
}

LocalGroup::Collective& LocalGroup::arrive(int64_t sequence, int rank) {
  MT_CHECK(rank >= 0 && rank < size_, "rank {} is not in the local group {} of {}", rank, label_, size_);
  Collective& collective = open_[sequence];
  if (collective.parts.empty()) {
    collective.parts.resize(size_);
    collective.arrived.resize(size_, 0);
  }
  MT_CHECK(!collective.arrived[rank], "rank {} posted collective #{} over {} twice", rank, sequence, label_);
  collective.arrived[rank] = 1;
  ++collective.posted;
  return collective;
}

LocalGroup::Collective& LocalGroup::wait_for(std::unique_lock<std::mutex>& lock, int64_t sequence, int rank,
                                             const std::function<bool(const Collective&)>& ready) {
  auto done = [&] {
    auto found = open_.find(sequence);
    return found != open_.end() && ready(found->second);
  };
  if (!posted_.wait_for(lock, std::chrono::duration<double>(timeout_s_), done)) {
    std::string missing;
    auto found = open_.find(sequence);
    for (int r = 0; r < size_; ++r)
      if (found == open_.end() || found->second.arrived.empty() || !found->second.arrived[r])
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    throw CollectiveError(fmt::format("collective #{} over {} (devices of this host) timed out after {} s on rank {}: "
                                      "rank(s) {} never arrived", sequence, label_, timeout_s_, rank,
                                      missing.empty() ? "none (a member's sum failed)" : missing));
  }
  return open_.find(sequence)->second;
}

void LocalGroup::post(int64_t sequence, int rank, at::Tensor part) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Collective& collective = arrive(sequence, rank);
    collective.parts[rank] = std::move(part);
    if (collective.posted < size_) return;
  }
  posted_.notify_all();
}

std::vector<at::Tensor> LocalGroup::read(int64_t sequence, int rank) {
  std::unique_lock<std::mutex> lock(mutex_);
  Collective& collective = wait_for(lock, sequence, rank, [this](const Collective& c) { return c.posted == size_; });
  std::vector<at::Tensor> parts = collective.parts;
  if (++collective.read == size_) open_.erase(sequence);
  return parts;
}

void LocalGroup::post_to_sum(int64_t sequence, int rank, at::Tensor part) {
  std::unique_lock<std::mutex> lock(mutex_);
  Collective& collective = arrive(sequence, rank);  // stays in open_ until every member has read the sum
  collective.parts[rank] = std::move(part);
  // One member adds at a time; it takes every part that is next in rank order, including those posted meanwhile.
  if (collective.summing) return;
  collective.summing = true;
  while (collective.summed < size_ && collective.parts[collective.summed].defined()) {
    const int index = collective.summed;
    at::Tensor next = std::move(collective.parts[index]);
    collective.parts[index] = at::Tensor();
    lock.unlock();
    if (index == 0)
      collective.sum = next.clone();  // the parts are only read
    else
      collective.sum.add_(next);
    next = at::Tensor();  // released once added
    lock.lock();
    collective.summed = index + 1;
  }
  collective.summing = false;
  const bool complete = collective.summed == size_;
  lock.unlock();
  if (complete) posted_.notify_all();
}

at::Tensor LocalGroup::read_sum(int64_t sequence, int rank) {
  std::unique_lock<std::mutex> lock(mutex_);
  Collective& collective = wait_for(lock, sequence, rank, [this](const Collective& c) { return c.summed == size_; });
  at::Tensor sum = collective.sum;
  if (++collective.read == size_) open_.erase(sequence);
  return sum;
}

namespace {

std::vector<int> hosts_by_device(const mesh::Mesh& mesh) {
  std::vector<int> hosts;
  for (const mesh::DeviceInfo& device : mesh.devices()) hosts.push_back(device.host);
  return hosts;
}

}  // namespace

LocalGroups::LocalGroups(const mesh::Mesh& mesh, int host) : host_of_device_(hosts_by_device(mesh)), host_(host) {}

std::shared_ptr<LocalGroup> LocalGroups::group(const std::string& key, const std::string& label,
                                               const std::vector<int>& devices, double timeout_s) {
  for (int device : devices)
    if (host_of_device_.at(device) != host_) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<LocalGroup>& group = groups_[key];
  if (!group) group = std::make_shared<LocalGroup>(label, static_cast<int>(devices.size()), timeout_s);
  return group;
}

std::optional<HostLayout> LocalGroups::layout_across_hosts(const std::vector<int>& devices) const {
  HostLayout layout;
  for (int rank = 0; rank < static_cast<int>(devices.size()); ++rank) {
    const int host = host_of_device_.at(devices[rank]);
    const auto found = std::find(layout.hosts.begin(), layout.hosts.end(), host);
    if (found == layout.hosts.end()) {
      layout.hosts.push_back(host);
      layout.group_rank.push_back({rank});
    } else {
      layout.group_rank[found - layout.hosts.begin()].push_back(rank);
    }
  }
  const size_t per_host = layout.group_rank[0].size();
  if (layout.hosts.size() < 2 || per_host < 2) return std::nullopt;
  for (const std::vector<int>& ranks : layout.group_rank)
    if (ranks.size() != per_host) return std::nullopt;
  return layout;
}

}  // namespace meshtrain::runtime
