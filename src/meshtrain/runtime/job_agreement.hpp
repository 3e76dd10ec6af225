// job_agreement.hpp — what every host of a job must agree on before any collective exists, and the comparison.
//
// Each host publishes its JobFacts to the coordinator's store; host 0 compares them (compare_job_facts) and
// publishes the verdict; a difference refuses the job on every host (exit 2), naming each differing key or value
// per host. HostRuntime::agree_on_job runs the protocol.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

namespace meshtrain::runtime {

struct JobFacts {
  std::map<std::string, std::string> config;  // settings::Settings::host_shared(): keys equal on all hosts -> value
  std::string build;                          // build_id() of the binary
  std::string dataset;                        // the dataset's fingerprint ("" when the verb reads none)
  std::string resume;                         // the checkpoint it would resume from: "step 20 (data epoch 0 step 20)"
  std::string shared_dir;                     // a folder every host must see as one storage ("" when none is needed)
  // What host 0 decides for every host (not compared): the MFU denominator (train/metrics.hpp, PeakFlops).
  nlohmann::json mfu_peak;

  nlohmann::json to_json() const;
  static JobFacts from_json(const nlohmann::json& json);
};

// The refusal for `facts` (index = host) and, per host, the hosts whose marker files it could not see in its
// shared_dir; "" when every host agrees.
std::string compare_job_facts(const std::vector<JobFacts>& facts, const std::vector<std::vector<int>>& unseen);

}  // namespace meshtrain::runtime
