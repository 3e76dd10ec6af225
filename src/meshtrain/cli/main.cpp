// main.cpp — `meshtrain <verb> ...`: dispatches to the verbs in commands.hpp and prints user errors plainly.
#include "meshtrain/cli/commands.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/runtime/block_cache_allocator.hpp"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
    {"generate", meshtrain::cli::generate_command, "generate text after a prompt from a checkpoint (KV cache)"},
    {"plot", meshtrain::cli::plot_command, "draw a run's loss, eval loss and step times as <output_dir>/metrics.svg"},
    {"peak", meshtrain::cli::peak_command, "measure this machine's fp32 and bf16 matmul GFLOP/s"},
    {"prepare", meshtrain::cli::prepare_command, "tokenize text or JSONL files into a token-shard directory"},
    {"tokenize", meshtrain::cli::tokenize_command, "print the token ids of a text (--decode: the text of ids)"},
};

void print_usage() {
  std::fprintf(stderr, "usage: meshtrain <verb> [options] [key=value ...]\n\nverbs:\n");
  for (const Verb& v : kVerbs) std::fprintf(stderr, "  %-10s %s\n", v.name, v.help);
  std::fprintf(stderr, "\n`meshtrain <verb> --help` describes a verb's options.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (!meshtrain::runtime::set_up_process_memory()) return 2;
  // A write to a peer that has gone away (Gloo's sockets, the TCP store) must fail with EPIPE, which the runtime
  // reports as a transport error and then replaces with the published reason, not kill the host silently.
  std::signal(SIGPIPE, SIG_IGN);
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
