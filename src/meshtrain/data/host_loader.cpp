// host_loader.cpp — the worker threads and the in-order hand-over to the local devices.
#include "meshtrain/data/host_loader.hpp"

#include "meshtrain/common/error.hpp"

#include <algorithm>
#include <chrono>

namespace meshtrain::data {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

HostLoader::HostLoader(std::shared_ptr<const TokenDataset> dataset, GlobalSampler sampler, std::vector<int64_t> rows,
                       DataCursor start, HostLoaderOptions options)
    : dataset_(std::move(dataset)), sampler_(sampler), rows_(std::move(rows)), options_(options),
      next_cursor_(start) {
  MT_USER_CHECK(options.prefetch_steps >= 1, "data.prefetch_steps must be at least 1, got {}", options.prefetch_steps);
  MT_USER_CHECK(options.threads >= 1, "data.loader_threads must be at least 1, got {}", options.threads);
  MT_CHECK(options.consumers >= 1, "a host loader needs a consumer");
  MT_USER_CHECK(start.epoch >= 0 && start.step >= 0 && start.step < sampler.batches_per_epoch(),
                "data cursor (epoch {}, step {}) is outside the {} batches of an epoch (a data state saved with "
                "another dataset, block_size or global_batch_size?)", start.epoch, start.step,
                sampler.batches_per_epoch());
  for (int i = 0; i < options.threads; ++i) workers_.emplace_back([this] { work(); });
}

HostLoader::~HostLoader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void HostLoader::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return stopping_ || failure_ || next_to_read_ < retired_ + options_.prefetch_steps; });
    if (stopping_ || failure_) return;
    const int64_t n = next_to_read_++;
    auto batch = std::make_shared<HostBatch>();
    batch->cursor = next_cursor_;
    next_cursor_ = sampler_.next(next_cursor_);
    slots_[n];
    at::Tensor buffer;
    // A buffer only this list refers to (no batch holds it, no view of it is alive): no consumer still reads it.
    auto reusable = std::find_if(buffers_.begin(), buffers_.end(), [](const at::Tensor& b) {
      return b.use_count() == 1 && b.storage().use_count() == 1;
    });
    if (reusable != buffers_.end()) {
      buffer = std::move(*reusable);
      buffers_.erase(reusable);
    }
    lock.unlock();
    try {
      read(*batch, std::move(buffer));
    } catch (...) {
      lock.lock();
      failure_ = std::current_exception();
      changed_.notify_all();
      return;
    }
    lock.lock();
    slots_[n].batch = std::move(batch);
    changed_.notify_all();
  }
}

void HostLoader::read(HostBatch& batch, at::Tensor buffer) const {
  const auto start = std::chrono::steady_clock::now();
  const int64_t rows = static_cast<int64_t>(rows_.size()), width = dataset_->block_size() + 1;
  batch.tokens_RT1 = buffer.defined() ? std::move(buffer) : at::empty({rows, width}, at::kInt);
  int32_t* out = batch.tokens_RT1.data_ptr<int32_t>();
  batch.sample_ids.resize(rows);
  for (int64_t r = 0; r < rows; ++r) {
    batch.sample_ids[r] = sampler_.sample_at(batch.cursor.epoch, batch.cursor.step, rows_[r]);
    dataset_->read_sample(batch.sample_ids[r], out + r * width);
  }
  batch.read_seconds = seconds_since(start);
}

HostLoader::Taken HostLoader::take(int64_t n) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  MT_CHECK(n >= retired_, "batch {} was already taken by every consumer", n);
  changed_.wait(lock, [&] {
    if (failure_) return true;
    auto slot = slots_.find(n);
    return slot != slots_.end() && slot->second.batch != nullptr;
  });
  if (failure_) std::rethrow_exception(failure_);
  Taken taken;
  taken.wait_seconds = seconds_since(start);
  Slot& slot = slots_.at(n);
  taken.batch = slot.batch;
  taken.first = slot.taken++ == 0;
  if (slot.taken == options_.consumers) {
    MT_CHECK(n == retired_, "batch {} finished before batch {}: consumers must take batches in order", n, retired_);
    buffers_.push_back(slot.batch->tokens_RT1);
    slots_.erase(n);
    ++retired_;
    changed_.notify_all();
  }
  return taken;
}

}  // namespace meshtrain::data
