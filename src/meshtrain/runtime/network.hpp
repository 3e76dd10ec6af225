// network.hpp — the local address and interface Gloo binds to and advertises to its peers.
//
// Gloo connects the hosts to each other at the address each one advertises. Left alone it advertises what this
// machine's hostname resolves to, often a loopback address (127.0.1.1) that the other hosts cannot reach. The choice,
// in order of precedence:
//   1. `--iface NAME` (or MESHTRAIN_IFACE, which `meshtrain run --iface` passes down): that interface;
//   2. GLOO_SOCKET_IFNAME: that interface;
//   3. a loopback master address (127.x, ::1, localhost): 127.0.0.1, as every host runs on this machine;
//   4. otherwise the local address the kernel would use to reach the master (a UDP socket's connect + getsockname:
//      a route lookup, no packet is sent), on the interface that holds it.
// An interface's address is its first IPv4 or IPv6 address, the one Gloo itself picks for it.
#pragma once

#include "meshtrain/runtime/host_identity.hpp"

#include <string>
#include <vector>

namespace meshtrain::runtime {

enum class BindingChoice { kIfaceFlag, kGlooSocketIfname, kLoopback, kRouteToMaster };

// "--iface", "GLOO_SOCKET_IFNAME", "loopback master address", "route to the master"
std::string describe(BindingChoice choice);

struct GlooBinding {
  std::string address;    // numeric IPv4 or IPv6 address
  std::string interface;  // the interface that holds it
  BindingChoice choice;

  // True when Gloo must be given the interface (an interface was named), false when it is given the address.
  bool by_interface() const {
    return choice == BindingChoice::kIfaceFlag || choice == BindingChoice::kGlooSocketIfname;
  }
};

struct InterfaceAddress {
  std::string interface;
  std::string address;  // numeric
};

// Every IPv4 and IPv6 address of this host's interfaces, in the kernel's (getifaddrs) order.
std::vector<InterfaceAddress> interface_addresses();

// The names of this host's interfaces, with or without an address, in the kernel's order.
std::vector<std::string> interface_names();

// What Gloo should bind to on this host for the job whose coordinator is `master_addr:master_port` (see the file
// comment). `iface` is HostIdentity::iface; GLOO_SOCKET_IFNAME is read through `env`. UserError when a named
// interface does not exist or has no address, the master address does not resolve, or no route leads to it.
GlooBinding choose_gloo_binding(const std::string& master_addr, int master_port, const std::string& iface,
                                const EnvLookup& env = process_environment());

}  // namespace meshtrain::runtime
