// host_identity.hpp — who this host process is in the job: host index, host count, devices, coordinator address.
//
// Resolved from, in order of precedence: command-line flags (--nnodes/--node-rank/--master-addr/--master-port,
// --devices-per-host, --iface), meshtrain's own environment (MESHTRAIN_HOST, MESHTRAIN_HOSTS,
// MESHTRAIN_MASTER_ADDR, MESHTRAIN_MASTER_PORT, MESHTRAIN_DEVICES_PER_HOST, MESHTRAIN_IFACE; set by
// `meshtrain run`), torchrun's (GROUP_RANK or RANK, WORLD_SIZE or NNODES, MASTER_ADDR, MASTER_PORT), Slurm's
// (SLURM_PROCID, SLURM_NTASKS, SLURM_STEP_NODELIST or SLURM_JOB_NODELIST for the first node), and OpenMPI's
// (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE).
// With none of these, the job is one host at 127.0.0.1.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace meshtrain::runtime {

struct HostIdentity {
  int host = 0;
  int hosts = 1;
  int devices_per_host = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "default";  // which flags/environment supplied host and hosts, for the log
  std::string iface;  // --iface or MESHTRAIN_IFACE: the interface Gloo binds to; empty: chosen as network.hpp says
  // What admits a connection to the job's control plane (control/secret.hpp); never logged. attach_job_secret sets it.
  std::string job_secret;
  std::string job_secret_source;  // where it came from, for the log
};

struct HostFlags {
  std::optional<int> nnodes, node_rank, devices_per_host, master_port;
  std::optional<std::string> master_addr, iface, secret_file;
};

using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_environment();

HostIdentity resolve_host_identity(const HostFlags& flags, const EnvLookup& env = process_environment());

// Sets identity.job_secret from --secret-file (flags.secret_file), MESHTRAIN_JOB_SECRET or MESHTRAIN_SECRET_FILE
// (control::resolve_job_secret). A job of several hosts whose master address is not loopback (127.x, ::1,
// localhost) and has none is refused with a UserError that says how to make one.
void attach_job_secret(HostIdentity& identity, const HostFlags& flags, const EnvLookup& env = process_environment());

// True for the names of this machine's loopback: 127.x.y.z, ::1, localhost.
bool is_loopback_name(const std::string& address);

// The first host name of a Slurm node list: "node[01-04,07],gpu2" -> "node01".
std::string first_slurm_node(const std::string& nodelist);

// A TCP port on 127.0.0.1 that was free a moment ago (for local jobs and tests), chosen at random below the kernel's
// ephemeral range so that no other process is handed it before the job binds it.
int find_free_port();

}  // namespace meshtrain::runtime
