// host_loader.hpp — HostLoader: reads this host's rows of each global batch into a host-local int32 batch, ahead of
// the training loop, in background threads (how: docs/data.md, "Host loader").
//
// Of each of its rows the loader copies the token ranges of the read plan (RowPiece: the whole row, or the context
// ranks' chunks when context parallelism splits the rows) and the one token after each range for the labels. Batch n
// is the n-th global batch from the start cursor (GlobalSampler order, epochs rolling over). Every consumer
// (each local device thread) takes every batch, in order; take() returns once the batch is read (the consumer reads
// shares of it meanwhile) and rethrows a worker's failure. At most `prefetch_steps` batches are read ahead of the
// slowest consumer; a batch's buffer is reused for a later batch only once nothing refers to it.
//
// Legend: R = host-local rows (ReadPlan::rows), S = host-local tokens of a row (ReadPlan::local_tokens(): block_size
// unless context parallelism splits the rows).
#pragma once

#include "meshtrain/common/adaptive_mutex.hpp"
#include "meshtrain/data/dataset.hpp"
#include "meshtrain/data/global_sampler.hpp"
#include "meshtrain/data/read_plan.hpp"

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

// A host-local batch in the host-local layout of the input batch (host_local_layout of its spec): row r holds pieces
// of sample sample_ids[r], each at its RowPiece::local_begin.
struct HostBatch {
  DataCursor cursor;
  std::vector<int64_t> sample_ids;  // per host-local row
  at::Tensor inputs_RS;             // int32: the tokens of the pieces
  at::Tensor labels_RS;             // int32: the token after each of them (a view of inputs_RS shifted by one when
                                    // the plan has one piece, the whole row: one copy, as without context)
  at::Tensor documents_RS;          // int32: the document numbers of the inputs (HostLoaderOptions::documents)
  double read_seconds = 0;          // loader-thread time spent reading it (summed over the threads that shared it)
};

struct HostLoaderOptions {
  int prefetch_steps = 2;
  int threads = 2;
  int consumers = 1;  // how many threads take every batch (the host's local devices)
  bool documents = false;  // also read the inputs' document numbers (TokenDataset::read_sample_documents)
};

class HostLoader {
 public:
  // `rows`: the global rows to read (ReadPlan::rows); `pieces`: the token ranges to read of each and where they go in
  // the host-local row (ReadPlan::pieces, dense from 0). Starts the worker threads.
  HostLoader(std::shared_ptr<const TokenDataset> dataset, GlobalSampler sampler, std::vector<int64_t> rows,
             std::vector<RowPiece> pieces, DataCursor start, HostLoaderOptions options);
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
  // Whether a row is one token range: labels_RS is then inputs_RS shifted by one, read with it in one copy.
  bool labels_follow_inputs() const { return pieces_.size() == 1; }

  std::shared_ptr<const TokenDataset> dataset_;
  GlobalSampler sampler_;
  std::vector<int64_t> rows_;
  std::vector<RowPiece> pieces_;
  int64_t row_tokens_;  // S
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
    at::Tensor buffer;  // what the batch's tensors view, reused once nothing refers to it
    int claimed = 0;  // shares handed to workers
    int read = 0;     // shares read: the batch is ready at shares_per_batch_
    int taken = 0;    // consumers that took it
  };
  std::map<int64_t, Slot> slots_;  // opened and not yet retired
  std::vector<at::Tensor> buffers_;  // buffers of retired batches, free once their storage has no other user
  std::vector<std::thread> workers_;
};

}  // namespace meshtrain::data
