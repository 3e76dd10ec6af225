// memory_plan.cpp — the per-device and per-host memory estimate of a training job and the start-up refusal
// (memory_plan.hpp lists what is counted and why).
#include "meshtrain/train/memory_plan.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/model/compute_matmul.hpp"
#include "meshtrain/model/flash_attention.hpp"
#include "meshtrain/model/fused_cross_entropy.hpp"
#include "meshtrain/parallel/fsdp.hpp"
#include "meshtrain/parallel/pipeline_schedule.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <vector>

namespace meshtrain::train {
namespace {

int64_t bytes_of(settings::ComputeDtype dtype) { return dtype == settings::ComputeDtype::float32 ? 4 : 2; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

MemoryLayout memory_layout(const settings::Settings& settings, const mesh::Mesh& mesh,
                           const sharding::PartitionSpec& input_spec) {
  const int64_t batch_row_shards = mesh.size_along(input_spec.dims.at(0));
  MemoryLayout layout;
  layout.fsdp = mesh.size(mesh::Axis::fsdp);
  layout.tensor = mesh.size(mesh::Axis::tensor);
  layout.expert = mesh.size(mesh::Axis::expert);
  layout.context = mesh.size(mesh::Axis::context);
  layout.devices_per_host = mesh.devices_per_host();
  for (int member : mesh.group_of(0, {mesh::Axis::fsdp}))
    if (member != 0 && mesh.device(member).host == mesh.device(0).host) ++layout.fsdp_on_host;
  layout.rows_per_device = std::max<int64_t>(1, settings.global_batch_size / std::max<int64_t>(1, batch_row_shards));
  if (const int stages = mesh.size(mesh::Axis::pipeline); stages > 1) {
    const int V = settings.pipeline.virtual_stages;
    layout.stage_layers.assign(stages, 0);  // each rank's layers, over its virtual stages
    const std::vector<parallel::StageLayers> split = parallel::split_layers(
        settings.model, settings.block_size, stages, settings.pipeline.layers_per_stage, V);
    for (size_t s = 0; s < split.size(); ++s) layout.stage_layers[s % stages] += split[s].size();
    layout.virtual_stages = V;
    const int64_t pass_rows = std::max<int64_t>(1, layout.rows_per_device / settings.gradient_accumulation_steps);
    layout.pipeline_microbatches =
        settings.pipeline.microbatches == 0 ? pass_rows : std::min(settings.pipeline.microbatches, pass_rows);
  }
  return layout;
}

namespace {

// What one pipeline stage holds (the whole model without a pipeline).
struct StagePart {
  int64_t layers = 0;
  bool embedding = true, head = true;  // the first stage's, the last stage's
  int64_t microbatches = 1;            // of a pass
  int64_t in_flight = 1;               // of them, whose activations are kept at once (of the whole stage's layers)
  bool pipelined = false;              // a pipeline stage: its units gathered once per pass (pipeline_run.cpp)
};

DeviceMemory plan_stage(const settings::Settings& settings, const MemoryLayout& layout, const StagePart& part) {
  const config::LlamaConfig& m = settings.model;
  const int64_t D = m.hidden_size, V = m.vocab_size, L = part.layers, tp = layout.tensor;
  const int64_t q_out = m.num_attention_heads * m.head_dim, kv_out = m.num_key_value_heads * m.head_dim;
  const int64_t F = m.intermediate_size, H = m.num_attention_heads, K = m.num_key_value_heads, T = settings.block_size;
  // Elements of each FSDP unit on one tensor rank: the embedding, a layer, the final norm, lm_head (untied); the
  // head's weight is V x D either way.
  const int64_t head_weight = V * D, lm_head = m.tie_word_embeddings ? 0 : V * D;
  // A Mixtral layer holds the router and this device's experts (E / expert of them) instead of the MLP.
  const int64_t local_experts = m.is_moe() ? m.num_local_experts / std::max(1, layout.expert) : 1;
  const int64_t router = m.is_moe() ? m.num_local_experts * D : 0;
  const int64_t layer = (2 * D * q_out + 2 * D * kv_out + local_experts * 3 * D * F) / tp + 2 * D + router;
  const int64_t embedding_shard = part.embedding ? ceil_div(V * D, layout.fsdp) : 0;
  const int64_t layer_shard = ceil_div(layer, layout.fsdp);
  const int64_t norm_shard = part.head ? ceil_div(D, layout.fsdp) : 0;
  const int64_t lm_head_shard = part.head ? ceil_div(lm_head, layout.fsdp) : 0;
  const int64_t c = bytes_of(settings.compute_dtype), g = c;  // FSDP gathers carry the compute dtype

  DeviceMemory d;
  d.parameters = 4 * (embedding_shard + L * layer_shard + norm_shard + lm_head_shard);
  d.gradients = d.parameters;
  // The moments (the update's scratch is a chunk: AdamW::kChunkElements).
  d.optimizer = 2 * d.parameters;
  // This device's tokens of one micro-batch (of a pipeline's micro-batches with one): its rows' chunks with context
  // parallelism (T / context of each row).
  const int64_t micro_rows = std::max<int64_t>(
      1, layout.rows_per_device / std::max<int64_t>(1, settings.gradient_accumulation_steps) / part.microbatches);
  const int64_t tokens = micro_rows * T / std::max(1, layout.context);
  if (layout.fsdp > 1) {
    // The larger of: the head's weight gathered in fp32 with its gradient from the loss, at the end of the forward
    // (a bf16 gather also lands in a bf16 buffer first); one layer running, the next one prefetched and one layer's
    // gradient, in backward, with the layer before's reduce-scatter in flight meanwhile (all its pieces at once):
    // over Gloo fp32 send and receive buffers of the whole layer; within a host one sum of the layer that its
    // members share; over hosts with several members on each (runtime/comm.hpp HostSplit) send and receive buffers
    // of the member's share of its host's part. The head's reduce-scatter in forward goes a piece at a time
    // (two pieces of FsdpUnit::kReducePieceElements at most); when the logits' gradient is the smaller, it is kept
    // instead of the weight's gradient, which is made from it a piece at a time (model/fused_cross_entropy.hpp),
    // and when the shards also hold whole rows the weight itself comes a piece at a time (two in flight).
    // Kept from forward to backward (no resharding): every layer, and an untied embedding.
    const int64_t staging = g == 4 ? 0 : g;
    const int64_t piece = std::min(parallel::FsdpUnit::kReducePieceElements, head_weight);
    const bool by_logit_gradients =
        model::logit_gradients_fit_in_weight_gradient(tokens, D, model::torch_dtype(settings.compute_dtype));
    const int64_t head_weight_gathered =
        by_logit_gradients && V % layout.fsdp == 0 ? 2 * (4 + staging) * piece : (4 + staging) * head_weight;
    const int64_t head_gradient = by_logit_gradients ? tokens * V * c : 4 * head_weight;
    const int64_t head_phase = head_weight_gathered + head_gradient + 2 * 4 * piece;
    const int on_host = layout.fsdp_on_host;
    const int64_t reduce_in_flight = on_host == 1              ? 2 * 4 * layer
                                     : on_host == layout.fsdp ? 4 * layer / on_host
                                                              : 2 * 4 * layer / on_host;
    const int64_t layer_phase = (4 + 4 + 4 + 2 * staging) * layer + reduce_in_flight;
    d.gathered = std::max(part.head ? head_phase : 0, layer_phase);
    if (part.pipelined)  // the stage's layers and their gradients whole through the pass, reduced when it ends
      d.gathered = (part.head ? head_phase : 0) + (4 + 4 + staging) * L * layer + reduce_in_flight;
    else if (!settings.parallel.reshard_after_forward)
      d.gathered += 4 * L * layer + (m.tie_word_embeddings || !part.embedding ? 0 : 4 * V * D);
  } else {
    // The parameters are the shards; autograd's gradient of one layer before it is added to the shard, and with
    // bf16 compute the bf16 copies of every layer weight that backward keeps.
    d.gathered = 4 * layer + (c == 2 ? 2 * L * layer : 0);
  }
  // Kept for backward per token of one layer, from the ops of model/llama.cpp: the two RMSNorms' inputs and outputs
  // (their normalized values are computed again in backward), q/k before and after RoPE, v, the attention output
  // before o_proj, the residual sums, the MLP's gate, up and product (silu(gate) is computed again in backward);
  // attention's fp32 log-sum-exp per query head (model/flash_attention.hpp: its tiles of scores are the threads'
  // scratch, never kept).
  // A Mixtral's token goes through k experts, which keep their gate and up projections per slot (model/moe.hpp's
  // ExpertActivations: silu and the product are recomputed in backward), the slot's input and output rows (gathered,
  // exchanged, weighted) and the fp32 router logits and probabilities.
  const int64_t mlp_kept = m.is_moe() ? 2 * m.num_experts_per_tok * F : 3 * F;
  const int64_t moe_rows = m.is_moe() ? c * 4 * m.num_experts_per_tok * D + 4 * 2 * m.num_local_experts : 0;
  const int64_t per_token_layer =
      c * (6 * D + (5 * q_out + 7 * kv_out + mlp_kept) / tp) + moe_rows +
      model::kFlashSavedBytesPerQueryHead * (H / tp);
  // With context parallelism a layer also keeps the whole rows' keys and values it gathered (context_parallel.hpp).
  const int64_t gathered_keys_values = layout.context > 1 ? micro_rows * T * 2 * (kv_out / tp) * c : 0;
  const int64_t layer_activations = tokens * per_token_layer + gathered_keys_values;
  const int every = settings.parallel.checkpoint_every;
  if (every == 0) {
    d.activations = L * layer_activations;
  } else {
    const int64_t checkpointed = ceil_div(L, every);
    d.activations = checkpointed * tokens * D * c + (L - checkpointed) * layer_activations + layer_activations;
  }
  d.activations += 4 * tokens * D * c;  // the embedding output (or the received activations) and the final norm
  // A pipeline stage keeps that for each micro-batch in flight (one backward at a time needs the working copies below).
  d.activations *= part.in_flight;
  // One layer's attention backward at a time: its fp32 working copies; with context parallelism the keys of the other
  // devices' tokens too (k, v plain and by tiles, their gradients: 6 fp32 copies) and the whole rows' K/V gradients
  // reduce-scattered in fp32 (the stacked gradients and their rank-order copy).
  d.activations += tokens * model::flash_attention_backward_bytes_per_position(H / tp, K / tp, m.head_dim);
  if (layout.context > 1) {
    const int64_t key_bytes = (K / tp) * m.head_dim * 4, other_keys = micro_rows * T - tokens;
    d.activations += other_keys * key_bytes * 6 + micro_rows * T * key_bytes * 2 * 2;
  }
  // The fused head loss (model/fused_cross_entropy.hpp): kept from forward to backward, the hidden states' gradient
  // and this device's shard of the head weight's fp32 gradient (reduce-scattered in forward; all of it at fsdp=1);
  // one chunk of logits with its gradient at a time.
  const int64_t chunk = std::min(tokens, model::cross_entropy_chunk_rows(V));
  if (part.head)
    d.logits = 4 * ceil_div(head_weight, layout.fsdp) + part.in_flight * tokens * D * c + chunk * V * (2 * 4 + c);
  return d;
}

}  // namespace

MemoryPlan plan_memory(const settings::Settings& settings, const MemoryLayout& layout) {
  MemoryPlan plan;
  plan.layout = layout;
  if (layout.stage_layers.empty()) {
    plan.device = plan_stage(settings, layout, {settings.model.num_hidden_layers});
    return plan;
  }
  // The stage that needs the most.
  const int stages = static_cast<int>(layout.stage_layers.size());
  for (int s = 0; s < stages; ++s) {
    StagePart part{layout.stage_layers[s], s == 0, s == stages - 1, layout.pipeline_microbatches};
    part.pipelined = true;
    // With virtual stages a pass in flight holds one of the rank's V chunks: V of them, a whole rank's layers.
    const int64_t passes = parallel::microbatches_in_flight(settings.pipeline.schedule, stages, s,
                                                            layout.pipeline_microbatches, layout.virtual_stages);
    part.in_flight = (passes + layout.virtual_stages - 1) / layout.virtual_stages;
    const DeviceMemory d = plan_stage(settings, layout, part);
    if (s == 0 || d.total() > plan.device.total()) {
      plan.device = d;
      plan.stage = s;
      plan.in_flight = part.in_flight;
    }
  }
  return plan;
}

std::string MemoryPlan::describe() const {
  const DeviceMemory& d = device;
  return fmt::format(
      "parameters {} + gradients {} + AdamW {} + {} {} + activations {} + logits {} = {} per device "
      "({} rows x {} devices per host{}); {} devices + the process {} = {} per host",
      gigabytes(d.parameters), gigabytes(d.gradients), gigabytes(d.optimizer),
      layout.fsdp > 1 ? "FSDP gathers" : "autograd gradients and weight copies", gigabytes(d.gathered),
      gigabytes(d.activations), gigabytes(d.logits), gigabytes(d.total()), layout.rows_per_device,
      layout.devices_per_host,
      (layout.expert > 1 ? fmt::format(", each layer's experts split over expert={}", layout.expert) : "") +
          (layout.context > 1 ? fmt::format(", each row's tokens split over context={}", layout.context) : "") +
          (layout.stage_layers.empty()
               ? ""
               : fmt::format(", pipeline stage {} of {} (the largest): {} layers, {} of {} micro-batches in flight",
                             stage, layout.stage_layers.size(), layout.stage_layers[stage], in_flight,
                             layout.pipeline_microbatches)),
      layout.devices_per_host, gigabytes(kProcessBytes), gigabytes(host_total()));
}

void check_memory_fits(const settings::Settings& settings, const MemoryPlan& plan, const MemoryAvailable& available) {
  if (plan.host_total() <= available.bytes) return;
  struct Option {
    std::string change;
    MemoryPlan plan;
  };
  std::vector<Option> options;
  settings::Settings full = settings;
  full.parallel.checkpoint_every = 1;
  if (settings.parallel.checkpoint_every != 1)
    options.push_back({"activation_checkpointing=full", plan_memory(full, plan.layout)});
  // Fewer rows per micro-batch (the same global batch): the smallest gradient accumulation that fits.
  for (int64_t k = settings.gradient_accumulation_steps * 2; k <= plan.layout.rows_per_device; k *= 2) {
    if (plan.layout.rows_per_device % k != 0) continue;
    settings::Settings accumulated = settings;
    accumulated.gradient_accumulation_steps = k;
    options.push_back({fmt::format("gradient_accumulation_steps={}", k), plan_memory(accumulated, plan.layout)});
    if (options.back().plan.host_total() <= available.bytes) break;
  }
  // A wider layout over more hosts, alone and with activation checkpointing.
  auto offer = [&](const std::string& change, const MemoryLayout& wider) {
    options.push_back({change, plan_memory(settings, wider)});
    if (settings.parallel.checkpoint_every != 1)
      options.push_back({change + " with activation_checkpointing=full", plan_memory(full, wider)});
  };
  // More FSDP over more hosts (same devices per host): less state per device and, with the batch rows split over
  // fsdp, fewer rows.
  for (int times = 2; times <= 64; times *= 2) {
    MemoryLayout wider = plan.layout;
    wider.fsdp *= times;
    if (wider.rows_per_device % times == 0) wider.rows_per_device /= times;
    offer(fmt::format("fsdp={} over {}x the hosts (dcn_mesh.fsdp={})", wider.fsdp, times, times), wider);
  }
  // Each row's tokens split over more hosts (context parallelism): fewer tokens per device, the same state.
  for (int times = 2; times <= 16; times *= 2) {
    MemoryLayout wider = plan.layout;
    wider.context *= times;
    if (settings.block_size % (2 * wider.context) != 0) break;
    offer(fmt::format("context={} over {}x the hosts (dcn_mesh.context={})", wider.context, times, times), wider);
  }
  std::vector<std::string> fitting;
  const Option* smallest = &options.front();
  for (const Option& o : options) {
    if (o.plan.host_total() < smallest->plan.host_total()) smallest = &o;
    if (o.plan.host_total() <= available.bytes && fitting.size() < 3)
      fitting.push_back(fmt::format("{} ({} per host)", o.change, gigabytes(o.plan.host_total())));
  }
  const std::string advice =
      fitting.empty() ? fmt::format("none of activation checkpointing, gradient accumulation, up to 64x the fsdp "
                                    "or 16x the context fits; the smallest is {} at {} per host ({} of it activations and logits per "
                                    "device: a shorter block_size shrinks those)",
                                    smallest->change, gigabytes(smallest->plan.host_total()),
                                    gigabytes(smallest->plan.device.activations + smallest->plan.device.logits))
                      : fmt::format("what would fit: {}", fmt::join(fitting, "; "));
  throw UserError(fmt::format(
      "the job needs about {} of memory per host and this host has {} available ({}): {}. Refused before "
      "allocating anything; {}. (`meshtrain plan --memory` prints the estimate for any layout; memory.check=false "
      "skips this check.)",
      gigabytes(plan.host_total()), gigabytes(available.bytes), available.source, plan.describe(), advice));
}

}  // namespace meshtrain::train
