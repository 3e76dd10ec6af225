// checkpoint_dirs.cpp — naming, listing, choosing and pruning step-NNNNNN checkpoint folders.
#include "meshtrain/train/checkpoint_dirs.hpp"

#include "meshtrain/common/log.hpp"
#include "meshtrain/model/hf_checkpoint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <utility>

namespace fs = std::filesystem;

namespace meshtrain::train {
namespace {

constexpr const char* kPrefix = "step-";

// Every step-N folder under `root`, newest (largest step) first.
std::vector<std::pair<int64_t, fs::path>> checkpoints_newest_first(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> out;
  if (!fs::is_directory(root)) return out;
  for (const fs::directory_entry& entry : fs::directory_iterator(root))
    if (auto step = checkpoint_step(entry.path()); step && entry.is_directory()) out.emplace_back(*step, entry.path());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

}  // namespace

fs::path checkpoint_dir_for_step(const fs::path& root, int64_t step) {
  return root / fmt::format("{}{:06d}", kPrefix, step);
}

std::optional<int64_t> checkpoint_step(const fs::path& dir) {
  const std::string name = dir.filename().string();
  const std::string digits = name.substr(std::min(name.size(), std::string(kPrefix).size()));
  if (name.rfind(kPrefix, 0) != 0 || digits.empty() || digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), [](unsigned char c) { return std::isdigit(c); }))
    return std::nullopt;
  return std::stoll(digits);
}

std::optional<fs::path> newest_complete_checkpoint(const fs::path& root) {
  for (const auto& [step, dir] : checkpoints_newest_first(root)) {
    if (model::is_complete_checkpoint(dir)) return dir;
    log::warning("checkpoint {} is incomplete (no {}: the run stopped while saving it); skipping it", dir.string(),
                 model::kCompletionMarker);
  }
  return std::nullopt;
}

void remove_old_checkpoints(const fs::path& root, int64_t keep) {
  if (keep <= 0) return;
  int64_t complete_seen = 0;
  for (const auto& [step, dir] : checkpoints_newest_first(root)) {
    const bool complete = model::is_complete_checkpoint(dir);
    if (complete) ++complete_seen;
    // Incomplete folders newer than the newest complete one are left alone (complete_seen is still 0 there).
    const bool remove = complete ? complete_seen > keep : complete_seen > 0;
    if (!remove) continue;
    log::info("removing {} checkpoint {} (checkpoint.keep={})", complete ? "old" : "incomplete", dir.string(), keep);
    fs::remove(dir / model::kCompletionMarker);  // first: a crash mid-removal leaves an incomplete folder
    fs::remove_all(dir);
  }
}

}  // namespace meshtrain::train
