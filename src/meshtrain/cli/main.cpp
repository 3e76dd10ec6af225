// main.cpp — `meshtrain <verb> ...`: dispatches to the verbs in commands.hpp and prints user errors plainly.
#include "meshtrain/cli/commands.hpp"
#include "meshtrain/common/error.hpp"

#include <cstdio>
#include <cstring>
#include <malloc.h>
#include <string>

namespace {

struct Verb {
  const char* name;
  int (*entry)(int, char**);
  const char* help;
};

const Verb kVerbs[] = {
    {"run", meshtrain::cli::run_command, "start H host processes here, or this node's host in a multi-node job"},
    {"train", meshtrain::cli::train_command, "train a Llama over the mesh (one host; start all with `run`)"},
    {"commcheck", meshtrain::cli::commcheck_command, "run and check one collective over each mesh axis"},
    {"plan", meshtrain::cli::plan_command, "print the mesh and device assignment without starting anything"},
    {"score", meshtrain::cli::score_command, "per-token log-probabilities and mean loss of a text under a checkpoint"},
    {"peak", meshtrain::cli::peak_command, "measure this machine's fp32 and bf16 matmul GFLOP/s"},
    {"prepare", meshtrain::cli::prepare_command, "tokenize text or JSONL files into a token-shard directory"},
    {"tokenize", meshtrain::cli::tokenize_command, "print the token ids of a text (--decode: the text of ids)"},
};

void print_usage() {
  std::fprintf(stderr, "usage: meshtrain <verb> [options] [key=value ...]\n\nverbs:\n");
  for (const Verb& v : kVerbs) std::fprintf(stderr, "  %-10s %s\n", v.name, v.help);
  std::fprintf(stderr, "\n`meshtrain <verb> --help` describes a verb's options.\n");
}

// glibc's default malloc hands the step's large tensor buffers back to the kernel (mmap'd chunks are unmapped on
// free, per-thread arenas drop whole 64 MB heaps as they empty), so every training step page-faults all of its
// activations and gradients in again: ~130k faults per step for llama-10m at 8 x 256 tokens, a third of the step.
// Keep the memory instead: one arena (the device threads' arenas were the ones releasing heaps), no mmap'd chunks,
// no trimming. The process then holds on to its high-water mark, which the next step needs anyway. Must run before
// any thread starts (M_ARENA_MAX applies to arenas created later).
void keep_freed_memory() {
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, -1);
}

}  // namespace

int main(int argc, char** argv) {
  keep_freed_memory();
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    print_usage();
    return argc < 2 ? 2 : 0;
  }
  for (const Verb& v : kVerbs) {
    if (std::strcmp(argv[1], v.name) != 0) continue;
    try {
      return v.entry(argc - 1, argv + 1);
    } catch (const meshtrain::UserError& e) {
      std::fprintf(stderr, "meshtrain %s: error: %s\n", v.name, e.what());
      return 2;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "meshtrain %s: internal error: %s\n", v.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "meshtrain: unknown verb '%s'\n\n", argv[1]);
  print_usage();
  return 2;
}
