// pipeline_schedule.hpp — pipeline parallelism's plan, without tensors: which decoder layers each stage holds
// (balanced by compute, the embedding with the first stage and the final norm, head and loss with the last), the
// order in which a stage runs its micro-batches' forward and backward passes (GPipe, 1F1B, and both interleaved over
// virtual stages), the text timeline of a schedule with its bubbles, and the bubble it implies.
//
// Virtual stages (pipeline.virtual_stages = V > 1, Megatron's interleaved schedule): the layers are cut into S x V
// stages, and the device of pipeline rank r holds stages r, r + S, ..., r + (V - 1) S (its "chunks" v = 0..V-1), so a
// micro-batch goes around the ranks V times; the bubble shrinks V-fold for V-fold the transfers. The parallel model runs the order (parallel_model.hpp); the
// trainer and `meshtrain plan` print the plan and the timeline.
#pragma once

#include "meshtrain/config/llama_config.hpp"
#include "meshtrain/settings/settings.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain::parallel {

// Decoder layers [first, end) of one stage.
struct StageLayers {
  int64_t first = 0, end = 0;
  int64_t size() const { return end - first; }
  bool operator==(const StageLayers& other) const { return first == other.first && end == other.end; }
};

// The layers of each of `stages` x `virtual_stages` stages (stage c on pipeline rank c mod `stages`):
// `layers_per_stage` when given (pipeline.layers_per_stage), otherwise the split that makes the most expensive stage
// cheapest, a layer costing `layer_cost` and the head `head_cost` more on the last stage (ties: the most even, then
// the earlier stages larger). UserError naming pipeline (more stages than layers) or pipeline.layers_per_stage (not
// one count per stage, or not summing to the layers), with a value that fits.
std::vector<StageLayers> split_layers(int64_t num_layers, int stages, double layer_cost, double head_cost,
                                      const std::vector<int64_t>& layers_per_stage = {}, int virtual_stages = 1);
// The same for a model: the costs are its training FLOPs per token of one layer and of the head at `block_size`.
std::vector<StageLayers> split_layers(const config::LlamaConfig& model, int64_t block_size, int stages,
                                      const std::vector<int64_t>& layers_per_stage = {}, int virtual_stages = 1);
// "stage 0: embedding, layers 0-3; stage 1: layers 4-7, final norm, head and loss"; with `ranks` fewer than the
// stages (virtual stages), each stage says its rank: "stage 2 (rank 0): layers 4-5".
std::string describe_stages(const std::vector<StageLayers>& stages, int ranks = 0);

// The micro-batches one forward/backward pass over a device's `rows` rows is split into: `configured`
// (pipeline.microbatches), or one per row when it is 0. UserError naming pipeline.microbatches, with the counts that
// would fit, unless it divides the rows and, with virtual stages, is a multiple of the `stages` (the interleaved
// schedule sends the micro-batches around the ranks in groups of `stages`).
int64_t pipeline_microbatches(int64_t configured, int64_t rows, int stages = 1, int virtual_stages = 1);

// One pass of a pipeline rank over one micro-batch through one of its stages (`chunk` v: stage v x stages + rank).
struct StageAction {
  enum class Kind { forward, backward } kind = Kind::forward;
  int64_t microbatch = 0;
  int chunk = 0;
  bool operator==(const StageAction& other) const {
    return kind == other.kind && microbatch == other.microbatch && chunk == other.chunk;
  }
};

// What pipeline rank `stage` of `stages` runs, in order, for `microbatches` micro-batches. Without virtual stages:
// GPipe, every forward then every backward (in the same order); 1F1B, min(stages - 1 - stage, microbatches) forwards
// to fill the pipeline, then one forward and one backward in turn, then the backwards left (at most stages - stage
// micro-batches in flight). With V virtual stages (Megatron's interleaving): the k-th forward is of micro-batch
// (k / (S V)) S + k mod S on chunk (k / S) mod V, the k-th backward the same on chunk V - 1 - (k / S) mod V; 1F1B fills
// the pipeline with min(2 (S - 1 - stage) + (V - 1) S, M V) forwards; GPipe runs every forward first.
std::vector<StageAction> stage_actions(settings::PipelineSchedule schedule, int stages, int stage,
                                       int64_t microbatches, int virtual_stages = 1);
// The most (micro-batch, chunk) passes whose activations a rank keeps at once under the schedule (forwards not yet
// backwarded).
int64_t microbatches_in_flight(settings::PipelineSchedule schedule, int stages, int stage, int64_t microbatches,
                               int virtual_stages = 1);

// The ideal bubble: the fraction of a pass each rank idles when every stage takes the same time,
// (stages - 1) / (virtual_stages x microbatches + stages - 1), for GPipe and 1F1B alike.
double ideal_bubble_fraction(int stages, int64_t microbatches, int virtual_stages = 1);

// The schedule simulated with every forward through one stage taking one slot and every backward two: one line per
// rank, a cell per slot ("F3" a forward of micro-batch 3, "B3" a backward, ".." idle; with virtual stages "F3.1" is
// micro-batch 3 on the rank's chunk 1), then the bubble of the simulation, e.g.
//   stage 0 | F0 F1 .. .. B0 B0 F2 ...
std::string schedule_timeline(settings::PipelineSchedule schedule, int stages, int64_t microbatches,
                              int virtual_stages = 1);

const char* schedule_name(settings::PipelineSchedule schedule);  // "gpipe", "1f1b"

// The pipeline of a job on `mesh` as the start-up log and `meshtrain plan` print it: the stages' layers, the schedule
// with its micro-batches for passes of `pass_rows` rows per device and what travels between stages, then the
// timeline; lines of text, none without a pipeline. UserError as split_layers and pipeline_microbatches.
std::vector<std::string> describe_pipeline(const settings::Settings& settings, const mesh::Mesh& mesh,
                                           int64_t pass_rows);

}  // namespace meshtrain::parallel
