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

void LocalGroup::post(int64_t sequence, int rank, at::Tensor part) {
  MT_CHECK(rank >= 0 && rank < size_, "rank {} is not in the local group {} of {}", rank, label_, size_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Collective& collective = open_[sequence];
    if (collective.parts.empty()) collective.parts.resize(size_);
    MT_CHECK(!collective.parts[rank].defined(), "rank {} posted collective #{} over {} twice", rank, sequence, label_);
    collective.parts[rank] = std::move(part);
    if (++collective.posted < size_) return;
  }
  posted_.notify_all();
}

std::vector<at::Tensor> LocalGroup::read(int64_t sequence, int rank) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto all_posted = [&] {
    auto found = open_.find(sequence);
    return found != open_.end() && found->second.posted == size_;
  };
  if (!posted_.wait_for(lock, std::chrono::duration<double>(timeout_s_), all_posted)) {
    std::string missing;
    auto found = open_.find(sequence);
    for (int r = 0; r < size_; ++r)
      if (found == open_.end() || found->second.parts.empty() || !found->second.parts[r].defined())
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    throw CollectiveError(fmt::format("collective #{} over {} (devices of this host) timed out after {} s on rank {}: "
                                      "rank(s) {} never arrived", sequence, label_, timeout_s_, rank, missing));
  }
  auto found = open_.find(sequence);
  std::vector<at::Tensor> parts = found->second.parts;
  if (++found->second.read == size_) open_.erase(found);
  return parts;
}

std::shared_ptr<LocalGroup> LocalGroups::group(const std::string& key, const std::string& label,
                                               const std::vector<int>& devices, double timeout_s) {
  for (int device : devices)
    if (std::find(local_devices_.begin(), local_devices_.end(), device) == local_devices_.end()) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<LocalGroup>& group = groups_[key];
  if (!group) group = std::make_shared<LocalGroup>(label, static_cast<int>(devices.size()), timeout_s);
  return group;
}

}  // namespace meshtrain::runtime
