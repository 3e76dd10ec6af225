// global_sampler.cpp — the Feistel index permutation and the global batch arithmetic.
#include "meshtrain/data/global_sampler.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/common/mix.hpp"

#include <algorithm>

namespace meshtrain::data {

IndexPermutation::IndexPermutation(uint64_t size, uint64_t key) : size_(size) {
  MT_CHECK(size > 0, "a permutation needs a non-empty domain");
  int bits = 2;
  while (bits < 64 && (uint64_t{1} << bits) < size) bits += 2;  // an even bit count, so both halves are equal
  half_bits_ = bits / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  for (int r = 0; r < 4; ++r) round_keys_[r] = splitmix64(key ^ splitmix64(static_cast<uint64_t>(r) + 1));
}

uint64_t IndexPermutation::encrypt(uint64_t value) const {
  uint64_t left = value >> half_bits_, right = value & half_mask_;
  for (uint64_t key : round_keys_) {
    uint64_t next_right = left ^ (splitmix64(right ^ key) & half_mask_);
    left = right;
    right = next_right;
  }
  return (left << half_bits_) | right;
}

uint64_t IndexPermutation::operator()(uint64_t index) const {
  MT_CHECK(index < size_, "index {} is outside the permutation's domain [0, {})", index, size_);
  // Cycle-walking: the cipher permutes [0, 4^half_bits); re-encrypt until the value lands in [0, size). The domain is
  // less than 4x the size, so this takes under 4 steps on average and always ends (the cycle contains `index`).
  uint64_t value = encrypt(index);
  while (value >= size_) value = encrypt(value);
  return value;
}

void IndexPermutation::map(const uint64_t* indices, uint64_t* out, size_t n) const {
  constexpr int kLanes = 8;
  uint64_t value[kLanes];
  size_t slot[kLanes];
  int live = 0;
  size_t next = 0;
  while (true) {
    for (; live < kLanes && next < n; ++live, ++next) {
      MT_CHECK(indices[next] < size_, "index {} is outside the permutation's domain [0, {})", indices[next], size_);
      value[live] = indices[next];
      slot[live] = next;
    }
    if (live == 0) return;
    for (int lane = 0; lane < live; ++lane) value[lane] = encrypt(value[lane]);
    // A lane whose value landed in [0, size) is done (as in operator()); the last live lane takes its place.
    for (int lane = 0; lane < live;) {
      if (value[lane] < size_) {
        out[slot[lane]] = value[lane];
        --live;
        value[lane] = value[live];
        slot[lane] = slot[live];
      } else {
        ++lane;
      }
    }
  }
}

GlobalSampler::GlobalSampler(uint64_t seed, SampleRange samples, int64_t global_batch_size, bool fixed_order,
                             int64_t max_batches_per_epoch)
    : seed_(seed), samples_(samples), global_batch_size_(global_batch_size), fixed_order_(fixed_order) {
  MT_USER_CHECK(global_batch_size > 0, "global_batch_size must be positive, got {}", global_batch_size);
  MT_USER_CHECK(samples.count >= global_batch_size,
                "the dataset has {} samples, fewer than one global batch (global_batch_size={})", samples.count,
                global_batch_size);
  MT_CHECK(samples.first >= 0, "a sample range cannot start at {}", samples.first);
  batches_per_epoch_ = samples.count / global_batch_size;
  if (max_batches_per_epoch > 0) batches_per_epoch_ = std::min(batches_per_epoch_, max_batches_per_epoch);
}

IndexPermutation GlobalSampler::order(int64_t epoch) const {
  const uint64_t order_epoch = fixed_order_ ? 0 : static_cast<uint64_t>(epoch);
  return IndexPermutation(static_cast<uint64_t>(samples_.count), splitmix64(seed_) ^ splitmix64(~order_epoch));
}

void GlobalSampler::check_position(int64_t step, int64_t row) const {
  MT_CHECK(step >= 0 && step < batches_per_epoch(), "step {} is outside the epoch's {} batches", step,
           batches_per_epoch());
  MT_CHECK(row >= 0 && row < global_batch_size_, "row {} is outside the global batch of {}", row, global_batch_size_);
}

int64_t GlobalSampler::sample_at(int64_t epoch, int64_t step, int64_t row) const {
  check_position(step, row);
  return samples_.first + static_cast<int64_t>(order(epoch)(static_cast<uint64_t>(step * global_batch_size_ + row)));
}

void GlobalSampler::samples_at(int64_t epoch, int64_t step, const int64_t* rows, size_t count, int64_t* ids) const {
  const IndexPermutation permutation = order(epoch);
  // Positions in the epoch's order, mapped in place (ids holds them as uint64 first).
  uint64_t* positions = reinterpret_cast<uint64_t*>(ids);
  for (size_t i = 0; i < count; ++i) {
    check_position(step, rows[i]);
    positions[i] = static_cast<uint64_t>(step * global_batch_size_ + rows[i]);
  }
  permutation.map(positions, positions, count);
  for (size_t i = 0; i < count; ++i) ids[i] += samples_.first;
}

std::vector<int64_t> GlobalSampler::global_batch(int64_t epoch, int64_t step) const {
  std::vector<int64_t> rows(global_batch_size_), ids(global_batch_size_);
  for (int64_t row = 0; row < global_batch_size_; ++row) rows[row] = row;
  samples_at(epoch, step, rows.data(), rows.size(), ids.data());
  return ids;
}

DataCursor GlobalSampler::next(const DataCursor& cursor) const {
  if (cursor.step + 1 < batches_per_epoch()) return {cursor.epoch, cursor.step + 1};
  return {cursor.epoch + 1, 0};
}

}  // namespace meshtrain::data
