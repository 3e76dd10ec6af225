// train_command.cpp — `meshtrain train`: one host of a training job (start every host with `meshtrain run`).
#include "meshtrain/cli/commands.hpp"
#include "meshtrain/cli/job_options.hpp"
#include "meshtrain/runtime/host_runtime.hpp"
#include "meshtrain/runtime/preemption.hpp"
#include "meshtrain/train/trainer.hpp"

namespace meshtrain::cli {

int train_command(int argc, char** argv) {
  CLI::App app{"Train a Llama over the mesh on this host's devices (start every host with `meshtrain run`).",
               "meshtrain train"};
  JobOptions options;
  add_job_options(app, options);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  runtime::install_preemption_handlers();
  Job job = load_job(options);
  log_mesh(job.mesh);
  runtime::HostRuntime runtime(job.identity, job.mesh, job.settings.runtime);
  run_job(runtime, job.identity.host, [&] { train::train_host(job.settings, job.mesh, job.identity.host, runtime); });
  return 0;
}

}  // namespace meshtrain::cli
