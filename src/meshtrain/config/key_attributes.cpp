// key_attributes.cpp — the table of keys (and groups, ending in '.') that do not change results or may differ
// between hosts; every other key changes results and is the same on every host.
#include "meshtrain/config/key_attributes.hpp"

namespace meshtrain::config {
namespace {

struct KeyEntry {
  const char* key;  // a key, or a group ending in '.'
  KeyAttributes attributes;
};

constexpr KeyAttributes kNeither{/*changes_results=*/false, /*may_differ_between_hosts=*/false};
constexpr KeyAttributes kHostLocal{/*changes_results=*/false, /*may_differ_between_hosts=*/true};

// Searched in order: a key's entry comes before its group's. How a run lays itself out over devices (the mesh, the
// input sharding, parallel.*, memory) does not change what it computes: a run may resume on another mesh. What
// evaluation changes in the training data (the held-out split) is in the data state.
constexpr KeyEntry kEntries[] = {
    {"defaults", kNeither},                   // the config-group list; the groups' keys are in the tree
    {"output_dir", kHostLocal},
    {"log_level", kHostLocal},
    {"logging_steps", kNeither},
    {"checkpoint.", kNeither},
    {"debug.", kNeither},
    {"runtime.threads_per_device", kHostLocal},
    {"runtime.", kNeither},
    {"metrics.", kNeither},
    {"data.prefetch_steps", kHostLocal},
    {"data.loader_threads", kHostLocal},
    {"data.input_sharding", kNeither},
    {"parallel.", kNeither},
    {"ici_mesh.", kNeither},
    {"dcn_mesh.", kNeither},
    {"activation_checkpointing", kNeither},
    {"memory.", kNeither},
    // How bf16 matmuls run (native, or fp32 GEMMs of bf16 values): the same numerics up to summation order, so a run
    // may resume on another CPU.
    {"bf16_matmul", kNeither},
    {"eval.", kNeither},
    // Each host names its copy of the data; the data's identity (files, counts, checksums) is compared instead.
    {"dataset.path", {/*changes_results=*/true, /*may_differ_between_hosts=*/true}},
};

}  // namespace

KeyAttributes key_attributes(const std::string& key) {
  for (const KeyEntry& entry : kEntries) {
    const std::string name = entry.key;
    if (name.back() == '.' ? key.rfind(name, 0) == 0 : key == name) return entry.attributes;
  }
  return KeyAttributes{};
}

}  // namespace meshtrain::config
