// commands.hpp — the `meshtrain <verb>` entry points. Each verb lives in <verb>_command.cpp and takes the
// arguments after the verb (argv[0] is the verb). It returns the process exit code; UserError reaches main().
#pragma once

namespace meshtrain::cli {

int run_command(int argc, char** argv);        // meshtrain run: start host processes (launcher)
int train_command(int argc, char** argv);      // meshtrain train: one host of a training job
int commcheck_command(int argc, char** argv);  // meshtrain commcheck: collectives over every mesh axis, checked
int plan_command(int argc, char** argv);       // meshtrain plan: mesh, device assignment (and more) without starting
int score_command(int argc, char** argv);      // meshtrain score: per-token log-probs and loss under a checkpoint
int generate_command(int argc, char** argv);   // meshtrain generate: tokens after a prompt, from a checkpoint
int plot_command(int argc, char** argv);       // meshtrain plot: metrics.svg of a run from its metrics.jsonl
int peak_command(int argc, char** argv);       // meshtrain peak: this machine's fp32/bf16 matmul GFLOP/s
int prepare_command(int argc, char** argv);    // meshtrain prepare: text/JSONL files into token shards
int tokenize_command(int argc, char** argv);   // meshtrain tokenize: token ids of a text, or text of ids

}  // namespace meshtrain::cli
