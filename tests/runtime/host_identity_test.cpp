// host_identity_test.cpp — host identity from flags and from the environments of meshtrain, torchrun, Slurm, OpenMPI.
#include "meshtrain/common/error.hpp"
#include "meshtrain/runtime/host_identity.hpp"

#include <gtest/gtest.h>

#include "runtime/fake_environment.hpp"

#include <map>

namespace meshtrain::runtime {
namespace {

TEST(HostIdentityTest, DefaultIsOneLocalHost) {
  HostIdentity id = resolve_host_identity({}, env_of({}));
  EXPECT_EQ(id.host, 0);
  EXPECT_EQ(id.hosts, 1);
  EXPECT_EQ(id.master_addr, "127.0.0.1");
}

TEST(HostIdentityTest, TorchrunEnvironment) {
  HostIdentity id = resolve_host_identity(
      {}, env_of({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29400"}}));
  EXPECT_EQ(id.host, 1);
  EXPECT_EQ(id.hosts, 4);
  EXPECT_EQ(id.master_addr, "node7");
  EXPECT_EQ(id.master_port, 29400);
  // A node rank (GROUP_RANK/NNODES) wins over the per-process RANK.
  HostIdentity node = resolve_host_identity(
      {}, env_of({{"GROUP_RANK", "2"}, {"NNODES", "3"}, {"RANK", "9"}, {"WORLD_SIZE", "12"}}));
  EXPECT_EQ(node.host, 2);
  EXPECT_EQ(node.hosts, 3);
}

TEST(HostIdentityTest, SlurmEnvironmentTakesTheFirstNodeAsMaster) {
  HostIdentity id = resolve_host_identity(
      {}, env_of({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_STEP_NODELIST", "gpu[03-06],cpu1"}}));
  EXPECT_EQ(id.host, 3);
  EXPECT_EQ(id.hosts, 4);
  EXPECT_EQ(id.master_addr, "gpu03");
  EXPECT_EQ(first_slurm_node("login"), "login");
  EXPECT_EQ(first_slurm_node("a1,a2"), "a1");
}

TEST(HostIdentityTest, OpenMpiEnvironment) {
  HostIdentity id = resolve_host_identity(
      {}, env_of({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"}}));
  EXPECT_EQ(id.host, 1);
  EXPECT_EQ(id.hosts, 2);
  EXPECT_EQ(id.master_addr, "10.0.0.1");
}

TEST(HostIdentityTest, FlagsWinOverEnvironment) {
  HostFlags flags;
  flags.nnodes = 2;
  flags.node_rank = 0;
  flags.master_port = 1234;
  flags.devices_per_host = 4;
  HostIdentity id = resolve_host_identity(flags, env_of({{"RANK", "1"}, {"WORLD_SIZE", "4"}}));
  EXPECT_EQ(id.host, 0);
  EXPECT_EQ(id.hosts, 2);
  EXPECT_EQ(id.master_port, 1234);
  EXPECT_EQ(id.devices_per_host, 4);
}

TEST(HostIdentityTest, BadValuesAreNamed) {
  EXPECT_THROW(resolve_host_identity({}, env_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}})), UserError);
  EXPECT_THROW(resolve_host_identity({}, env_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}})), UserError);
  HostFlags half;
  half.nnodes = 2;
  EXPECT_THROW(resolve_host_identity(half, env_of({})), UserError);
  EXPECT_GT(find_free_port(), 0);
}

}  // namespace
}  // namespace meshtrain::runtime
