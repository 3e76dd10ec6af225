// global_sampler.hpp — which samples make up global batch k of epoch e: a pure function of (seed, e, k).
//
// The order is a keyed pseudo-random permutation of the sample ids (a 4-round Feistel cipher over the next power of
// two, cycle-walking back into range): O(1) memory, random access, a new order every epoch, and no dependence on
// the number of hosts or devices. An epoch has floor(num_samples / global_batch_size) batches for everyone (the tail
// that does not fill a batch is left for that epoch), so every host yields the same number of batches. The whole
// state is one cursor (epoch, step).
//
// A sampler may draw from a contiguous range of sample ids (the training samples when evaluation holds out the tail,
// or the held-out ones), and an evaluation sampler keeps one order for every epoch and at most a given number of
// batches per epoch, so that each evaluation reads the same batches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain::data {

// A keyed bijection of [0, size).
class IndexPermutation {
 public:
  IndexPermutation(uint64_t size, uint64_t key);
  uint64_t size() const { return size_; }
  uint64_t operator()(uint64_t index) const;
  // The same for many indices: out[i] = (*this)(indices[i]). The cycle walks of several indices advance side by side,
  // so their chains of dependent multiplies overlap instead of waiting on each other and on each walk's end.
  void map(const uint64_t* indices, uint64_t* out, size_t n) const;

 private:
  uint64_t encrypt(uint64_t value) const;
  uint64_t size_;
  int half_bits_;  // the domain is 2^(2 * half_bits) >= size
  uint64_t half_mask_;
  uint64_t round_keys_[4];
};

struct DataCursor {
  int64_t epoch = 0;
  int64_t step = 0;  // the next global batch within the epoch
  bool operator==(const DataCursor& other) const { return epoch == other.epoch && step == other.step; }
};

// Sample ids [first, first + count).
struct SampleRange {
  int64_t first = 0;
  int64_t count = 0;
};

class GlobalSampler {
 public:
  GlobalSampler(uint64_t seed, int64_t num_samples, int64_t global_batch_size)
      : GlobalSampler(seed, SampleRange{0, num_samples}, global_batch_size) {}
  // `fixed_order`: every epoch uses epoch 0's order; `max_batches_per_epoch` > 0 caps the batches of an epoch (an
  // evaluation: the same batches each time). UserError if the range holds less than one global batch.
  GlobalSampler(uint64_t seed, SampleRange samples, int64_t global_batch_size, bool fixed_order = false,
                int64_t max_batches_per_epoch = 0);

  int64_t num_samples() const { return samples_.count; }
  const SampleRange& samples() const { return samples_; }
  int64_t global_batch_size() const { return global_batch_size_; }
  int64_t batches_per_epoch() const { return batches_per_epoch_; }

  // Sample id of every row of global batch `step` of `epoch`.
  std::vector<int64_t> global_batch(int64_t epoch, int64_t step) const;
  // Sample id of one row (random access: what a host needs for the rows it reads).
  int64_t sample_at(int64_t epoch, int64_t step, int64_t row) const;
  // Sample ids of the `count` rows at `rows` into `ids[0, count)`, the epoch's permutation keyed once for all of them.
  void samples_at(int64_t epoch, int64_t step, const int64_t* rows, size_t count, int64_t* ids) const;
  // The cursor after `cursor`: the next step, or the first step of the next epoch.
  DataCursor next(const DataCursor& cursor) const;

 private:
  IndexPermutation order(int64_t epoch) const;  // the epoch's permutation of [0, samples_.count)
  void check_position(int64_t step, int64_t row) const;

  uint64_t seed_;
  SampleRange samples_;
  int64_t global_batch_size_;
  bool fixed_order_;
  int64_t batches_per_epoch_;
};

}  // namespace meshtrain::data
