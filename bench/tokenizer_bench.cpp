// tokenizer_bench.cpp — meshtrain's encoding throughput on a text file: tokens/s on 1 thread (whole text, one
// call) and on N threads (encode_parallel), best of several runs, with a hash of the ids so that a peer's output can
// be checked to be the same tokens. Run by bench/tokenizer_bench.sh, which compares it with gpt-tokenizer on Node.
//
//   tokenizer_bench --tokenizer cl100k_base --text FILE [--runs 5] [--threads N]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "meshtrain/tokenizer/tokenizer.hpp"

using meshtrain::tokenizer::Tokenizer;

namespace {

// The same rolling hash as bench/tokenizer_peer.mjs: h = h * 31 + id (mod 2^32).
uint32_t ids_hash(const std::vector<uint32_t>& ids) {
  uint32_t h = 0;
  for (uint32_t id : ids) h = h * 31u + id;
  return h;
}

template <typename Encode>
double best_seconds(int runs, Encode&& encode) {
  double best = 1e30;
  for (int r = 0; r < runs; ++r) {
    auto start = std::chrono::steady_clock::now();
    encode();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_name = "cl100k_base", text_path;
  int runs = 5, threads = int(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokenizer"))
      tokenizer_name = argv[i + 1];
    else if (!std::strcmp(argv[i], "--text"))
      text_path = argv[i + 1];
    else if (!std::strcmp(argv[i], "--runs"))
      runs = std::stoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads"))
      threads = std::stoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (text_path.empty()) {
    std::fprintf(stderr, "usage: tokenizer_bench --tokenizer NAME --text FILE [--runs N] [--threads N]\n");
    return 2;
  }
  try {
    auto tokenizer = meshtrain::tokenizer::load_tokenizer(tokenizer_name);
    std::string text = meshtrain::tokenizer::read_file_bytes(text_path);
    std::vector<uint32_t> ids = tokenizer->encode(text);  // warm-up, and the reference output
    double serial = best_seconds(runs, [&] { ids = tokenizer->encode(text); });
    std::vector<uint32_t> parallel_ids;
    double parallel = best_seconds(runs, [&] { parallel_ids = tokenizer->encode_parallel(text, threads); });
    if (parallel_ids != ids) {
      std::fprintf(stderr, "encode_parallel differs from encode\n");
      return 1;
    }
    std::printf(
        "meshtrain tokenizer=%s bytes=%zu tokens=%zu hash=%08x 1-thread=%.0f tokens/s %d-thread=%.0f tokens/s\n",
        tokenizer_name.c_str(), text.size(), ids.size(), ids_hash(ids), ids.size() / serial, threads,
        ids.size() / parallel);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenizer_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
