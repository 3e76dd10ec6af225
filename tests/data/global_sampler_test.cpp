// global_sampler_test.cpp — the permutation is a bijection (mapped one index or many at a time), epochs differ,
// batches are pure functions of (seed, epoch, step), and every sample id is read exactly once per epoch.
#include "meshtrain/data/global_sampler.hpp"

#include <gtest/gtest.h>

#include <set>

namespace meshtrain::data {
namespace {

TEST(GlobalSamplerTest, PermutationIsABijectionForManySizes) {
  for (uint64_t size : {1ULL, 2ULL, 3ULL, 7ULL, 64ULL, 100ULL, 1000ULL, 4097ULL}) {
    IndexPermutation p(size, 1234);
    std::vector<bool> seen(size, false);
    for (uint64_t i = 0; i < size; ++i) {
      uint64_t v = p(i);
      ASSERT_LT(v, size);
      ASSERT_FALSE(seen[v]) << "size " << size << " maps two indices to " << v;
      seen[v] = true;
    }
  }
}

TEST(GlobalSamplerTest, MappingManyIndicesAtOnceGivesWhatEachGivesAlone) {
  for (uint64_t size : {1ULL, 3ULL, 100ULL, 1183ULL, 4097ULL}) {
    IndexPermutation p(size, 99);
    for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{33}}) {
      std::vector<uint64_t> indices;
      for (size_t i = 0; i < n; ++i) indices.push_back((i * 37 + 5) % size);
      std::vector<uint64_t> out(n, ~uint64_t{0}), in_place = indices;
      p.map(indices.data(), out.data(), n);
      p.map(in_place.data(), in_place.data(), n);
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(out[i], p(indices[i])) << "size " << size << " index " << indices[i];
        ASSERT_EQ(in_place[i], out[i]) << "size " << size << " index " << indices[i];
      }
    }
  }
}

TEST(GlobalSamplerTest, PermutationShuffles) {
  IndexPermutation p(1000, 7);
  int fixed = 0;
  for (uint64_t i = 0; i < 1000; ++i) fixed += p(i) == i;
  EXPECT_LT(fixed, 20);  // a random permutation has about one fixed point
}

TEST(GlobalSamplerTest, EveryEpochReadsEverySampleOnceInANewOrder) {
  GlobalSampler sampler(42, 103, 8);  // 12 batches, 7 samples left over each epoch
  ASSERT_EQ(sampler.batches_per_epoch(), 12);
  std::vector<int64_t> first_epoch;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::set<int64_t> seen;
    std::vector<int64_t> order;
    for (int64_t step = 0; step < sampler.batches_per_epoch(); ++step)
      for (int64_t id : sampler.global_batch(epoch, step)) {
        EXPECT_TRUE(seen.insert(id).second) << "sample " << id << " read twice in epoch " << epoch;
        order.push_back(id);
      }
    EXPECT_EQ(seen.size(), 96u);
    if (epoch == 0) first_epoch = order;
    else EXPECT_NE(order, first_epoch) << "epoch " << epoch << " repeats epoch 0's order";
  }
}

TEST(GlobalSamplerTest, BatchesArePureFunctionsOfSeedEpochStep) {
  GlobalSampler a(42, 1000, 16), b(42, 1000, 16), other_seed(43, 1000, 16);
  EXPECT_EQ(a.global_batch(3, 7), b.global_batch(3, 7));
  EXPECT_NE(a.global_batch(3, 7), other_seed.global_batch(3, 7));
  EXPECT_EQ(a.sample_at(3, 7, 5), a.global_batch(3, 7)[5]);
  const std::vector<int64_t> rows = {9, 2, 15};
  std::vector<int64_t> ids(3, -1);
  a.samples_at(3, 7, rows.data(), rows.size(), ids.data());
  EXPECT_EQ(ids, (std::vector<int64_t>{a.sample_at(3, 7, 9), a.sample_at(3, 7, 2), a.sample_at(3, 7, 15)}));
}

TEST(GlobalSamplerTest, CursorWrapsAtTheEndOfAnEpoch) {
  GlobalSampler sampler(0, 20, 8);  // 2 batches per epoch
  EXPECT_EQ(sampler.next({0, 0}), (DataCursor{0, 1}));
  EXPECT_EQ(sampler.next({0, 1}), (DataCursor{1, 0}));
}

}  // namespace
}  // namespace meshtrain::data
