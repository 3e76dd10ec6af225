// pipeline_schedule.cpp — stage split, schedules, timeline.
#include "meshtrain/parallel/pipeline_schedule.hpp"

#include "meshtrain/common/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <sstream>

namespace meshtrain::parallel {
namespace {

std::string counts_text(const std::vector<StageLayers>& stages) {
  std::string out;
  for (const StageLayers& s : stages) out += fmt::format("{}{}", out.empty() ? "" : ",", s.size());
  return out;
}

// The balanced split: the counts that make the most expensive stage cheapest, and among those the most even (the
// smallest sum of squared stage costs), by dynamic programming over the first k layers on the first s stages; among
// splits equal in both, the one whose earlier stages hold more layers.
std::vector<StageLayers> balanced_split(int64_t num_layers, int stages, double layer_cost, double head_cost) {
  struct Cost {
    double worst = std::numeric_limits<double>::infinity(), squares = 0;
    bool better_than(const Cost& other) const {
      constexpr double kTolerance = 1e-9;
      if (worst < other.worst * (1 - kTolerance)) return true;
      return worst <= other.worst * (1 + kTolerance) && squares < other.squares * (1 - kTolerance);
    }
  };
  // best[s][k]: layers [0, k) on stages [0, s); first[s][k]: the first layer of stage s - 1 in it.
  std::vector<std::vector<Cost>> best(stages + 1, std::vector<Cost>(num_layers + 1));
  std::vector<std::vector<int64_t>> first(stages + 1, std::vector<int64_t>(num_layers + 1, 0));
  best[0][0] = {0, 0};
  for (int s = 1; s <= stages; ++s)
    for (int64_t k = s; k <= num_layers; ++k)
      for (int64_t f = k - 1; f >= s - 1; --f) {  // stage s - 1 smallest first: ties keep the earlier stages larger
        const double cost = static_cast<double>(k - f) * layer_cost + (s == stages ? head_cost : 0.0);
        const Cost candidate{std::max(best[s - 1][f].worst, cost), best[s - 1][f].squares + cost * cost};
        if (candidate.better_than(best[s][k])) {
          best[s][k] = candidate;
          first[s][k] = f;
        }
      }
  std::vector<StageLayers> split(stages);
  int64_t end = num_layers;
  for (int s = stages; s >= 1; --s) {
    split[s - 1] = {first[s][end], end};
    end = first[s][end];
  }
  return split;
}

}  // namespace

std::vector<StageLayers> split_layers(int64_t num_layers, int stages, double layer_cost, double head_cost,
                                      const std::vector<int64_t>& layers_per_stage, int virtual_stages) {
  const int pieces = stages * virtual_stages;
  const std::string layout = virtual_stages == 1 ? fmt::format("pipeline={}", stages)
                                                 : fmt::format("pipeline={} x pipeline.virtual_stages={}", stages,
                                                               virtual_stages);
  MT_USER_CHECK(pieces >= 1 && pieces <= num_layers,
                "{} splits the model into {} stages, but it has {} decoder layers (model.num_hidden_layers): use {} at "
                "most", layout, pieces, num_layers,
                virtual_stages == 1 ? fmt::format("pipeline={}", num_layers)
                                    : fmt::format("pipeline x pipeline.virtual_stages = {}", num_layers));
  const std::vector<StageLayers> balanced = balanced_split(num_layers, pieces, layer_cost, head_cost);
  if (layers_per_stage.empty()) return balanced;
  const int64_t total = std::accumulate(layers_per_stage.begin(), layers_per_stage.end(), int64_t{0});
  MT_USER_CHECK(static_cast<int>(layers_per_stage.size()) == pieces && total == num_layers,
                "pipeline.layers_per_stage gives {} stages with {} layers in all, but the mesh has {} ({} stages) and "
                "the model {} decoder layers: give one count per stage summing to {} (e.g. \"{}\", the split balanced "
                "by compute)", layers_per_stage.size(), total, layout, pieces, num_layers, num_layers,
                counts_text(balanced));
  std::vector<StageLayers> split;
  int64_t first = 0;
  for (int64_t count : layers_per_stage) {
    split.push_back({first, first + count});
    first += count;
  }
  return split;
}

std::vector<StageLayers> split_layers(const config::LlamaConfig& model, int64_t block_size, int stages,
                                      const std::vector<int64_t>& layers_per_stage, int virtual_stages) {
  const double head_cost = 6.0 * static_cast<double>(model.vocab_size * model.hidden_size);
  const double layer_cost = (model.training_flops_per_token(block_size) - head_cost) /
                            static_cast<double>(std::max<int64_t>(1, model.num_hidden_layers));
  return split_layers(model.num_hidden_layers, stages, layer_cost, head_cost, layers_per_stage, virtual_stages);
}

std::string describe_stages(const std::vector<StageLayers>& stages, int ranks) {
  std::string out;
  for (size_t s = 0; s < stages.size(); ++s) {
    const StageLayers& layers = stages[s];
    std::string held = layers.size() == 1 ? fmt::format("layer {}", layers.first)
                                          : fmt::format("layers {}-{}", layers.first, layers.end - 1);
    if (s == 0) held = "embedding, " + held;
    if (s + 1 == stages.size()) held += ", final norm, head and loss";
    const std::string rank =
        ranks > 0 && static_cast<size_t>(ranks) < stages.size() ? fmt::format(" (rank {})", s % ranks) : "";
    out += fmt::format("{}stage {}{}: {}", s == 0 ? "" : "; ", s, rank, held);
  }
  return out;
}

int64_t pipeline_microbatches(int64_t configured, int64_t rows, int stages, int virtual_stages) {
  const int64_t group = virtual_stages > 1 ? stages : 1;  // the interleaved schedule's micro-batches go by `stages`
  const int64_t microbatches = configured == 0 ? rows : configured;
  if (rows % microbatches == 0 && microbatches % group == 0) return microbatches;
  std::string fitting;
  for (int64_t d = 1; d <= rows; ++d)
    if (rows % d == 0 && d % group == 0) fitting += fmt::format("{}{}", fitting.empty() ? "" : ", ", d);
  const std::string rule = group == 1 ? "divide the " + std::to_string(rows) + " rows"
                                      : fmt::format("divide the {} rows and be a multiple of pipeline={} (the "
                                                    "interleaved schedule of pipeline.virtual_stages={} sends them "
                                                    "around the ranks in groups of {})",
                                                    rows, stages, virtual_stages, stages);
  throw UserError(fmt::format("pipeline.microbatches={} does not {} of each forward/backward pass on a device "
                              "(global_batch_size over the mesh's batch axes, then over gradient_accumulation_steps): "
                              "use {}",
                              configured == 0 ? fmt::format("0 (one per row: {})", rows) : std::to_string(configured),
                              rule,
                              fitting.empty() ? "more rows per device (a larger global_batch_size)"
                                              : "one of " + fitting + (configured == 0 ? "" : " (0: one per row)")));
}

std::vector<StageAction> stage_actions(settings::PipelineSchedule schedule, int stages, int stage,
                                       int64_t microbatches, int virtual_stages) {
  MT_CHECK(stages >= 1 && stage >= 0 && stage < stages && microbatches >= 1 && virtual_stages >= 1,
           "stage {} of {}, {} micro-batches, {} virtual stages", stage, stages, microbatches, virtual_stages);
  using Kind = StageAction::Kind;
  const int64_t S = stages, V = virtual_stages, total = microbatches * V;
  // The k-th forward and backward of the rank (Megatron's interleaved order; with V = 1, micro-batch k).
  auto forward = [&](int64_t k) {
    return StageAction{Kind::forward, (k / (S * V)) * S + k % S, static_cast<int>((k / S) % V)};
  };
  auto backward = [&](int64_t k) {
    return StageAction{Kind::backward, (k / (S * V)) * S + k % S, static_cast<int>(V - 1 - (k / S) % V)};
  };
  std::vector<StageAction> actions;
  if (schedule == settings::PipelineSchedule::gpipe) {
    for (int64_t k = 0; k < total; ++k) actions.push_back(forward(k));
    for (int64_t k = 0; k < total; ++k) actions.push_back(backward(k));
    return actions;
  }
  const int64_t warmup = V == 1 ? std::min<int64_t>(S - 1 - stage, total)
                                : std::min<int64_t>(2 * (S - 1 - stage) + (V - 1) * S, total);
  for (int64_t k = 0; k < warmup; ++k) actions.push_back(forward(k));
  for (int64_t k = warmup; k < total; ++k) {
    actions.push_back(forward(k));
    actions.push_back(backward(k - warmup));
  }
  for (int64_t k = total - warmup; k < total; ++k) actions.push_back(backward(k));
  return actions;
}

int64_t microbatches_in_flight(settings::PipelineSchedule schedule, int stages, int stage, int64_t microbatches,
                               int virtual_stages) {
  int64_t in_flight = 0, most = 0;
  for (const StageAction& a : stage_actions(schedule, stages, stage, microbatches, virtual_stages)) {
    in_flight += a.kind == StageAction::Kind::forward ? 1 : -1;
    most = std::max(most, in_flight);
  }
  return most;
}

double ideal_bubble_fraction(int stages, int64_t microbatches, int virtual_stages) {
  return static_cast<double>(stages - 1) / static_cast<double>(virtual_stages * microbatches + stages - 1);
}

std::string schedule_timeline(settings::PipelineSchedule schedule, int stages, int64_t microbatches,
                              int virtual_stages) {
  using Kind = StageAction::Kind;
  const int V = virtual_stages, pieces = stages * V;
  std::vector<std::vector<StageAction>> actions;
  for (int s = 0; s < stages; ++s) actions.push_back(stage_actions(schedule, stages, s, microbatches, V));
  // finished[kind][c][m]: the slot after which stage c (rank c mod stages) finished that pass of micro-batch m (-1:
  // not yet).
  std::vector<std::vector<std::vector<int64_t>>> finished(
      2, std::vector<std::vector<int64_t>>(pieces, std::vector<int64_t>(microbatches, -1)));
  std::vector<size_t> next(stages, 0);
  std::vector<int64_t> busy_until(stages, 0);
  std::vector<std::vector<std::string>> cells(stages);
  const int width = static_cast<int>(fmt::format("{}", microbatches - 1).size()) + 1 +
                    (V > 1 ? 1 + static_cast<int>(fmt::format("{}", V - 1).size()) : 0);
  int64_t slot = 0;
  auto done = [&](Kind kind, int c, int64_t m) {
    const int64_t at = finished[kind == Kind::forward ? 0 : 1][c][m];
    return at >= 0 && at <= slot;
  };
  for (bool running = true; running; ++slot) {
    MT_CHECK(slot <= 8 * (V * microbatches + stages) + 8,
             "the {} schedule of {} stages x {} micro-batches does not end", schedule_name(schedule), pieces,
             microbatches);
    running = false;
    for (int s = 0; s < stages; ++s) {
      if (busy_until[s] > slot) {  // its cell was written when the pass started
        running = true;
        continue;
      }
      if (next[s] == actions[s].size()) {
        cells[s].push_back(std::string(width, ' '));
        continue;
      }
      running = true;
      const StageAction a = actions[s][next[s]];
      const int c = a.chunk * stages + s;
      const bool ready = a.kind == Kind::forward ? (c == 0 || done(Kind::forward, c - 1, a.microbatch))
                                                 : (c == pieces - 1 ? done(Kind::forward, c, a.microbatch)
                                                                    : done(Kind::backward, c + 1, a.microbatch));
      if (!ready) {
        cells[s].push_back(std::string(width, '.'));
        continue;
      }
      const int64_t length = a.kind == Kind::forward ? 1 : 2;
      const std::string name = V > 1 ? fmt::format("{}.{}", a.microbatch, a.chunk) : fmt::format("{}", a.microbatch);
      const std::string cell = fmt::format("{}{:<{}}", a.kind == Kind::forward ? 'F' : 'B', name, width - 1);
      for (int64_t k = 0; k < length; ++k) cells[s].push_back(cell);
      busy_until[s] = slot + length;
      finished[a.kind == Kind::forward ? 0 : 1][c][a.microbatch] = slot + length;
      ++next[s];
    }
  }
  // The pass ends when the last stage ends: trim the trailing empty cells, count the idle ones before each end.
  int64_t slots = 0;
  for (int s = 0; s < stages; ++s) slots = std::max(slots, busy_until[s]);
  std::string out;
  for (int s = 0; s < stages; ++s) {
    cells[s].resize(static_cast<size_t>(slots), std::string(width, '.'));
    for (std::string& c : cells[s])
      if (c.find_first_not_of(' ') == std::string::npos) c = std::string(width, '.');
    out += fmt::format("stage {} |", s);
    for (const std::string& c : cells[s]) out += " " + c;
    out += "\n";
  }
  const int64_t busy = 3 * microbatches * V;
  out += fmt::format("{} with {} stages x {}{} micro-batches: {} slots, each stage busy {} (a forward 1 slot, a "
                     "backward 2): bubble {:.1f}% of the pass (ideal (S-1)/({}M+S-1) = {:.1f}%)",
                     schedule_name(schedule), stages, V > 1 ? fmt::format("{} virtual stages x ", V) : "",
                     microbatches, slots, busy,
                     100.0 * (1.0 - static_cast<double>(busy) / static_cast<double>(slots)), V > 1 ? "V" : "",
                     100.0 * ideal_bubble_fraction(stages, microbatches, V));
  return out;
}

const char* schedule_name(settings::PipelineSchedule schedule) {
  return schedule == settings::PipelineSchedule::gpipe ? "gpipe" : "1f1b";
}

std::vector<std::string> describe_pipeline(const settings::Settings& settings, const mesh::Mesh& mesh,
                                           int64_t pass_rows) {
  const int stages = mesh.size(mesh::Axis::pipeline), V = settings.pipeline.virtual_stages;
  if (stages == 1) return {};
  const int64_t microbatches = pipeline_microbatches(settings.pipeline.microbatches, pass_rows, stages, V);
  const int64_t rows = pass_rows / microbatches, tokens = settings.block_size / mesh.size(mesh::Axis::context);
  std::vector<std::string> lines = {fmt::format(
      "Pipeline: {} stages{} ({}); schedule {}, each pass of {} rows per device in {} micro-batches of {} row{}: "
      "activations [{}, {}, {}] {} sent to the next stage and their gradient back, per micro-batch",
      stages * V, V > 1 ? fmt::format(" on {} ranks ({} virtual stages each)", stages, V) : "",
      describe_stages(
          split_layers(settings.model, settings.block_size, stages, settings.pipeline.layers_per_stage, V), stages),
      schedule_name(settings.pipeline.schedule), pass_rows, microbatches, rows, rows == 1 ? "" : "s", rows, tokens,
      settings.model.hidden_size, settings.compute_dtype == settings::ComputeDtype::bfloat16 ? "bf16" : "fp32")};
  std::istringstream timeline(schedule_timeline(settings.pipeline.schedule, stages, microbatches, V));
  for (std::string line; std::getline(timeline, line);) lines.push_back("Pipeline schedule: " + line);
  return lines;
}

}  // namespace meshtrain::parallel
