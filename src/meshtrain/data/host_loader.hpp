// host_loader.hpp — HostLoader: reads this host's rows of each global batch into a host-local int32 batch, ahead of
// the training loop, in background threads (how: docs/data.md, "Host loader").
//
// Batch n is the n-th global batch from the start cursor (GlobalSampler order, epochs rolling over). Every consumer
// (each local device thread) takes every batch, in order; take() returns once the batch is read (the consumer reads
// shares of it meanwhile) and rethrows a worker's failure. At most `prefetch_steps` batches are read ahead of the
// slowest consumer; a batch's buffer is reused for a later batch only once nothing refers to it.
//
// Legend: R = host-local rows (ReadPlan::rows), T1 = block_size + 1 tokens.
#pragma once

#include "meshtrain/common/adaptive_mutex.hpp"
#include "meshtrain/data/dataset.hpp"
#include "meshtrain/data/global_sampler.hpp"

#include <ATen/ATen.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace meshtrain::data {

struct HostBatch {
  DataCursor cursor;
  std::vector<int64_t> sample_ids;  // per host-local row
  at::Tensor tokens_RT1;            // int32: row r holds sample sample_ids[r]
  at::Tensor documents_RT;          // int32: the document numbers of its inputs (HostLoaderOptions::documents)
  double read_seconds = 0;          // loader-thread time spent reading it (summed over the threads that shared it)
};

struct HostLoaderOptions {
  int prefetch_steps = 2;
  int threads = 2;
  int consumers = 1;  // how many threads take every batch (the host's local devices)
  bool documents = false;  // also read each row's document numbers (TokenDataset::read_sample_documents)
};

class HostLoader {
 public:
  // `rows`: the global rows to read (ReadPlan::rows). Starts the worker threads.
  HostLoader(std::shared_ptr<const TokenDataset> dataset, GlobalSampler sampler, std::vector<int64_t> rows,
             DataCursor start, HostLoaderOptions options);
  ~HostLoader();  // stops and joins the workers
  HostLoader(const HostLoader&) = delete;
  HostLoader& operator=(const HostLoader&) = delete;

  struct Taken {
    std::shared_ptr<const HostBatch> batch;
    double wait_seconds = 0;  // how long take() blocked until the batch was read
    bool first = false;       // the first consumer to take this batch
  };
  // Batch number `n`; a consumer takes 0, 1, 2, ... in order. Rethrows a worker's exception.
  Taken take(int64_t n);

 private:
  // One worker's share of a batch: rows [begin, end) of batch `n`.
  struct Share {
    int64_t n;
    HostBatch* batch;
    int64_t begin, end;
  };
  void work();
  // Under the lock: whether a share can be claimed now, and claiming it.
  bool claimable() const;
  Share claim();
  // Reads a share claimed under `lock` (released meanwhile) and counts it read; a failure goes to failure_.
  void read_share(std::unique_lock<AdaptiveMutex>& lock, const Share& share);
  double read(const Share& share) const;  // returns the seconds it took
  // changed_.wait(lock, ready), polling for a few microseconds before sleeping.
  template <typename Ready>
  void wait_until(std::unique_lock<AdaptiveMutex>& lock, Ready&& ready);
  // Under the lock, after changing what a waiter waits for: counts the change and wakes the sleepers.
  void announce_change();

  std::shared_ptr<const TokenDataset> dataset_;
  GlobalSampler sampler_;
  std::vector<int64_t> rows_;
  HostLoaderOptions options_;
  int shares_per_batch_;

  AdaptiveMutex mutex_;
  std::condition_variable_any changed_;
  std::atomic<uint64_t> changes_{0};  // announce_change() calls: polled by wait_until without the lock
  bool stopping_ = false;
  std::exception_ptr failure_;
  int64_t next_to_read_ = 0;  // the batch number opened next
  DataCursor next_cursor_;    // its cursor
  int64_t retired_ = 0;       // batches every consumer has taken
  struct Slot {
    std::shared_ptr<HostBatch> batch;
    int claimed = 0;  // shares handed to workers
    int read = 0;     // shares read: the batch is ready at shares_per_batch_
    int taken = 0;    // consumers that took it
  };
  std::map<int64_t, Slot> slots_;  // opened and not yet retired
  std::vector<at::Tensor> buffers_;  // buffers of retired batches, free once their storage has no other user
  std::vector<std::thread> workers_;
};

}  // namespace meshtrain::data
