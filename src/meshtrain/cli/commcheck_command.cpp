// commcheck_command.cpp — `meshtrain commcheck`: every collective over every mesh axis, results checked.
//
// Run it under `meshtrain run` to check a job's mesh and network before training: each device computes what each
// collective must return from the device ids alone, so a wrong rank order, a wrong group or a lost message fails
// loudly with the device and the values. Then global tensors are built, gathered, redistributed and replica-checked
// over the real devices (sharding::check_global_tensors). --inject-failure D makes device D throw, to see how a job ends.
#include "meshtrain/cli/commands.hpp"
#include "meshtrain/cli/job_options.hpp"
#include "meshtrain/common/build_id.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/common/log.hpp"
#include "meshtrain/runtime/host_runtime.hpp"
#include "meshtrain/sharding/global_tensor.hpp"

#include <mutex>

namespace meshtrain::cli {
namespace {

using mesh::Axis;

void expect_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what, int device) {
  MT_CHECK(got.sizes() == want.sizes() && at::equal(got.to(want.scalar_type()), want),
           "commcheck: {} on device {} returned {} but {} was expected", what, device,
           fmt::format("{}", fmt::join(got.to(at::kFloat).flatten().data_ptr<float>(),
                                        got.to(at::kFloat).flatten().data_ptr<float>() + got.numel(), " ")),
           fmt::format("{}", fmt::join(want.to(at::kFloat).flatten().data_ptr<float>(),
                                        want.to(at::kFloat).flatten().data_ptr<float>() + want.numel(), " ")));
}

// Runs each collective over the device's group along `axes` and checks the result against the device ids.
void check_group(runtime::DeviceContext& ctx, const std::vector<Axis>& axes) {
  runtime::Comm& comm = ctx.over(axes);
  const std::vector<int> members = ctx.mesh().group_of(ctx.device(), axes);
  const int n = static_cast<int>(members.size()), rank = comm.rank(), device = ctx.device();
  MT_CHECK(comm.size() == n && members[rank] == device, "commcheck: device {} has rank {} of {} over {}, expected "
           "position {} of {}", device, rank, comm.size(), comm.label(), rank, n);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const std::string over = " over " + comm.label();

  at::Tensor sum_want = at::zeros({4}, f32);
  for (int m : members) sum_want += m + 1;
  at::Tensor x = at::full({4}, device + 1, f32);
  comm.allreduce_sum(x);
  expect_equal(x, sum_want, "allreduce" + over, device);

  at::Tensor x_bf16 = at::full({4}, device + 1, f32).to(at::kBFloat16);
  comm.allreduce_sum(x_bf16);
  expect_equal(x_bf16, sum_want.to(at::kBFloat16), "bf16 allreduce" + over, device);

  std::vector<at::Tensor> gathered_want;
  for (int m : members) gathered_want.push_back(at::full({2, 3}, m, f32));
  expect_equal(comm.allgather(at::full({2, 3}, device, f32)), at::cat(gathered_want, 0), "allgather" + over, device);

  at::Tensor b = at::full({3}, device, f32);
  comm.broadcast(b, 0);
  expect_equal(b, at::full({3}, members[0], f32), "broadcast" + over, device);

  // Chunk j of device m holds (m + 1) * (j + 1): rank r receives sum over m of (m + 1) * (r + 1).
  std::vector<at::Tensor> chunks;
  for (int j = 0; j < n; ++j) chunks.push_back(at::full({2}, (device + 1) * (j + 1), f32));
  at::Tensor scattered_want = at::full({2}, 0.0, f32);
  for (int m : members) scattered_want += (m + 1) * (rank + 1);
  expect_equal(comm.reduce_scatter_sum(at::cat(chunks, 0)), scattered_want, "reduce_scatter" + over, device);

  // Chunk j of device m holds m * 100 + j: rank r receives members[i] * 100 + r from each rank i.
  std::vector<at::Tensor> sends, receives;
  for (int j = 0; j < n; ++j) sends.push_back(at::full({1}, device * 100 + j, f32));
  for (int i = 0; i < n; ++i) receives.push_back(at::full({1}, members[i] * 100 + rank, f32));
  expect_equal(comm.all_to_all(at::cat(sends, 0)), at::cat(receives, 0), "all_to_all" + over, device);

  comm.barrier();
}

}  // namespace

int commcheck_command(int argc, char** argv) {
  CLI::App app{"Run every collective over every mesh axis and check the results (start it with `meshtrain run`).",
               "meshtrain commcheck"};
  JobOptions options;
  int iterations = 1;
  std::optional<int> inject_failure;
  add_job_options(app, options);
  app.add_option("--iterations", iterations, "repeat the checks this many times")->capture_default_str();
  app.add_option("--inject-failure", inject_failure, "make this global device throw after the first round");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  Job job = load_job(options);
  log_mesh(job.mesh);
  runtime::HostRuntime runtime(job.identity, job.mesh, job.settings.runtime);
  runtime::JobFacts facts;
  facts.config = job.settings.host_shared();
  facts.build = build_id();
  facts.resume = "none (commcheck)";
  runtime.agree_on_job(facts);

  const std::vector<std::vector<Axis>> groups = {
      {Axis::data}, {Axis::fsdp}, {Axis::tensor}, {Axis::expert}, {Axis::context}, {Axis::pipeline},
      {Axis::data, Axis::fsdp},
      std::vector<Axis>(mesh::kAllAxes.begin(), mesh::kAllAxes.end())};  // the last: the world
  std::mutex log_mutex;
  runtime.run_on_devices([&](runtime::DeviceContext& ctx) {
    const bool reporter = ctx.info().local == 0;
    for (int it = 0; it < iterations; ++it) {
      for (const auto& axes : groups) {
        check_group(ctx, axes);
        if (reporter && it == 0)
          log::info("commcheck over {}: {} group(s) of {} device(s): allreduce (fp32, bf16), allgather, broadcast, "
                    "reduce_scatter, all_to_all, barrier all correct",
                    ctx.over(axes).label(), ctx.mesh().num_devices() / ctx.mesh().size_along(axes),
                    ctx.mesh().size_along(axes));
      }
      if (it == 0) {
        sharding::check_global_tensors(ctx);
        if (reporter)
          log::info("commcheck global tensors: built from host-local data with no collective, gathered, "
                    "redistributed and replica-checked (a corrupted replica caught) correctly");
      }
      ctx.report_progress(it + 1);  // for the runtime's hang detection (runtime.step_timeout_s)
      if (inject_failure && *inject_failure == ctx.device())
        throw Error(fmt::format("failure injected on device {} (--inject-failure)", ctx.device()));
    }
    std::lock_guard<std::mutex> lock(log_mutex);
    log::info("device {} (host {}, {}): collectives issued: {}", ctx.device(), ctx.host(),
              ctx.mesh().coords_string(ctx.device()), ctx.counters().summary());
  });
  log::info("commcheck passed on host {}", job.identity.host);
  return 0;
}

}  // namespace meshtrain::cli
