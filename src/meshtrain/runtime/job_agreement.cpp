// job_agreement.cpp — JobFacts as JSON, the host-local keys, and the per-host comparison with its refusal text.
#include "meshtrain/runtime/job_agreement.hpp"


#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

namespace meshtrain::runtime {
namespace {

// "0.003 on host 0; 0.001 on hosts 1,2": each distinct value with the hosts that have it (a missing key is "(unset)").
std::string values_by_host(const std::vector<std::string>& values) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int h = 0; h < static_cast<int>(values.size()); ++h) {
    auto group = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == values[h]; });
    if (group == groups.end())
      groups.emplace_back(values[h], std::vector<int>{h});
    else
      group->second.push_back(h);
  }
  std::vector<std::string> parts;
  for (const auto& [value, hosts] : groups)
    parts.push_back(fmt::format("'{}' on host{} {}", value, hosts.size() == 1 ? "" : "s", fmt::join(hosts, ",")));
  return fmt::format("{}", fmt::join(parts, "; "));
}

// Adds "<what>: <values by host>" to `out` when the hosts' values differ.
void compare_field(const std::string& what, const std::vector<std::string>& values, std::vector<std::string>& out) {
  if (std::adjacent_find(values.begin(), values.end(), std::not_equal_to<>()) != values.end())
    out.push_back(fmt::format("{}: {}", what, values_by_host(values)));
}

}  // namespace

nlohmann::json JobFacts::to_json() const {
  return {{"config", config},   {"build", build},           {"dataset", dataset},
          {"resume", resume},   {"shared_dir", shared_dir}, {"mfu_peak", mfu_peak}};
}

JobFacts JobFacts::from_json(const nlohmann::json& json) {
  JobFacts facts;
  facts.config = json.at("config").get<std::map<std::string, std::string>>();
  facts.build = json.at("build").get<std::string>();
  facts.dataset = json.at("dataset").get<std::string>();
  facts.resume = json.at("resume").get<std::string>();
  facts.shared_dir = json.at("shared_dir").get<std::string>();
  facts.mfu_peak = json.at("mfu_peak");
  return facts;
}

std::string compare_job_facts(const std::vector<JobFacts>& facts, const std::vector<std::vector<int>>& unseen) {
  std::vector<std::string> differences;
  std::set<std::string> keys;
  for (const JobFacts& f : facts)
    for (const auto& [key, value] : f.config) keys.insert(key);
  for (const std::string& key : keys) {
    std::vector<std::string> values;
    for (const JobFacts& f : facts) {
      auto found = f.config.find(key);
      values.push_back(found == f.config.end() ? "(unset)" : found->second);
    }
    compare_field("config key " + key, values, differences);
  }
  auto field_of = [&](auto member) {
    std::vector<std::string> values;
    for (const JobFacts& f : facts) values.push_back(f.*member);
    return values;
  };
  compare_field("build of meshtrain (GNU build-id)", field_of(&JobFacts::build), differences);
  compare_field("dataset fingerprint", field_of(&JobFacts::dataset), differences);
  compare_field("checkpoint to resume from", field_of(&JobFacts::resume), differences);
  for (size_t h = 0; h < unseen.size(); ++h)
    if (!unseen[h].empty())
      differences.push_back(fmt::format(
          "host {} cannot see the files host{} {} wrote in {} (output_dir must be one storage shared by every host "
          "when checkpoints are saved)",
          h, unseen[h].size() == 1 ? "" : "s", fmt::join(unseen[h], ","), facts.at(h).shared_dir));
  if (differences.empty()) return "";
  return fmt::format("the {} hosts do not agree on the job, so none of them starts it: {}", facts.size(),
                     fmt::join(differences, " | "));
}

}  // namespace meshtrain::runtime
