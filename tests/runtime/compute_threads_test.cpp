// compute_threads_test.cpp — OpenBLAS's process-wide pool follows the count meshtrain sets (the build's libblas.so.3
// is OpenBLAS: scripts/setup.sh selects it).
#include "meshtrain/runtime/compute_threads.hpp"

#include <gtest/gtest.h>

namespace meshtrain::runtime {
namespace {

TEST(ComputeThreadsTest, OpenBlasPoolTakesTheThreadsOfOneDevice) {
  EXPECT_EQ(set_blas_threads(2).substr(0, 8), "OpenBLAS");
  const std::string one = set_blas_threads(1);
  EXPECT_EQ(one.substr(one.size() - 10), ": 1 thread") << one;
  const std::string two = set_blas_threads(2);
  EXPECT_EQ(two.substr(two.size() - 11), ": 2 threads") << two;
}

}  // namespace
}  // namespace meshtrain::runtime
