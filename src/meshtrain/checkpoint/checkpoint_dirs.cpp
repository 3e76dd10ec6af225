// checkpoint_dirs.cpp — naming, publishing, listing, choosing and pruning step-NNNNNN checkpoint folders.
#include "meshtrain/checkpoint/checkpoint_dirs.hpp"

#include "meshtrain/checkpoint/hf_directory.hpp"
#include "meshtrain/common/atomic_file.hpp"
#include "meshtrain/common/log.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <string>

namespace fs = std::filesystem;

namespace meshtrain::checkpoint {
namespace {

constexpr const char* kPrefix = "step-";
constexpr const char* kPartialSuffix = ".partial";

struct StepFolder {
  int64_t step;
  fs::path path;
  bool partial;  // a save's partial_checkpoint_dir
};

// Every step-N and step-N.partial folder under `root`, newest (largest step) first.
std::vector<StepFolder> step_folders_newest_first(const fs::path& root) {
  std::vector<StepFolder> out;
  if (!fs::is_directory(root)) return out;
  const std::string suffix = kPartialSuffix;
  for (const fs::directory_entry& entry : fs::directory_iterator(root)) {
    if (!entry.is_directory()) continue;
    const std::string name = entry.path().filename().string();
    const bool partial = name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(),
                                                                     suffix) == 0;
    if (auto step = checkpoint_step(partial ? name.substr(0, name.size() - suffix.size()) : name))
      out.push_back({*step, entry.path(), partial});
  }
  std::sort(out.begin(), out.end(), [](const StepFolder& a, const StepFolder& b) { return a.step > b.step; });
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

fs::path partial_checkpoint_dir(const fs::path& dir) { return fs::path(dir.string() + kPartialSuffix); }

fs::path begin_partial_checkpoint(const fs::path& dir) {
  const fs::path partial = partial_checkpoint_dir(dir);
  if (fs::exists(partial)) log::info("removing {}, left by an interrupted save", partial.string());
  fs::remove_all(partial);
  fs::create_directories(partial);
  fsync_directory(partial.parent_path());
  return partial;
}

void publish_checkpoint(const fs::path& dir) {
  if (fs::exists(dir)) {
    log::info("replacing the older folder {} with this save", dir.string());
    fs::remove(dir / kCompletionMarker);  // first: a crash mid-removal leaves an incomplete folder
    fs::remove_all(dir);
  }
  fs::rename(partial_checkpoint_dir(dir), dir);
  fsync_directory(dir.parent_path());
}

void abandon_partial_checkpoint(const fs::path& dir) noexcept {
  std::error_code ignored;
  fs::remove_all(partial_checkpoint_dir(dir), ignored);
}

std::optional<fs::path> newest_complete_checkpoint(const fs::path& root) {
  for (const StepFolder& folder : step_folders_newest_first(root)) {
    if (folder.partial) {
      log::warning("checkpoint save {} was interrupted (the run stopped while saving it); skipping it",
                   folder.path.string());
      continue;
    }
    if (is_complete_checkpoint(folder.path)) return folder.path;
    log::warning("checkpoint {} is incomplete (no {}: the run stopped while saving it); skipping it",
                 folder.path.string(), kCompletionMarker);
  }
  return std::nullopt;
}

void remove_old_checkpoints(const fs::path& root, int64_t keep) {
  int64_t complete_seen = 0;
  for (const StepFolder& folder : step_folders_newest_first(root)) {
    if (folder.partial) {
      log::info("removing {}, left by an interrupted save", folder.path.string());
      fs::remove_all(folder.path);
      continue;
    }
    if (keep <= 0) continue;
    const bool complete = is_complete_checkpoint(folder.path);
    if (complete) ++complete_seen;
    // Incomplete folders newer than the newest complete one are left alone (complete_seen is still 0 there).
    const bool remove = complete ? complete_seen > keep : complete_seen > 0;
    if (!remove) continue;
    log::info("removing {} checkpoint {} (checkpoint.keep={})", complete ? "old" : "incomplete", folder.path.string(),
              keep);
    fs::remove(folder.path / kCompletionMarker);  // first: a crash mid-removal leaves an incomplete folder
    fs::remove_all(folder.path);
  }
}

}  // namespace meshtrain::checkpoint
