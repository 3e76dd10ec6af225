// job_options.cpp — shared job flags, settings + identity + mesh loading, and the mesh log lines.
#include "meshtrain/cli/job_options.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/common/log.hpp"
#include "meshtrain/common/atomic_file.hpp"
#include "meshtrain/model/compute_matmul.hpp"
#include "meshtrain/runtime/compute_threads.hpp"

#include <filesystem>
#include <optional>

namespace meshtrain::cli {

void add_job_options(CLI::App& app, JobOptions& options) {
  app.add_option("--devices-per-host", options.host_flags.devices_per_host,
                 "devices on this host (virtual CPU devices: worker threads); default $MESHTRAIN_DEVICES_PER_HOST or 1");
  app.add_option("--nnodes", options.host_flags.nnodes, "number of hosts in the job");
  app.add_option("--node-rank", options.host_flags.node_rank, "this host's index in [0, nnodes)");
  app.add_option("--master-addr", options.host_flags.master_addr, "address of host 0 (the coordinator)");
  app.add_option("--master-port", options.host_flags.master_port, "coordinator port on host 0");
  app.add_option("--iface", options.host_flags.iface,
                 "network interface the collectives bind to; default $MESHTRAIN_IFACE, $GLOO_SOCKET_IFNAME, else the "
                 "one that routes to the master address");
  app.add_option("--secret-file", options.host_flags.secret_file,
                 "the job secret (a file of mode 0600, the same on every host) that admits hosts to the job's control "
                 "plane; default $MESHTRAIN_JOB_SECRET, $MESHTRAIN_SECRET_FILE");
  app.add_option("--config-dir", options.config_dir, "folder with defaults.yaml and config groups");
  app.add_option("overrides", options.overrides, "config overrides: key=value, group=name (e.g. ici_mesh.fsdp=4)");
}

Job load_job(const JobOptions& options) {
  runtime::HostIdentity identity = runtime::resolve_host_identity(options.host_flags);
  runtime::attach_job_secret(identity, options.host_flags);
  if (identity.job_secret.empty())
    log::warning("no job secret ({}): any process on this machine can reach the job's control plane; "
                 "`meshtrain run --hosts N` makes one", identity.job_secret_source);
  try {
    std::filesystem::path dir =
        options.config_dir.empty() ? config::default_config_dir() : std::filesystem::path(options.config_dir);
    settings::Settings settings = settings::Settings::from_config(config::Config::load(dir, options.overrides));
    log::set_level(settings.log_level);
    mesh::Mesh mesh =
        mesh::Mesh::create(settings.mesh.ici, settings.mesh.dcn, identity.hosts, identity.devices_per_host);
    const int threads =
        runtime::resolve_threads_per_device(settings.runtime.threads_per_device, identity.devices_per_host);
    const torch::Dtype compute_dtype = model::torch_dtype(settings.compute_dtype);
    // How this host's bf16 matmuls run, decided before the restart: an fp32 GEMM runs in OpenBLAS, as fp32 compute's
    // do, and wants the same OpenMP setting. A restarted process probes again (~0.1 s) and logs the line once.
    std::optional<model::Bf16MatmulChoice> bf16;
    if (compute_dtype == torch::kBFloat16) {
      const runtime::ThreadCountGuard probe_threads(threads);
      bf16 = model::choose_bf16_matmul(settings.bf16_matmul, settings.model.hidden_size);
      model::set_bf16_matmul(bf16->path);
    }
    runtime::restart_with_passive_openmp_waits(threads, model::gemm_dtype(compute_dtype));
    if (bf16) log::info("{}", bf16->describe());
    log_and_save_config(settings, identity.host);
    return Job{std::move(settings), identity, std::move(mesh)};
  } catch (const std::exception& e) {
    if (identity.hosts > 1)
      runtime::publish_startup_failure(
          identity, e.what(),
          dynamic_cast<const UserError*>(&e) ? runtime::kExitUsage : runtime::kExitThisHostFailed);
    throw;
  }
}

void run_job(runtime::HostRuntime& runtime, int host, const std::function<void()>& body) {
  try {
    body();
  } catch (const UserError& e) {
    runtime.abort_job(fmt::format("host {} failed: {}", host, e.what()), runtime::kExitUsage);
  } catch (const std::exception& e) {
    runtime.abort_job(fmt::format("host {} failed: {}", host, e.what()), runtime::kExitThisHostFailed);
  }
}

void log_mesh(const mesh::Mesh& mesh) {
  log::info("Logical mesh shape: {}", mesh.shape_string());
  log::info("Logical mesh device assignments: {}", mesh.assignments_string());
  log::info("Mesh: ici_mesh {} per slice x dcn_mesh {} slices; {} hosts x {} devices per host",
            mesh.ici().equation(), mesh.dcn().equation(), mesh.hosts(), mesh.devices_per_host());
  log::block(mesh.device_table());
}

void log_and_save_config(const settings::Settings& settings, int host) {
  log::info("Resolved config:\n{}", settings.resolved_yaml());
  if (host != 0) return;
  const std::filesystem::path path = settings.output_dir / "config.yaml";
  std::filesystem::create_directories(settings.output_dir);
  write_file_atomically(path, settings.resolved_yaml());
  log::info("Resolved config saved to {}", path.string());
}

}  // namespace meshtrain::cli
