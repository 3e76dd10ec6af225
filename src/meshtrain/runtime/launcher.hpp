// launcher.hpp — `meshtrain run`: starts the host processes of a job.
//
// Local mode (--hosts H): starts H host processes on this machine (simulated hosts) running the same verb, gives each
// its identity and a fresh job secret through MESHTRAIN_* environment variables, prefixes every output line with
// "[host i] ", and exits with the first failing host's exit code (hosts still running a grace period later are
// killed). A stop signal (SIGTERM, SIGINT) is passed on to every host as SIGTERM: they save and exit 0; a second one
// kills them.
// Node mode (otherwise): this process becomes this node's host (exec), its identity taken from --nnodes/--node-rank/
// --master-addr/--master-port or from the environment that torchrun, Slurm or OpenMPI set (host_identity.hpp).
#pragma once

#include "meshtrain/runtime/host_identity.hpp"

#include <string>
#include <vector>

namespace meshtrain::runtime {

struct LocalLaunch {
  int hosts = 1;
  int devices_per_host = 1;
  int master_port = 0;         // 0: pick a free port
  std::string iface;           // the interface Gloo binds to (--iface); empty: GLOO_SOCKET_IFNAME or loopback
  double kill_grace_s = 60;    // after the first failure, how long the other hosts get to end by themselves
  std::string executable;      // the meshtrain binary
  std::vector<std::string> verb_args;  // the verb and its arguments
};

// Runs the job and returns the launcher's exit code.
int launch_local(const LocalLaunch& launch);

// Replaces this process with the verb, as host `identity.host` of the job (does not return on success); the verb gets
// identity.job_secret in MESHTRAIN_JOB_SECRET.
[[noreturn]] void exec_as_host(const HostIdentity& identity, const std::string& executable,
                               const std::vector<std::string>& verb_args);

// The path of the running executable.
std::string self_executable();

}  // namespace meshtrain::runtime
