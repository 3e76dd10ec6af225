// host_identity.cpp — flags and launcher environments (meshtrain, torchrun, Slurm, OpenMPI) to a HostIdentity.
#include "meshtrain/runtime/host_identity.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/control/secret.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <random>

namespace meshtrain::runtime {
namespace {

int parse_int(const std::string& name, const std::string& text) {
  try {
    size_t used = 0;
    int v = std::stoi(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw UserError(fmt::format("{}='{}' is not an integer", name, text));
}

}  // namespace

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v || !*v) return std::nullopt;
    return std::string(v);
  };
}

std::string first_slurm_node(const std::string& nodelist) {
  std::string first;
  size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',' && nodelist[i] != '[') first += nodelist[i++];
  if (i < nodelist.size() && nodelist[i] == '[') {
    ++i;
    std::string index;
    while (i < nodelist.size() && std::isdigit(static_cast<unsigned char>(nodelist[i]))) index += nodelist[i++];
    first += index;
  }
  return first;
}

HostIdentity resolve_host_identity(const HostFlags& flags, const EnvLookup& env) {
  HostIdentity id;
  struct Source {
    const char* name;
    const char* rank;
    const char* size;
  };
  // GROUP_RANK is torchrun's node rank; with one process per node RANK equals it.
  const Source sources[] = {{"meshtrain (MESHTRAIN_HOST/MESHTRAIN_HOSTS)", "MESHTRAIN_HOST", "MESHTRAIN_HOSTS"},
                            {"torchrun (GROUP_RANK/NNODES)", "GROUP_RANK", "NNODES"},
                            {"torchrun (RANK/WORLD_SIZE)", "RANK", "WORLD_SIZE"},
                            {"Slurm (SLURM_PROCID/SLURM_NTASKS)", "SLURM_PROCID", "SLURM_NTASKS"},
                            {"OpenMPI (OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE)", "OMPI_COMM_WORLD_RANK",
                             "OMPI_COMM_WORLD_SIZE"}};
  for (const Source& s : sources) {
    auto rank = env(s.rank), size = env(s.size);
    if (rank && size) {
      id.host = parse_int(s.rank, *rank);
      id.hosts = parse_int(s.size, *size);
      id.source = s.name;
      break;
    }
  }
  if (flags.node_rank || flags.nnodes) {
    MT_USER_CHECK(flags.node_rank && flags.nnodes, "--nnodes and --node-rank go together");
    id.host = *flags.node_rank;
    id.hosts = *flags.nnodes;
    id.source = "flags (--nnodes/--node-rank)";
  }

  if (auto v = env("MESHTRAIN_MASTER_ADDR")) id.master_addr = *v;
  else if (auto v = env("MASTER_ADDR")) id.master_addr = *v;
  else if (auto v = env("SLURM_STEP_NODELIST")) id.master_addr = first_slurm_node(*v);
  else if (auto v = env("SLURM_JOB_NODELIST")) id.master_addr = first_slurm_node(*v);
  if (flags.master_addr) id.master_addr = *flags.master_addr;

  if (auto v = env("MESHTRAIN_MASTER_PORT")) id.master_port = parse_int("MESHTRAIN_MASTER_PORT", *v);
  else if (auto v = env("MASTER_PORT")) id.master_port = parse_int("MASTER_PORT", *v);
  if (flags.master_port) id.master_port = *flags.master_port;

  if (auto v = env("MESHTRAIN_DEVICES_PER_HOST")) id.devices_per_host = parse_int("MESHTRAIN_DEVICES_PER_HOST", *v);
  if (flags.devices_per_host) id.devices_per_host = *flags.devices_per_host;

  if (auto v = env("MESHTRAIN_IFACE")) id.iface = *v;
  if (flags.iface) id.iface = *flags.iface;

  MT_USER_CHECK(id.hosts >= 1, "the host count must be at least 1, got {} (from {})", id.hosts, id.source);
  MT_USER_CHECK(id.host >= 0 && id.host < id.hosts, "host index {} is outside [0, {}) (from {})", id.host, id.hosts,
                id.source);
  MT_USER_CHECK(id.devices_per_host >= 1, "devices per host must be at least 1, got {}", id.devices_per_host);
  MT_USER_CHECK(id.master_port > 0 && id.master_port < 65536, "master port {} is not a TCP port (1-65535)",
                id.master_port);
  return id;
}

bool is_loopback_name(const std::string& address) {
  return address == "localhost" || address == "::1" || address.rfind("127.", 0) == 0;
}

void attach_job_secret(HostIdentity& identity, const HostFlags& flags, const EnvLookup& env) {
  control::JobSecret secret = control::resolve_job_secret(
      control::SecretSources{flags.secret_file, env}, identity.hosts, is_loopback_name(identity.master_addr));
  identity.job_secret = std::move(secret.value);
  identity.job_secret_source = std::move(secret.source);
}

namespace {

// Whether `port` (0: any) on 127.0.0.1 can be bound now; the bound port when it can.
int try_bind(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  MT_CHECK(fd >= 0, "socket() failed while looking for a free port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof addr;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  return ok ? ntohs(addr.sin_port) : 0;
}

// The first port of the kernel's ephemeral range (what it hands to connect() and bind(0)), 32768 if unknown.
int first_ephemeral_port() {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0;
  return range >> low && low > 0 ? low : 32768;
}

}  // namespace

int find_free_port() {
  // Below the ephemeral range: the kernel never gives such a port to another process's outgoing connection or
  // bind(0) between this check and the coordinator's bind (with parallel jobs, an ephemeral one was taken in between).
  const int high = first_ephemeral_port(), low = std::min(20000, high / 2);
  std::mt19937 random(std::random_device{}());
  std::uniform_int_distribution<int> pick(low, high - 1);
  for (int attempt = 0; attempt < 64; ++attempt)
    if (const int port = try_bind(pick(random))) return port;
  const int port = try_bind(0);
  MT_CHECK(port > 0, "could not bind a socket on 127.0.0.1 to find a free port");
  return port;
}

}  // namespace meshtrain::runtime
