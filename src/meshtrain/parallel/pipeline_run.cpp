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
  const int stages = pipeline_comm_.size();
  const bool first_stage = stage_ == 0, last_stage = stage_ == stages - 1, training = loss_scale.has_value();
  const StageLayers& layers = stage_layers_[stage_];
  const int64_t microbatches = pipeline_microbatches(options_.pipeline.microbatches, tokens_BT.size(0));
  const std::vector<at::Tensor> tokens = tokens_BT.chunk(microbatches, 0), targets = targets_BT.chunk(microbatches, 0);
  const std::vector<at::Tensor> documents =
      documents_BT.defined() ? documents_BT.chunk(microbatches, 0) : std::vector<at::Tensor>(microbatches);
  // What travels between stages: a micro-batch's hidden states [B, T, D] (or their gradient) in the compute dtype.
  const std::vector<int64_t> shape_BTD = {tokens_BT.size(0) / microbatches, tokens_BT.size(1),
                                          model_->config().hidden_size};
  std::vector<StageAction> actions;
  if (training) {
    actions = stage_actions(options_.pipeline.schedule, stages, stage_, microbatches);
  } else {
    for (int64_t m = 0; m < microbatches; ++m) actions.push_back({Kind::forward, m});
  }

  auto tag_of = [](Kind kind, int64_t m) { return static_cast<int>(2 * m + (kind == Kind::backward ? 1 : 0)); };
  auto waited = [this](runtime::PendingCollective& pending) {
    const Clock::time_point start = Clock::now();
    pending.wait();
    pipeline_wait_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
  };
  // A forward takes activations from the stage before (but on the first stage), a backward their gradient from the
  // stage after (but on the last).
  struct Receive {
    StageAction action;
    at::Tensor buffer_BTD;
    runtime::PendingCollective pending;
  };
  auto needs_receive = [&](const StageAction& a) { return a.kind == Kind::forward ? !first_stage : !last_stage; };
  auto start_receive = [&](const StageAction& a) {
    const bool forward = a.kind == Kind::forward;
    const int peer = forward ? stage_ - 1 : stage_ + 1;
    at::Tensor buffer_BTD = at::empty(shape_BTD, model_->compute_dtype());
    runtime::PendingCollective pending = pipeline_comm_.exchange_async(
        {}, {{peer, buffer_BTD}}, tag_of(a.kind, a.microbatch), runtime::Collective::stage_transfer,
        fmt::format("{} of micro-batch {} from stage {}", forward ? "activations" : "activation gradients",
                    a.microbatch, peer));
    return Receive{a, buffer_BTD, std::move(pending)};
  };
  std::deque<runtime::PendingCollective> sends;  // in flight, oldest first
  auto send = [&](Kind kind, int64_t m, const at::Tensor& x_BTD) {
    const bool forward = kind == Kind::forward;
    const int peer = forward ? stage_ + 1 : stage_ - 1;
    sends.push_back(pipeline_comm_.exchange_async(
        {{peer, x_BTD.contiguous()}}, {}, tag_of(kind, m), runtime::Collective::stage_transfer,
        fmt::format("{} of micro-batch {} to stage {}", forward ? "activations" : "activation gradients", m, peer)));
  };

  // FSDP inside the stage: each unit gathered once and its gradient reduced once per pass (parallel_model.hpp).
  per_pass_ = fsdp_comm_.size() > 1;
  std::vector<at::Tensor> inputs_BTD(microbatches);  // a received micro-batch's activations, kept for its backward
  std::vector<at::Tensor> outputs(microbatches);     // what its backward starts from: the output, or the scaled loss
  std::optional<Receive> next_receive;               // posted one action ahead
  double loss_sum = 0;
  for (size_t k = 0; k < actions.size(); ++k) {
    const StageAction a = actions[k];
    const int64_t m = a.microbatch;
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
      if (first_stage) {
        x_BTD = embedded(tokens[m]);
      } else {
        waited(received->pending);
        x_BTD = received->buffer_BTD;
        if (training) x_BTD.requires_grad_(true);
        inputs_BTD[m] = x_BTD;
      }
      head_by_pieces_ = last_stage && head_by_pieces(tokens[m].numel());
      const at::Tensor y_BTD = model_->run_layers(x_BTD, documents[m], layers.first, layers.end);
      if (last_stage) {
        const at::Tensor loss = head_loss_sum(y_BTD, targets[m]);
        loss_sum += loss.item<double>();
        if (training) outputs[m] = loss * *loss_scale;
      } else {
        send(Kind::forward, m, y_BTD.detach());
        if (training) outputs[m] = y_BTD;
      }
    } else {
      if (last_stage) {
        outputs[m].backward();
      } else {
        waited(received->pending);
        torch::autograd::backward({outputs[m]}, {received->buffer_BTD});
      }
      finish_backward();
      if (!first_stage) send(Kind::backward, m, inputs_BTD[m].grad());
      outputs[m] = inputs_BTD[m] = at::Tensor();
    }
  }
  for (runtime::PendingCollective& pending : sends) waited(pending);
  if (per_pass_) {
    // The stage's layers (last first) and final norm: their gradients summed over the pass, reduce-scattered now, one
    // in flight while the next is started (the embedding's and the head's were reduced with each micro-batch).
    std::vector<FsdpUnit*> reduced;
    if (last_stage) reduced.push_back(final_norm_.get());
    for (int64_t i = layers.end - 1; i >= layers.first; --i) {
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
