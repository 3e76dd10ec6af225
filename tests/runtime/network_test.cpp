// network_test.cpp — the address and interface Gloo binds to: loopback, a named interface, the route to the master.
#include "meshtrain/common/error.hpp"
#include "meshtrain/runtime/network.hpp"

#include <gtest/gtest.h>

#include "runtime/fake_environment.hpp"

#include <functional>
#include <map>

namespace meshtrain::runtime {
namespace {

// The message of the UserError `fn` throws ("" and a test failure if it throws none).
std::string user_error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a UserError";
  return "";
}

TEST(NetworkTest, LoopbackMasterBindsTo127OnLo) {
  for (const std::string master : {"127.0.0.1", "localhost"}) {
    GlooBinding binding = choose_gloo_binding(master, 29500, "", env_of({}));
    EXPECT_EQ(binding.address, "127.0.0.1") << master;
    EXPECT_EQ(binding.interface, "lo") << master;
    EXPECT_EQ(binding.choice, BindingChoice::kLoopback) << master;
    EXPECT_FALSE(binding.by_interface()) << master;
  }
}

TEST(NetworkTest, NamedInterfaceWinsAndTheFlagBeforeGlooSocketIfname) {
  GlooBinding by_gloo = choose_gloo_binding("192.0.2.77", 29500, "", env_of({{"GLOO_SOCKET_IFNAME", "lo"}}));
  EXPECT_EQ(by_gloo.interface, "lo");
  EXPECT_EQ(by_gloo.choice, BindingChoice::kGlooSocketIfname);
  EXPECT_TRUE(by_gloo.by_interface());

  GlooBinding by_flag = choose_gloo_binding("192.0.2.77", 29500, "lo", env_of({{"GLOO_SOCKET_IFNAME", "nosuch0"}}));
  EXPECT_EQ(by_flag.interface, "lo");
  EXPECT_EQ(by_flag.choice, BindingChoice::kIfaceFlag);
  EXPECT_EQ(describe(by_flag.choice), "--iface");
  // The interface's first address, as Gloo picks it.
  bool held_by_lo = false;
  for (const InterfaceAddress& a : interface_addresses())
    held_by_lo |= a.interface == "lo" && a.address == by_flag.address;
  EXPECT_TRUE(held_by_lo) << by_flag.address;
}

TEST(NetworkTest, HostIdentityTakesTheInterfaceFromTheFlagOrMeshtrainIface) {
  EXPECT_EQ(resolve_host_identity({}, env_of({})).iface, "");
  EXPECT_EQ(resolve_host_identity({}, env_of({{"MESHTRAIN_IFACE", "eth1"}})).iface, "eth1");
  HostFlags flags;
  flags.iface = "eth2";
  EXPECT_EQ(resolve_host_identity(flags, env_of({{"MESHTRAIN_IFACE", "eth1"}})).iface, "eth2");
}

TEST(NetworkTest, UnknownInterfaceNamesTheExistingOnes) {
  std::string error = user_error_of([] { choose_gloo_binding("127.0.0.1", 29500, "nosuch0", env_of({})); });
  EXPECT_NE(error.find("--iface='nosuch0'"), std::string::npos) << error;
  EXPECT_NE(error.find("no such network interface"), std::string::npos) << error;
  for (const std::string& name : interface_names()) EXPECT_NE(error.find(name), std::string::npos) << error;

  error = user_error_of(
      [] { choose_gloo_binding("127.0.0.1", 29500, "", env_of({{"GLOO_SOCKET_IFNAME", "nosuch1"}})); });
  EXPECT_NE(error.find("GLOO_SOCKET_IFNAME='nosuch1'"), std::string::npos) << error;
  EXPECT_NE(error.find("lo"), std::string::npos) << error;

  error = user_error_of([] { choose_gloo_binding("127.0.0.1", 29500, "lo,eth0", env_of({})); });
  EXPECT_NE(error.find("several interfaces"), std::string::npos) << error;
}

TEST(NetworkTest, UnresolvableMasterIsAClearError) {
  std::string error = user_error_of([] { choose_gloo_binding("no-such-host.invalid", 29500, "", env_of({})); });
  EXPECT_NE(error.find("the master address 'no-such-host.invalid' (--master-addr) does not resolve"), std::string::npos)
      << error;
}

TEST(NetworkTest, NonLoopbackMasterBindsToTheAddressThatRoutesToIt) {
  // The route from a host to one of its own addresses leaves from that address: a master at this host's first
  // non-loopback address must be advertised as that address, on its interface.
  for (const InterfaceAddress& a : interface_addresses()) {
    if (a.interface == "lo" || a.address.find(':') != std::string::npos) continue;
    GlooBinding binding = choose_gloo_binding(a.address, 29500, "", env_of({}));
    EXPECT_EQ(binding.address, a.address);
    EXPECT_EQ(binding.interface, a.interface);
    EXPECT_EQ(binding.choice, BindingChoice::kRouteToMaster);
    EXPECT_FALSE(binding.by_interface());
    return;
  }
  GTEST_SKIP() << "this host has no non-loopback IPv4 address (slow_test_netns.py covers the route with a veth pair)";
}

}  // namespace
}  // namespace meshtrain::runtime
