// core_pair_probe.cpp — how much a second core adds to a memory-bound loop on this machine, right now.
//
// The loop is the host loader's: widen rows of 1025 uint16 tokens at random offsets of a 2.4 MB array to int32 (the
// shape of moby-dick-byte and a batch of 32 rows). It runs on 1 thread for 32 rows a batch, then on 2 threads for 16
// rows each, at once; the ratio of the two times per batch is the speed-up from the second core. On the 2-vCPU build
// machines it was 1.2x for some minutes and 2x for others (BENCHMARKS.md, host loader): the benches whose ratios
// depend on two threads sharing the machine (loader_bench, tokenizer 2 threads, parallel_bench) can be read
// against it. Prints one line:
//
//   core pair: 1 thread 2.05 us per batch, 2 threads 1.70 us: 1.21x from the second core
//
//   core_pair_probe [--batches N]   (default 40000, about a tenth of a second per measurement)
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace {

constexpr int kWidth = 1025, kRows = 32, kBuffers = 4;
constexpr size_t kTokens = 1211870;  // moby-dick-byte

__attribute__((noinline)) void widen(const uint16_t* narrow, int count, int32_t* out) {
  for (int i = 0; i < count; ++i) out[i] = narrow[i];
}

struct Probe {
  std::vector<uint16_t> tokens = std::vector<uint16_t>(kTokens);
  std::vector<size_t> offsets;  // random row starts, reused cyclically
  std::vector<std::vector<int32_t>> buffers =
      std::vector<std::vector<int32_t>>(kBuffers, std::vector<int32_t>(kRows * kWidth));

  Probe() {
    std::mt19937_64 random(1);
    for (uint16_t& token : tokens) token = static_cast<uint16_t>(random());
    for (int i = 0; i < 65536; ++i) offsets.push_back(random() % (kTokens - kWidth));
  }

  // Rows [first, first + rows) of every batch, for `batches` batches; returns microseconds per batch.
  double run(int first, int rows, int batches) {
    const auto start = std::chrono::steady_clock::now();
    for (int b = 0; b < batches; ++b) {
      int32_t* out = buffers[b % kBuffers].data();
      for (int r = first; r < first + rows; ++r)
        widen(&tokens[offsets[(static_cast<size_t>(b) * kRows + r) % offsets.size()]], kWidth, out + r * kWidth);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / batches * 1e6;
  }
};

}  // namespace

int main(int argc, char** argv) {
  int batches = 40000;
  for (int i = 1; i < argc; i += 2) {
    if (std::strcmp(argv[i], "--batches")) {
      std::fprintf(stderr, "core_pair_probe: unknown option %s (usage: core_pair_probe [--batches N])\n", argv[i]);
      return 2;
    }
    char* end = nullptr;
    const long value = i + 1 < argc ? std::strtol(argv[i + 1], &end, 10) : 0;
    if (i + 1 >= argc || *end != '\0' || value < 1 || value > 100000000) {
      std::fprintf(stderr, "core_pair_probe: --batches expects a whole number from 1 to 100000000, got %s\n",
                   i + 1 < argc ? argv[i + 1] : "nothing");
      return 2;
    }
    batches = static_cast<int>(value);
  }
  Probe probe;
  probe.run(0, kRows, batches / 10);  // warm-up
  std::vector<double> one, two;
  for (int repeat = 0; repeat < 3; ++repeat) {  // alternated, best of 3 each
    one.push_back(probe.run(0, kRows, batches));
    double halves[2];
    std::atomic<int> ready{0};
    auto half = [&](int h) {
      ready.fetch_add(1);
      while (ready.load() < 2) {
      }
      halves[h] = probe.run(h * kRows / 2, kRows / 2, batches);
    };
    std::thread other(half, 1);
    half(0);
    other.join();
    two.push_back(std::max(halves[0], halves[1]));
  }
  const double best_one = *std::min_element(one.begin(), one.end());
  const double best_two = *std::min_element(two.begin(), two.end());
  std::printf("core pair: 1 thread %.2f us per batch, 2 threads %.2f us: %.2fx from the second core\n", best_one,
              best_two, best_one / best_two);
  return 0;
}
