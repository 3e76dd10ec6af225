// host_loader.cpp — the worker threads and the in-order hand-over to the local devices.
#include "meshtrain/data/host_loader.hpp"

#include "meshtrain/common/error.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

namespace meshtrain::data {
namespace {

// A hint to the core that this thread is polling (lets a sibling hyperthread run, saves power).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

template <typename Ready>
void HostLoader::wait_until(std::unique_lock<AdaptiveMutex>& lock, Ready&& ready) {
  // The other side is usually a few microseconds away, while falling asleep on the condition variable and being
  // woken costs a system call on each side, more than reading a batch on these machines (BENCHMARKS.md, "Host
  // loader"). So first watch the change counter without the lock and without system calls, then yield the core, and
  // only sleep after kPollFor: a device thread that takes one batch per step polls at most once a step.
  constexpr auto kPollFor = std::chrono::microseconds(50);
  const auto give_up = std::chrono::steady_clock::now() + kPollFor;
  while (!ready()) {
    // Only this side's lock holds `ready` false until someone announces a change: poll the counter unlocked, and
    // take the lock again only once it moved (re-locking while the other side works makes it wait on the futex).
    const uint64_t seen = changes_.load(std::memory_order_acquire);
    lock.unlock();
    bool changed = false;
    while (!changed) {
      for (int i = 0; i < 256 && !changed; ++i) {
        cpu_relax();
        changed = changes_.load(std::memory_order_acquire) != seen;
      }
      if (changed || std::chrono::steady_clock::now() > give_up) break;
      std::this_thread::yield();
    }
    lock.lock();
    if (!changed) {
      changed_.wait(lock, ready);
      return;
    }
  }
}

void HostLoader::announce_change() {
  changes_.fetch_add(1, std::memory_order_relaxed);
  changed_.notify_all();
}

HostLoader::HostLoader(std::shared_ptr<const TokenDataset> dataset, GlobalSampler sampler, std::vector<int64_t> rows,
                       std::vector<RowPiece> pieces, DataCursor start, HostLoaderOptions options)
    : dataset_(std::move(dataset)), sampler_(sampler), rows_(std::move(rows)), pieces_(std::move(pieces)),
      row_tokens_(0), options_(options),
      shares_per_batch_(
          static_cast<int>(std::clamp<int64_t>(static_cast<int64_t>(rows_.size()), 1, options.threads + 1))),
      next_cursor_(start) {
  MT_USER_CHECK(options.prefetch_steps >= 1, "data.prefetch_steps must be at least 1, got {}", options.prefetch_steps);
  MT_USER_CHECK(options.threads >= 1, "data.loader_threads must be at least 1, got {}", options.threads);
  MT_CHECK(options.consumers >= 1, "a host loader needs a consumer");
  MT_CHECK(!pieces_.empty(), "a host loader needs the token ranges of a row to read");
  for (const RowPiece& piece : pieces_) {
    MT_CHECK(piece.local_begin == row_tokens_ && piece.range.size() > 0 && piece.range.begin >= 0 &&
                 piece.range.end <= dataset_->block_size(),
             "token range {}:{} at {} of a host-local row: the ranges must fill the row in order, inside the {} "
             "inputs of a sample", piece.range.begin, piece.range.end, piece.local_begin, dataset_->block_size());
    row_tokens_ += piece.range.size();
  }
  MT_USER_CHECK(start.epoch >= 0 && start.step >= 0 && start.step < sampler.batches_per_epoch(),
                "data cursor (epoch {}, step {}) is outside the {} batches of an epoch (a data state saved with "
                "another dataset, block_size or global_batch_size?)", start.epoch, start.step,
                sampler.batches_per_epoch());
  for (int i = 0; i < options.threads; ++i) workers_.emplace_back([this] { work(); });
}

HostLoader::~HostLoader() {
  {
    std::lock_guard<AdaptiveMutex> lock(mutex_);
    stopping_ = true;
  }
  announce_change();
  for (std::thread& worker : workers_) worker.join();
}

void HostLoader::work() {
  std::unique_lock<AdaptiveMutex> lock(mutex_);
  while (true) {
    wait_until(lock, [&] { return stopping_ || failure_ || claimable(); });
    if (stopping_ || failure_) return;
    read_share(lock, claim());
  }
}

void HostLoader::read_share(std::unique_lock<AdaptiveMutex>& lock, const Share& share) {
  lock.unlock();
  double seconds = 0;
  std::exception_ptr failure;
  try {
    seconds = read(share);
  } catch (...) {
    failure = std::current_exception();
  }
  lock.lock();
  if (failure) {
    if (!failure_) failure_ = failure;
  } else {
    Slot& slot = slots_.at(share.n);  // kept until every consumer took it, after every share was read
    slot.batch->read_seconds += seconds;
    if (++slot.read < shares_per_batch_) return;
  }
  announce_change();
}

bool HostLoader::claimable() const {
  const bool newest_has_shares = !slots_.empty() && slots_.rbegin()->second.claimed < shares_per_batch_;
  return newest_has_shares || next_to_read_ < retired_ + options_.prefetch_steps;
}

HostLoader::Share HostLoader::claim() {
  if (slots_.empty() || slots_.rbegin()->second.claimed == shares_per_batch_) {  // open the next batch
    auto batch = std::make_shared<HostBatch>();
    batch->sample_ids.resize(rows_.size());
    // A buffer only this list refers to (no batch holds it, no view of it is alive): no consumer still reads it.
    // (c10's use counts are read with acquire order: the consumers' reads happen before the reuse.)
    auto reusable = std::find_if(buffers_.begin(), buffers_.end(), [](const at::Tensor& b) {
      return b.use_count() == 1 && b.storage().use_count() == 1;
    });
    at::Tensor buffer;
    const int64_t rows = static_cast<int64_t>(rows_.size());
    if (reusable != buffers_.end()) {
      buffer = std::move(*reusable);
      buffers_.erase(reusable);
    } else {  // [R, S + 1] whose columns 1: are the labels of columns :S, or [2, R, S]: inputs, then labels
      buffer = labels_follow_inputs() ? at::empty({rows, row_tokens_ + 1}, at::kInt)
                                      : at::empty({2, rows, row_tokens_}, at::kInt);
    }
    batch->inputs_RS = labels_follow_inputs() ? buffer.narrow(1, 0, row_tokens_) : buffer[0];
    batch->labels_RS = labels_follow_inputs() ? buffer.narrow(1, 1, row_tokens_) : buffer[1];
    if (options_.documents) batch->documents_RS = at::empty({rows, row_tokens_}, at::kInt);
    batch->cursor = next_cursor_;
    next_cursor_ = sampler_.next(next_cursor_);
    Slot& slot = slots_[next_to_read_++];
    slot.batch = std::move(batch);
    slot.buffer = std::move(buffer);
  }
  auto& [n, slot] = *slots_.rbegin();
  const int64_t rows = static_cast<int64_t>(rows_.size()), share = slot.claimed++;
  return {n, slot.batch.get(), rows * share / shares_per_batch_, rows * (share + 1) / shares_per_batch_};
}

double HostLoader::read(const Share& share) const {
  const auto start = std::chrono::steady_clock::now();
  HostBatch& batch = *share.batch;  // this share's rows only: other workers fill the others
  sampler_.samples_at(batch.cursor.epoch, batch.cursor.step, rows_.data() + share.begin,
                      static_cast<size_t>(share.end - share.begin), batch.sample_ids.data() + share.begin);
  int32_t* const inputs = batch.inputs_RS.data_ptr<int32_t>();
  int32_t* const labels = batch.labels_RS.data_ptr<int32_t>();
  const int64_t inputs_stride = batch.inputs_RS.stride(0), labels_stride = batch.labels_RS.stride(0);
  for (int64_t r = share.begin; r < share.end; ++r)
    for (const RowPiece& piece : pieces_) {
      const mesh::TokenRange& range = piece.range;
      int32_t* in = inputs + r * inputs_stride + piece.local_begin;
      if (labels_follow_inputs()) {  // the range and the token after it, in one copy
        dataset_->read_sample(batch.sample_ids[r], {range.begin, range.end + 1}, in);
        continue;
      }
      int32_t* next = labels + r * labels_stride + piece.local_begin;  // the next token of each input
      dataset_->read_sample(batch.sample_ids[r], range, in);
      std::memcpy(next, in + 1, static_cast<size_t>(range.size() - 1) * sizeof(int32_t));
      dataset_->read_sample(batch.sample_ids[r], {range.end, range.end + 1}, next + range.size() - 1);
    }
  if (options_.documents) {
    int32_t* const documents = batch.documents_RS.data_ptr<int32_t>();
    for (int64_t r = share.begin; r < share.end; ++r)
      for (const RowPiece& piece : pieces_)
        dataset_->read_sample_documents(batch.sample_ids[r], piece.range,
                                        documents + r * row_tokens_ + piece.local_begin);
  }
  return seconds_since(start);
}

HostLoader::Taken HostLoader::take(int64_t n) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<AdaptiveMutex> lock(mutex_);
  MT_CHECK(n >= retired_, "batch {} was already taken by every consumer", n);
  auto ready = [&] {
    auto slot = slots_.find(n);
    return slot != slots_.end() && slot->second.read == shares_per_batch_;
  };
  while (true) {  // a consumer that would wait reads a share itself, as a worker would
    wait_until(lock, [&] { return failure_ || ready() || claimable(); });
    if (failure_ || ready()) break;
    read_share(lock, claim());
  }
  if (failure_) std::rethrow_exception(failure_);
  Taken taken;
  taken.wait_seconds = seconds_since(start);
  Slot& slot = slots_.at(n);
  taken.batch = slot.batch;
  taken.first = slot.taken++ == 0;
  if (slot.taken == options_.consumers) {
    MT_CHECK(n == retired_, "batch {} finished before batch {}: consumers must take batches in order", n, retired_);
    buffers_.push_back(slot.buffer);
    slots_.erase(n);
    ++retired_;
    announce_change();
  }
  return taken;
}

}  // namespace meshtrain::data
