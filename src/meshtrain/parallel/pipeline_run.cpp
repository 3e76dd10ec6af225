// pipeline_run.cpp — ParallelModel::run_pipeline: one stage's part of a pass over a device's rows with pipeline
// parallelism. The rows are cut into micro-batches; the stage runs their forwards and backwards in its schedule's
// order (pipeline_schedule.hpp); a forward takes the micro-batch's activations from the stage before (the first
// stage embeds its tokens) and sends its output to the stage after (the last stage computes the loss); a backward
// takes the gradient of that output from the stage after and sends its input's gradient to the stage before. The
// transfers are point to point over `pipeline` (counted as stage_transfer), the receive of the next action posted
// before this one computes and the sends left to complete while the stage goes on.
#include "meshtrain/parallel/parallel_model.hpp"

#include "meshtrain/common/error.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>
#include <deque>

namespace meshtrain::parallel {

double ParallelModel::run_pipeline(const at::Tensor& tokens_BT, const at::Tensor& targets_BT,
                                   const at::Tensor& documents_BT, std::optional<double> loss_scale) {
  using Kind = StageAction::Kind;
  using Clock = std::chrono::steady_clock;
  const int ranks = pipeline_comm_.size(), chunks = options_.pipeline.virtual_stages;
  const int last = static_cast<int>(stage_layers_.size()) - 1;  // the last stage (of every rank's chunks)
  const bool training = loss_scale.has_value();
  const int64_t microbatches =
      pipeline_microbatches(options_.pipeline.microbatches, tokens_BT.size(0), ranks, chunks);
  const std::vector<at::Tensor> tokens = tokens_BT.chunk(microbatches, 0), targets = targets_BT.chunk(microbatches, 0);
  const std::vector<at::Tensor> documents =
      documents_BT.defined() ? documents_BT.chunk(microbatches, 0) : std::vector<at::Tensor>(microbatches);
  // What travels between stages: a micro-batch's hidden states [B, T, D] (or their gradient) in the compute dtype.
  const std::vector<int64_t> shape_BTD = {tokens_BT.size(0) / microbatches, tokens_BT.size(1),
                                          model_->config().hidden_size};
  std::vector<StageAction> actions;
  if (training) {
    actions = stage_actions(options_.pipeline.schedule, ranks, stage_, microbatches, chunks);
  } else {  // every forward, in the order the schedule would run them
    for (const StageAction& a : stage_actions(settings::PipelineSchedule::gpipe, ranks, stage_, microbatches, chunks))
      if (a.kind == Kind::forward) actions.push_back(a);
  }
  // The stage of the whole pipeline an action runs (chunk v of this rank: v x ranks + rank).
  auto stage_of = [&](const StageAction& a) { return a.chunk * ranks + stage_; };
  // One tag per micro-batch, stage boundary and direction: the stage that receives, and whether it is a gradient.
  auto tag_of = [&](Kind kind, int64_t m, int receiving_stage) {
    return static_cast<int>((m * (last + 1) + receiving_stage) * 2 + (kind == Kind::backward ? 1 : 0));
  };
  auto waited = [this](runtime::PendingCollective& pending) {
    const Clock::time_point start = Clock::now();
    pending.wait();
    pipeline_wait_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
  };
  // A forward takes activations from the stage before (but on the first stage), a backward their gradient from the
  // stage after (but on the last); with virtual stages the stage before rank 0's chunk v is the last rank's chunk
  // v - 1.
  struct Receive {
    StageAction action;
    at::Tensor buffer_BTD;
    runtime::PendingCollective pending;
  };
  auto needs_receive = [&](const StageAction& a) {
    return a.kind == Kind::forward ? stage_of(a) != 0 : stage_of(a) != last;
  };
  auto start_receive = [&](const StageAction& a) {
    const bool forward = a.kind == Kind::forward;
    const int from_stage = stage_of(a) + (forward ? -1 : 1), peer = rank_of_stage(static_cast<size_t>(from_stage));
    at::Tensor buffer_BTD = at::empty(shape_BTD, model_->compute_dtype());
    runtime::PendingCollective pending = pipeline_comm_.exchange_async(
        {}, {{peer, buffer_BTD}}, tag_of(a.kind, a.microbatch, stage_of(a)), runtime::Collective::stage_transfer,
        fmt::format("{} of micro-batch {} from stage {}", forward ? "activations" : "activation gradients",
                    a.microbatch, from_stage));
    return Receive{a, buffer_BTD, std::move(pending)};
  };
  std::deque<runtime::PendingCollective> sends;  // in flight, oldest first
  auto send = [&](const StageAction& a, const at::Tensor& x_BTD) {
    const bool forward = a.kind == Kind::forward;
    const int to_stage = stage_of(a) + (forward ? 1 : -1), peer = rank_of_stage(static_cast<size_t>(to_stage));
    sends.push_back(pipeline_comm_.exchange_async(
        {{peer, x_BTD.contiguous()}}, {}, tag_of(a.kind, a.microbatch, to_stage), runtime::Collective::stage_transfer,
        fmt::format("{} of micro-batch {} to stage {}", forward ? "activations" : "activation gradients",
                    a.microbatch, to_stage)));
  };

  // FSDP inside the stage: each unit gathered once and its gradient reduced once per pass (parallel_model.hpp).
  per_pass_ = fsdp_comm_.size() > 1;
  // Per micro-batch and chunk (m x chunks + v): the received activations, kept for the backward, and what the
  // backward starts from (the output, or the scaled loss).
  std::vector<at::Tensor> inputs_BTD(microbatches * chunks), outputs(microbatches * chunks);
  std::optional<Receive> next_receive;  // posted one action ahead
  double loss_sum = 0;
  for (size_t k = 0; k < actions.size(); ++k) {
    const StageAction a = actions[k];
    const int64_t m = a.microbatch, item = m * chunks + a.chunk;
    const int stage = stage_of(a);
    std::optional<Receive> received;
    if (needs_receive(a)) {
      received.emplace(next_receive ? std::move(*next_receive) : start_receive(a));
      MT_CHECK(received->action == a, "the receive posted ahead was for another action");
    }
    next_receive.reset();
    if (k + 1 < actions.size() && needs_receive(actions[k + 1])) next_receive.emplace(start_receive(actions[k + 1]));
    while (!sends.empty() && sends.front().done()) {  // release what the peers have taken
      sends.front().wait();
      sends.pop_front();
    }

    if (a.kind == Kind::forward) {
      at::Tensor x_BTD;
      if (stage == 0) {
        x_BTD = embedded(tokens[m]);
      } else {
        waited(received->pending);
        x_BTD = received->buffer_BTD;
        if (training) x_BTD.requires_grad_(true);
        inputs_BTD[item] = x_BTD;
      }
      head_by_pieces_ = stage == last && head_by_pieces(tokens[m].numel());
      const StageLayers& layers = stage_layers_[stage];
      const at::Tensor y_BTD = model_->run_layers(x_BTD, documents[m], layers.first, layers.end);
      if (stage == last) {
        const at::Tensor loss = head_loss_sum(y_BTD, targets[m]);
        loss_sum += loss.item<double>();
        if (training) outputs[item] = loss * *loss_scale;
      } else {
        send(a, y_BTD.detach());
        if (training) outputs[item] = y_BTD;
      }
    } else {
      if (stage == last) {
        outputs[item].backward();
      } else {
        waited(received->pending);
        torch::autograd::backward({outputs[item]}, {received->buffer_BTD});
      }
      finish_backward();
      if (stage != 0) send(a, inputs_BTD[item].grad());
      outputs[item] = inputs_BTD[item] = at::Tensor();
    }
  }
  for (runtime::PendingCollective& pending : sends) waited(pending);
  if (per_pass_) {
    // This rank's layers (last first) and the final norm: their gradients summed over the pass, reduce-scattered now,
    // one in flight while the next is started (the embedding's and the head's were reduced with each micro-batch).
    std::vector<FsdpUnit*> reduced;
    if (rank_of_stage(static_cast<size_t>(last)) == stage_) reduced.push_back(final_norm_.get());
    for (int64_t i = static_cast<int64_t>(layers_.size()) - 1; i >= 0; --i) {
      if (rank_of_layer(i) != stage_) continue;
      if (!expert_units_.empty()) reduced.push_back(expert_units_[i].get());
      reduced.push_back(layers_[i].get());
    }
    FsdpUnit* in_flight = nullptr;
    for (FsdpUnit* unit : reduced) {
      if (training) unit->start_reducing_gradients();
      if (in_flight) in_flight->finish_reducing_gradients();
      in_flight = training ? unit : nullptr;
    }
    if (in_flight) in_flight->finish_reducing_gradients();
    for (size_t u = 0; u < num_units(); ++u)
      if (holds(u)) unit(u).free_full();
    per_pass_ = false;
  }
  return loss_sum;
}

}  // namespace meshtrain::parallel
