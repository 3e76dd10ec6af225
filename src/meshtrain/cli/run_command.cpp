// run_command.cpp — `meshtrain run [--hosts H --devices-per-host D | node flags] -- <verb> <args...>`.
#include "meshtrain/cli/commands.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/runtime/launcher.hpp"

#include <CLI/CLI.hpp>

namespace meshtrain::cli {

int run_command(int argc, char** argv) {
  CLI::App app{
      "Start a job's host processes. With --hosts, all H hosts run here (simulated hosts, output prefixed with "
      "[host i]). Without it, this process becomes this node's host of a multi-node job, its identity from the "
      "flags or from the environment of torchrun, Slurm (srun) or OpenMPI (mpirun).",
      "meshtrain run"};
  std::optional<int> hosts;
  runtime::HostFlags flags;
  double kill_grace_s = 60;
  std::vector<std::string> verb_args;
  app.add_option("--hosts", hosts, "simulate this many hosts on this machine");
  app.add_option("--devices-per-host", flags.devices_per_host, "devices per host (virtual CPU devices)");
  app.add_option("--nnodes", flags.nnodes, "hosts in a multi-node job");
  app.add_option("--node-rank", flags.node_rank, "this node's host index");
  app.add_option("--master-addr", flags.master_addr, "address of host 0");
  app.add_option("--master-port", flags.master_port, "coordinator port on host 0 (default: a free port locally)");
  app.add_option("--iface", flags.iface,
                 "network interface the hosts' collectives bind to (default: $GLOO_SOCKET_IFNAME, else the one "
                 "that routes to --master-addr)");
  app.add_option("--secret-file", flags.secret_file,
                 "a multi-node job's secret (mode 0600), the same file on every node; default $MESHTRAIN_JOB_SECRET. "
                 "--hosts makes a fresh one");
  app.add_option("--kill-grace", kill_grace_s, "seconds the other hosts get to end after the first failure")->capture_default_str();
  app.add_option("verb", verb_args, "the verb and its arguments, after --")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  const std::string executable = runtime::self_executable();
  if (hosts) {
    MT_USER_CHECK(!flags.nnodes && !flags.node_rank, "--hosts (simulated hosts here) and --nnodes/--node-rank "
                                                    "(one host of a multi-node job) exclude each other");
    runtime::LocalLaunch launch;
    launch.hosts = *hosts;
    launch.devices_per_host = flags.devices_per_host.value_or(1);
    launch.master_port = flags.master_port.value_or(0);
    launch.iface = flags.iface.value_or("");
    launch.kill_grace_s = kill_grace_s;
    launch.executable = executable;
    launch.verb_args = verb_args;
    return runtime::launch_local(launch);
  }
  runtime::HostIdentity identity = runtime::resolve_host_identity(flags);
  runtime::attach_job_secret(identity, flags);
  runtime::exec_as_host(identity, executable, verb_args);
}

}  // namespace meshtrain::cli
