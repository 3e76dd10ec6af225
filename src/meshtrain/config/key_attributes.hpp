// key_attributes.hpp — what each config key means for a job beyond its value, declared once for every key of
// configs/defaults.yaml (config groups included): whether it changes what a run computes (a resumed run refuses a
// checkpoint trained with another value: checkpoint/training_state.hpp), and whether hosts of one job may set it
// differently (the start-up agreement compares the others: runtime/job_agreement.hpp). A key not in the table's
// groups changes the results and must be equal on every host.
#pragma once

#include <string>

namespace meshtrain::config {

struct KeyAttributes {
  bool changes_results = true;          // part of the run's trajectory: model, data, optimizer, schedule, batch, seed
  bool may_differ_between_hosts = false;  // a host-local choice: where it writes or reads, its threads, its log level
};

// The attributes of `key` ("optimizer.learning_rate"); a group ("checkpoint.") gives them to every key under it.
KeyAttributes key_attributes(const std::string& key);

}  // namespace meshtrain::config
