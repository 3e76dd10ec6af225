// network.cpp — address resolution, route lookup and interface listing for choosing Gloo's address (network.hpp).
#include "meshtrain/runtime/network.hpp"

#include "meshtrain/common/error.hpp"

#include <fmt/ranges.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>

namespace meshtrain::runtime {
namespace {

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;

  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  int family() const { return storage.ss_family; }
};

bool is_ip(const sockaddr* address) {
  return address && (address->sa_family == AF_INET || address->sa_family == AF_INET6);
}

socklen_t length_of(const sockaddr* address) {
  return address->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
}

std::string numeric(const sockaddr* address) {
  char host[NI_MAXHOST];
  int rc = ::getnameinfo(address, length_of(address), host, sizeof host, nullptr, 0, NI_NUMERICHOST);
  MT_CHECK(rc == 0, "getnameinfo: {}", ::gai_strerror(rc));
  return host;
}

// The same host address, ignoring ports (and IPv6 scope: an address is held by one interface).
bool same_host(const sockaddr* a, const sockaddr* b) {
  if (a->sa_family != b->sa_family) return false;
  if (a->sa_family == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
  return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                     &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr, sizeof(in6_addr)) == 0;
}

bool is_loopback(const SocketAddress& address) {
  if (address.family() == AF_INET)
    return (ntohl(reinterpret_cast<const sockaddr_in*>(address.get())->sin_addr.s_addr) >> 24) == 127;
  const in6_addr& a6 = reinterpret_cast<const sockaddr_in6*>(address.get())->sin6_addr;
  return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
}

void set_port(SocketAddress& address, int port) {
  if (address.family() == AF_INET)
    reinterpret_cast<sockaddr_in*>(&address.storage)->sin_port = htons(static_cast<uint16_t>(port));
  else
    reinterpret_cast<sockaddr_in6*>(&address.storage)->sin6_port = htons(static_cast<uint16_t>(port));
}

using InterfaceList = std::unique_ptr<ifaddrs, decltype(&::freeifaddrs)>;

InterfaceList list_interfaces() {
  ifaddrs* list = nullptr;
  MT_CHECK(::getifaddrs(&list) == 0, "getifaddrs: {}", std::strerror(errno));
  return InterfaceList(list, &::freeifaddrs);
}

std::vector<SocketAddress> resolve_master(const std::string& master_addr) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(master_addr.c_str(), nullptr, &hints, &found);
  MT_USER_CHECK(rc == 0, "the master address '{}' (--master-addr) does not resolve to an address: {}", master_addr,
                rc == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(rc));
  std::vector<SocketAddress> addresses;
  for (addrinfo* a = found; a; a = a->ai_next) {
    if (!is_ip(a->ai_addr)) continue;
    SocketAddress address;
    std::memcpy(&address.storage, a->ai_addr, a->ai_addrlen);
    address.length = a->ai_addrlen;
    addresses.push_back(address);
  }
  ::freeaddrinfo(found);
  MT_USER_CHECK(!addresses.empty(), "the master address '{}' (--master-addr) resolves to no IPv4 or IPv6 address",
                master_addr);
  return addresses;
}

// The local address the kernel picks as the source for datagrams to `destination`, or the error why it cannot.
// connect() on a UDP socket only looks up the route: nothing is sent.
std::optional<SocketAddress> source_address_towards(SocketAddress destination, int port, std::string& error) {
  set_port(destination, port);
  int fd = ::socket(destination.family(), SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    error = fmt::format("{}: socket: {}", numeric(destination.get()), std::strerror(errno));
    return std::nullopt;
  }
  SocketAddress source;
  source.length = sizeof source.storage;
  bool ok = ::connect(fd, destination.get(), destination.length) == 0 &&
            ::getsockname(fd, reinterpret_cast<sockaddr*>(&source.storage), &source.length) == 0;
  if (!ok) error = fmt::format("{}: {}", numeric(destination.get()), std::strerror(errno));
  ::close(fd);
  if (!ok) return std::nullopt;
  return source;
}

std::string interface_holding(const SocketAddress& address) {
  InterfaceList list = list_interfaces();
  for (ifaddrs* i = list.get(); i; i = i->ifa_next)
    if (is_ip(i->ifa_addr) && same_host(i->ifa_addr, address.get())) return i->ifa_name;
  throw Error(fmt::format("no interface of this host holds the address {}; it has {}", numeric(address.get()),
                          fmt::join(interface_names(), ", ")));
}

// Gloo binds to the first IPv4 or IPv6 address of the interface (as its own lookup does).
GlooBinding binding_for_interface(const std::string& name, const std::string& given_as, BindingChoice choice) {
  MT_USER_CHECK(name.find(',') == std::string::npos,
                "{}='{}' names several interfaces; meshtrain binds Gloo to one interface", given_as, name);
  for (const InterfaceAddress& a : interface_addresses())
    if (a.interface == name) return GlooBinding{a.address, name, choice};
  const std::vector<std::string> names = interface_names();
  MT_USER_CHECK(std::find(names.begin(), names.end(), name) != names.end(),
                "{}='{}': this host has no such network interface; it has: {}", given_as, name, fmt::join(names, ", "));
  throw UserError(fmt::format("{}='{}': the interface has no IPv4 or IPv6 address", given_as, name));
}

}  // namespace

std::string describe(BindingChoice choice) {
  switch (choice) {
    case BindingChoice::kIfaceFlag: return "--iface";
    case BindingChoice::kGlooSocketIfname: return "GLOO_SOCKET_IFNAME";
    case BindingChoice::kLoopback: return "loopback master address";
    case BindingChoice::kRouteToMaster: return "route to the master";
  }
  return "?";
}

std::vector<InterfaceAddress> interface_addresses() {
  std::vector<InterfaceAddress> addresses;
  InterfaceList list = list_interfaces();
  for (ifaddrs* i = list.get(); i; i = i->ifa_next)
    if (is_ip(i->ifa_addr)) addresses.push_back({i->ifa_name, numeric(i->ifa_addr)});
  return addresses;
}

std::vector<std::string> interface_names() {
  std::vector<std::string> names;
  InterfaceList list = list_interfaces();
  for (ifaddrs* i = list.get(); i; i = i->ifa_next)
    if (std::find(names.begin(), names.end(), i->ifa_name) == names.end()) names.push_back(i->ifa_name);
  return names;
}

GlooBinding choose_gloo_binding(const std::string& master_addr, int master_port, const std::string& iface,
                                const EnvLookup& env) {
  if (!iface.empty()) return binding_for_interface(iface, "--iface", BindingChoice::kIfaceFlag);
  if (auto gloo_ifname = env("GLOO_SOCKET_IFNAME"))
    return binding_for_interface(*gloo_ifname, "GLOO_SOCKET_IFNAME", BindingChoice::kGlooSocketIfname);

  const std::vector<SocketAddress> master = resolve_master(master_addr);
  if (is_loopback(master.front())) {
    SocketAddress local;
    auto* v4 = reinterpret_cast<sockaddr_in*>(&local.storage);
    v4->sin_family = AF_INET;
    v4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return GlooBinding{"127.0.0.1", interface_holding(local), BindingChoice::kLoopback};
  }
  std::vector<std::string> errors;
  for (const SocketAddress& destination : master) {
    std::string error;
    if (auto source = source_address_towards(destination, master_port, error))
      return GlooBinding{numeric(source->get()), interface_holding(*source), BindingChoice::kRouteToMaster};
    errors.push_back(error);
  }
  throw UserError(fmt::format("no route from this host to the master address '{}' ({}); name the interface to use "
                              "with --iface or GLOO_SOCKET_IFNAME",
                              master_addr, fmt::join(errors, "; ")));
}

}  // namespace meshtrain::runtime
