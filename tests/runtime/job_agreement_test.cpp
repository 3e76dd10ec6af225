// job_agreement_test.cpp — the start-up comparison of the hosts' facts: agreement, and refusals that name each
// differing key or value per host.
#include "meshtrain/runtime/job_agreement.hpp"

#include <gtest/gtest.h>

namespace meshtrain::runtime {
namespace {

JobFacts facts_of(const std::map<std::string, std::string>& config) {
  JobFacts f;
  f.config = config;
  f.build = "b1";
  f.dataset = "d1";
  f.resume = "none (a new run)";
  f.shared_dir = "/shared/run";
  return f;
}

TEST(JobAgreementTest, IdenticalFactsAgree) {
  const JobFacts f = facts_of({{"seed", "42"}});
  EXPECT_EQ(compare_job_facts({f, f, f}, {{}, {}, {}}), "");
}

TEST(JobAgreementTest, ADifferentConfigValueIsNamedWithEachHostsValue) {
  const JobFacts a = facts_of({{"optimizer.learning_rate", "3.0e-3"}, {"seed", "42"}});
  const JobFacts b = facts_of({{"optimizer.learning_rate", "0.001"}, {"seed", "42"}});
  const std::string refusal = compare_job_facts({a, b, a}, {{}, {}, {}});
  EXPECT_NE(refusal.find("the 3 hosts do not agree on the job"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("config key optimizer.learning_rate: '3.0e-3' on hosts 0,2; '0.001' on host 1"),
            std::string::npos)
      << refusal;
  EXPECT_EQ(refusal.find("seed"), std::string::npos) << refusal;
}

TEST(JobAgreementTest, AKeyOnlyOneHostHasIsNamed) {
  const JobFacts a = facts_of({{"seed", "42"}});
  const JobFacts b = facts_of({{"seed", "42"}, {"extra", "1"}});
  EXPECT_NE(compare_job_facts({a, b}, {{}, {}}).find("config key extra: '(unset)' on host 0; '1' on host 1"),
            std::string::npos);
}

TEST(JobAgreementTest, BuildDatasetAndResumePointAreCompared) {
  JobFacts a = facts_of({}), b = facts_of({});
  b.build = "b2";
  b.dataset = "d2";
  b.resume = "step 20 (data epoch 0 step 20)";
  const std::string refusal = compare_job_facts({a, b}, {{}, {}});
  EXPECT_NE(refusal.find("build of meshtrain (GNU build-id): 'b1' on host 0; 'b2' on host 1"), std::string::npos)
      << refusal;
  EXPECT_NE(refusal.find("dataset fingerprint: 'd1' on host 0; 'd2' on host 1"), std::string::npos) << refusal;
  EXPECT_NE(refusal.find("checkpoint to resume from: 'none (a new run)' on host 0; 'step 20"), std::string::npos)
      << refusal;
}

TEST(JobAgreementTest, StorageOneHostCannotSeeIsNamed) {
  const JobFacts f = facts_of({});
  const std::string refusal = compare_job_facts({f, f}, {{}, {0}});
  EXPECT_NE(refusal.find("host 1 cannot see the files host 0 wrote in /shared/run"), std::string::npos) << refusal;
}

TEST(JobAgreementTest, FactsRoundTripThroughJson) {
  const JobFacts f = facts_of({{"seed", "42"}});
  const JobFacts back = JobFacts::from_json(nlohmann::json::parse(f.to_json().dump()));
  EXPECT_EQ(back.config, f.config);
  EXPECT_EQ(back.build, f.build);
  EXPECT_EQ(back.shared_dir, f.shared_dir);
}

}  // namespace
}  // namespace meshtrain::runtime
