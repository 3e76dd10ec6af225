// loader_bench.cpp — host-loader throughput against memcpy of the same bytes (the limit) and against a PyTorch
// DataLoader + DistributedSampler over a NumPy memmap of the same shards (bench/loader_peer.py, run here), in one run.
//
//   build-dir/bench/loader_bench [--dataset moby-dick-byte] [--global-batch-size 64] [--block-size 1024] [--hosts 2]
//                                [--devices-per-host 4] [--threads 2] [--prefetch 2] [--batches 200] [--runs 5]
//                                [--random-tokens N] [--no-peer]
//
// --random-tokens N reads, instead of --dataset, a shard of N random uint16 tokens written to a scratch folder first
// (removed at the end): with N x 2 bytes well above the CPU caches, memcpy runs at memory speed, as on a real corpus.
// --no-peer skips the PyTorch peer (to profile the host loader alone, e.g. under `perf record`).
//
// Host 0's rows of a job of `hosts` x `devices-per-host` devices with the batch over fsdp (every host reads
// global_batch_size / hosts rows). Each side reads the same global batches (same seed) after a warm-up; the median
// of `runs` timed runs of `batches` batches is reported. Tokens/s counts input tokens (rows x block_size); GB/s counts
// the token bytes read from the shards (rows x (block_size + 1) x token width). memcpy copies exactly those bytes,
// one thread, from precomputed offsets; the host loader also looks up the sample ids and widens to int32. The consumer
// (one thread taking batches as fast as it can, as a device thread would if the loader were its bottleneck) reads
// shares of a batch itself while it waits, as HostLoader::take does.
#include "meshtrain/common/error.hpp"
#include "meshtrain/data/dataset.hpp"
#include "meshtrain/data/global_sampler.hpp"
#include "meshtrain/data/host_loader.hpp"
#include "meshtrain/data/read_plan.hpp"
#include "meshtrain/mesh/mesh.hpp"
#include "meshtrain/token_shards/shard_writer.hpp"

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <vector>

using namespace meshtrain;

namespace {

double seconds_of(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Writes `total` random uint16 tokens (documents of 4096) as a one-shard directory in a fresh scratch folder.
std::filesystem::path write_random_shard(uint64_t total) {
  char scratch[] = "/tmp/meshtrain-loader-bench-XXXXXX";
  MT_USER_CHECK(::mkdtemp(scratch) != nullptr, "cannot create a scratch folder under /tmp");
  const std::filesystem::path dir = scratch;
  token_shards::ShardIndex index;
  index.tokenizer = {"random", "byte", "random:65536", 65536, -1};
  index.token_bytes = 2;
  token_shards::ShardWriter writer(dir / "shard_00000.tok", 2, "random", "random:65536");
  std::vector<uint32_t> document(4096);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (uint64_t done = 0; done < total; done += document.size()) {
    document.resize(std::min<uint64_t>(4096, total - done));
    for (uint32_t& id : document) {  // xorshift64
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      id = static_cast<uint32_t>(state >> 48);
    }
    writer.append_document(document.data(), document.size());
  }
  index.shards.push_back(writer.finish());
  index.total_tokens = index.shards.back().tokens;
  index.total_documents = index.shards.back().documents;
  std::ofstream(dir / token_shards::kIndexFileName) << token_shards::index_to_json(index);
  return dir;
}

// Runs the PyTorch peer (bench/loader_peer.py) and returns the tokens/s it prints.
double peer_tokens_per_s(const std::string& command) {
  FILE* pipe = ::popen(command.c_str(), "r");
  MT_USER_CHECK(pipe, "cannot run {}", command);
  std::string output;
  char buffer[4096];
  while (size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  MT_USER_CHECK(::pclose(pipe) == 0, "the PyTorch peer failed: {}\n{}", command, output);
  return nlohmann::json::parse(output).at("tokens_per_s").get<double>();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"meshtrain host loader vs memcpy of the same bytes vs PyTorch DataLoader + DistributedSampler"};
  std::string dataset_name = "moby-dick-byte";
  int64_t global_batch_size = 64, block_size = 1024;
  int hosts = 2, devices_per_host = 4, threads = 2, prefetch = 2, batches = 200, runs = 5;
  uint64_t random_tokens = 0;
  bool no_peer = false;
  app.add_option("--dataset", dataset_name, "token-shard directory or name under assets/shards")->capture_default_str();
  app.add_option("--global-batch-size", global_batch_size)->capture_default_str();
  app.add_option("--block-size", block_size)->capture_default_str();
  app.add_option("--hosts", hosts)->capture_default_str();
  app.add_option("--devices-per-host", devices_per_host)->capture_default_str();
  app.add_option("--threads", threads, "host loader threads = DataLoader workers")->capture_default_str();
  app.add_option("--prefetch", prefetch, "steps read ahead = DataLoader prefetch_factor")->capture_default_str();
  app.add_option("--batches", batches, "batches per timed run")->capture_default_str();
  app.add_option("--runs", runs)->capture_default_str();
  app.add_option("--random-tokens", random_tokens, "read a scratch shard of this many random tokens instead");
  app.add_flag("--no-peer", no_peer, "skip the PyTorch DataLoader peer");
  CLI11_PARSE(app, argc, argv);
  std::filesystem::path scratch;
  if (random_tokens > 0) dataset_name = (scratch = write_random_shard(random_tokens)).string();

  const uint64_t seed = 42;
  auto dataset = std::make_shared<const data::TokenDataset>(data::TokenDataset::resolve(dataset_name), block_size);
  const data::GlobalSampler sampler(seed, dataset->num_samples(), global_batch_size);
  const mesh::Mesh mesh = mesh::Mesh::create(mesh::AxisSizes{{1, hosts * devices_per_host, 1, 1, 1}},
                                             mesh::AxisSizes{{1, 1, 1, 1, 1}}, hosts, devices_per_host);
  const data::ReadPlan plan = data::ReadPlan::make(mesh, global_batch_size, block_size,
                                                   sharding::PartitionSpec::parse("(data,fsdp),None"), 0);
  const int64_t rows = static_cast<int64_t>(plan.rows.size());
  const uint32_t token_bytes = dataset->index().token_bytes;
  const double tokens_per_batch = static_cast<double>(rows * block_size);
  const double bytes_per_batch = static_cast<double>(rows * (block_size + 1) * token_bytes);
  fmt::print("dataset {} ({} tokens, {}-byte tokens, {} samples of {}+1), host 0 of {} x {}: {} rows per batch, {} "
             "batches per run, median of {} runs\n", dataset->path().string(), dataset->index().total_tokens,
             token_bytes, dataset->num_samples(), block_size, hosts, devices_per_host, rows, batches, runs);

  // memcpy: the same rows' token bytes, from the same mapping, offsets computed beforehand.
  const token_shards::ShardDirectory shards = token_shards::ShardDirectory::open(dataset->path(), {"", token_shards::PayloadCheck::never});
  MT_USER_CHECK(shards.shards().size() == 1, "the memcpy baseline reads one shard; {} has {}",
                dataset->path().string(), shards.shards().size());
  const uint8_t* stream = static_cast<const uint8_t*>(shards.shards()[0].tokens());
  std::vector<const uint8_t*> sources;
  for (data::DataCursor cursor; static_cast<int>(sources.size()) < batches * rows; cursor = sampler.next(cursor))
    for (int64_t row : plan.rows)
      sources.push_back(stream + sampler.sample_at(cursor.epoch, cursor.step, row) * block_size * token_bytes);
  std::vector<uint8_t> destination(static_cast<size_t>(bytes_per_batch));
  const size_t row_bytes = static_cast<size_t>((block_size + 1) * token_bytes);
  std::vector<double> memcpy_rates;
  for (int run = 0; run <= runs; ++run) {  // run 0 warms up
    const double seconds = seconds_of([&] {
      for (int b = 0; b < batches; ++b)
        for (int64_t r = 0; r < rows; ++r)
          std::memcpy(destination.data() + r * row_bytes, sources[b * rows + r], row_bytes);
    });
    if (run) memcpy_rates.push_back(tokens_per_batch * batches / seconds);
  }

  // The host loader, as the pipeline runs it (one consumer here), with `threads` and with one thread; with the
  // median thread time spent reading a batch (HostBatch::read_seconds: summed over the threads that read its shares,
  // so it can exceed the wall time per batch taken).
  std::vector<double> read_us;
  auto loader_rate = [&](int loader_threads) {
    std::vector<double> rates, reads;
    for (int run = 0; run <= runs; ++run) {
      data::HostLoader loader(dataset, sampler, plan.rows, plan.pieces, {0, 0}, {prefetch, loader_threads, 1});
      for (int n = 0; n < 2; ++n) loader.take(n);  // threads started, first reads done
      double read_seconds = 0;
      const double seconds = seconds_of([&] {
        for (int n = 2; n < batches + 2; ++n) read_seconds += loader.take(n).batch->read_seconds;
      });
      if (run) {
        rates.push_back(tokens_per_batch * batches / seconds);
        reads.push_back(read_seconds / batches * 1e6);
      }
    }
    read_us.push_back(median(reads));
    return median(rates);
  };
  const double loader = loader_rate(threads), loader_one_thread = loader_rate(1);

  const double peer = no_peer ? 0 : peer_tokens_per_s(fmt::format(
      "/usr/bin/python3 {}/bench/loader_peer.py --dataset '{}' --block-size {} --rows {} --hosts {} --host 0 "
      "--workers {} --prefetch {} --batches {} --runs {}", MESHTRAIN_SOURCE_DIR, dataset->path().string(), block_size,
      rows, hosts, threads, prefetch, batches, std::max(1, runs / 2)));

  const double memcpy_rate = median(memcpy_rates);
  auto line = [&](const std::string& name, double tokens_per_s) {
    fmt::print("{:<46} {:>9.1f} M tokens/s {:>7.2f} GB/s\n", name, tokens_per_s / 1e6,
               tokens_per_s / tokens_per_batch * bytes_per_batch / 1e9);
  };
  if (!scratch.empty()) std::filesystem::remove_all(scratch);
  line("memcpy of the same bytes (1 thread)", memcpy_rate);
  line(fmt::format("meshtrain host loader ({} threads + consumer)", threads), loader);
  line("meshtrain host loader (1 thread + consumer)", loader_one_thread);
  if (!no_peer) {
    line(fmt::format("PyTorch DataLoader + DistributedSampler ({} workers)", threads), peer);
    fmt::print("ratio host loader / PyTorch DataLoader: {:.1f}x (goal >= 10x)\n", loader / peer);
  }
  fmt::print("ratio host loader / memcpy: {:.2f} (goal >= 0.33); 1 thread: {:.2f}\n", loader / memcpy_rate,
             loader_one_thread / memcpy_rate);
  const double memcpy_us = tokens_per_batch / memcpy_rate * 1e6;
  fmt::print("per batch: memcpy {:.1f} us; host loader {:.1f} us, reading it took {:.1f} us of thread time ({} threads "
             "+ consumer); 1 thread {:.1f} us, reading {:.1f} us\n", memcpy_us, tokens_per_batch / loader * 1e6,
             read_us[0], threads, tokens_per_batch / loader_one_thread * 1e6, read_us[1]);
  return 0;
}
