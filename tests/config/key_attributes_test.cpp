// key_attributes_test.cpp — the attributes of config keys: what changes a run's results, what hosts may set
// differently, groups giving theirs to every key under them, and unknown keys taking the strict default.
#include "meshtrain/config/key_attributes.hpp"

#include <gtest/gtest.h>

namespace meshtrain::config {
namespace {

TEST(KeyAttributesTest, TrajectoryKeysChangeResultsAndAreTheSameOnEveryHost) {
  for (const char* key : {"seed", "global_batch_size", "optimizer.learning_rate", "model.hidden_size", "max_steps"}) {
    EXPECT_TRUE(key_attributes(key).changes_results) << key;
    EXPECT_FALSE(key_attributes(key).may_differ_between_hosts) << key;
  }
}

TEST(KeyAttributesTest, LayoutAndBookkeepingKeysDoNotChangeResults) {
  for (const char* key : {"checkpoint.save_steps", "ici_mesh.fsdp", "dcn_mesh.data", "data.input_sharding",
                          "metrics.peak_gflops", "activation_checkpointing", "eval.every_steps", "defaults"}) {
    EXPECT_FALSE(key_attributes(key).changes_results) << key;
    EXPECT_FALSE(key_attributes(key).may_differ_between_hosts) << key;
  }
}

TEST(KeyAttributesTest, HostLocalKeysMayDifferBetweenHosts) {
  for (const char* key : {"output_dir", "log_level", "runtime.threads_per_device", "data.loader_threads"})
    EXPECT_TRUE(key_attributes(key).may_differ_between_hosts) << key;
  // Its group's attributes, not its sibling's.
  EXPECT_FALSE(key_attributes("runtime.collective_timeout_s").may_differ_between_hosts);
  EXPECT_TRUE(key_attributes("dataset.path").changes_results);
  EXPECT_TRUE(key_attributes("dataset.path").may_differ_between_hosts);
}

TEST(KeyAttributesTest, AGroupCoversTheKeysUnderItOnly) {
  EXPECT_TRUE(key_attributes("metricsx").changes_results);  // "metrics." covers "metrics.x", not "metricsx"
  EXPECT_FALSE(key_attributes("metrics.x").changes_results);
  EXPECT_TRUE(key_attributes("a.key.nobody.declared").changes_results);
}

}  // namespace
}  // namespace meshtrain::config
