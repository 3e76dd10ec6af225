// multihost_test.cpp — real host processes over loopback: collectives per mesh axis, and failures ending the job.
#include "runtime/process_runner.hpp"

#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <regex>

namespace meshtrain::testing {
namespace {

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

void expect_commcheck_passes(int hosts, int devices, const std::vector<std::string>& overrides) {
  std::vector<std::string> args{"run", "--hosts", std::to_string(hosts), "--devices-per-host", std::to_string(devices),
                                "--", "commcheck"};
  args.insert(args.end(), overrides.begin(), overrides.end());
  ProcessResult r = run_meshtrain(args, 180);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output, "commcheck passed on host"), hosts) << r.output;
  EXPECT_EQ(count(r.output, "All processes synchronized"), hosts) << r.output;
  // Every host logs one line per group kind (data, fsdp, tensor, expert, context, (data,fsdp), world).
  EXPECT_EQ(count(r.output, "all correct"), 8 * hosts) << r.output;
  EXPECT_EQ(count(r.output, "commcheck over world"), hosts) << r.output;
  EXPECT_EQ(count(r.output, "commcheck global tensors: "), hosts) << r.output;
  EXPECT_NE(r.output.find("[host 1] "), std::string::npos) << r.output;
}

TEST(MultiHostSlowTest, CommcheckFsdpAcrossTwoHosts) {
  expect_commcheck_passes(2, 2, {"ici_mesh.fsdp=4"});
}

TEST(MultiHostSlowTest, CommcheckDcnDataIciFsdp) {
  expect_commcheck_passes(2, 2, {"ici_mesh.fsdp=2", "dcn_mesh.data=2"});
}

TEST(MultiHostSlowTest, CommcheckThreeAxesMultiSlice) {
  expect_commcheck_passes(2, 2, {"ici_mesh.fsdp=1", "ici_mesh.tensor=2", "dcn_mesh.fsdp=2"});
  expect_commcheck_passes(2, 4, {"ici_mesh.data=2", "ici_mesh.fsdp=2", "dcn_mesh.fsdp=2"});
}

TEST(MultiHostSlowTest, SeedLayoutLogsMeshLikeTorchprime) {
  ProcessResult r = run_meshtrain(
      {"run", "--hosts", "2", "--devices-per-host", "4", "--", "commcheck", "ici_mesh.fsdp=4", "dcn_mesh.fsdp=2"}, 180);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(count(r.output,
                  "Logical mesh shape: OrderedDict([('data', 1), ('fsdp', 8), ('tensor', 1), ('expert', 1), "
                  "('context', 1), ('pipeline', 1)])"),
            2);
  EXPECT_EQ(count(r.output, "Logical mesh device assignments: [0 1 2 3 4 5 6 7]"), 2);
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(\[host 1\]\s+6\s+1\s+2\s+1\s+data=0 fsdp=6 tensor=0 expert=0)")))
      << r.output;
}

constexpr double kFailureBoundS = 20;  // runtime.failure_timeout_s=4 plus start-up and slack

TEST(MultiHostSlowTest, AnExceptionOnOneDeviceEndsEveryHost) {
  ProcessResult r = run_meshtrain({"run", "--hosts", "2", "--devices-per-host", "2", "--", "commcheck",
                                   "--iterations", "1000000", "--inject-failure", "3", "runtime.failure_timeout_s=4"},
                                  120);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, -2) << "timed out: " << r.output;
  EXPECT_LT(r.seconds, kFailureBoundS + 15) << r.output;
  // The failing host names its failure and exits 1; the other says it ended because of that one, and exits 3.
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex(R"(\[host 1\] .*host 1 device 3 failed: failure injected on device 3 \(--inject-failure\))")))
      << r.output;
  EXPECT_TRUE(std::regex_search(
      r.output, std::regex(R"(\[host 0\] .*the job was aborted: host 1 device 3 failed: failure injected on device 3)")))
      << r.output;
  EXPECT_NE(r.output.find("[meshtrain run] host 1 exited with code 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[meshtrain run] host 0 exited with code 3"), std::string::npos) << r.output;
}

void kill_host_and_expect_job_end(int victim) {
  std::atomic<int> victim_pid{0};
  std::atomic<int> synchronized{0};
  std::atomic<bool> killed{false};
  std::chrono::steady_clock::time_point kill_time;
  const std::regex pid_line(R"(\[host (\d+)\] .*Host \d+ of \d+ \(from .*, pid (\d+)\))");
  ProcessResult r = run_meshtrain(
      {"run", "--hosts", "3", "--devices-per-host", "1", "--kill-grace", "60", "--", "commcheck", "--iterations",
       "100000000", "runtime.failure_timeout_s=4", "runtime.heartbeat_interval_s=0.5"},
      120, [&](const std::string& line) {
        std::smatch m;
        if (std::regex_search(line, m, pid_line) && std::stoi(m[1]) == victim) victim_pid = std::stoi(m[2]);
        if (line.find("All processes synchronized") != std::string::npos) ++synchronized;
        if (line.find("commcheck over world") != std::string::npos && !killed && victim_pid > 0 &&
            synchronized == 3) {
          killed = true;
          kill_time = std::chrono::steady_clock::now();
          ::kill(victim_pid, SIGKILL);
        }
      });
  ASSERT_TRUE(killed) << r.output;
  const double after_kill = std::chrono::duration<double>(std::chrono::steady_clock::now() - kill_time).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, -2) << "timed out: " << r.output;
  EXPECT_LT(after_kill, kFailureBoundS) << r.output;
  // Every surviving host names the dead one as the reason it stopped, exits 3, and none claims success.
  const std::string reason = victim == 0 ? "(lost contact with|has had no answer from) the job's coordinator \\(host 0"
                                         : "host " + std::to_string(victim) + " stopped responding";
  for (int h = 0; h < 3; ++h) {
    if (h == victim) continue;
    EXPECT_TRUE(std::regex_search(r.output, std::regex("\\[host " + std::to_string(h) + "\\] .*ERROR.*" + reason)))
        << "host " << h << " must name the reason: " << r.output;
    EXPECT_NE(r.output.find("[meshtrain run] host " + std::to_string(h) + " exited with code 3"), std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("commcheck passed on host " + std::to_string(h)), std::string::npos) << r.output;
  }
}

TEST(MultiHostSlowTest, KillingAWorkerHostEndsTheJob) { kill_host_and_expect_job_end(2); }

TEST(MultiHostSlowTest, KillingTheCoordinatorHostEndsTheJob) { kill_host_and_expect_job_end(0); }

}  // namespace
}  // namespace meshtrain::testing
