// parallel_model.hpp — ParallelModel: a single-device Llama (or Mixtral) made SPMD over the mesh from outside:
// tensor parallelism over `tensor`, FSDP over `fsdp`, data parallelism over `data` (hybrid with fsdp > 1), expert
// parallelism over `expert`, which outside the experts splits the batch rows like `data`, and context parallelism
// over `context`, which splits each row's tokens (parallel/context_parallel.hpp), and pipeline parallelism over
// `pipeline`, which splits the layers into stages (parallel/pipeline_schedule.hpp: each device holds its stage's
// units only and runs its micro-batches in the schedule's order, activations and their gradients sent point to point
// to the neighbouring stages). What each device holds and where each call communicates: docs/parallelism.md.
//
// Every device builds the same model, its parameters allocated but never written, and hands it here with the source
// of the values; each device reads only its own pieces, so no device ever holds the whole model. The calls are
// collective: every device makes them in the same order (per micro-batch forward_backward(), or loss_sum, its
// backward and finish_backward() without a pipeline; per step synchronize_gradients(), then gradient_norm()). With
// every axis of size 1 nothing communicates and the parameters are the optimizer's buffers (no copies).
#pragma once

#include "meshtrain/mesh/mesh_roles.hpp"
#include "meshtrain/model/llama.hpp"
#include "meshtrain/parallel/context_parallel.hpp"
#include "meshtrain/parallel/fsdp.hpp"
#include "meshtrain/parallel/pipeline_schedule.hpp"
#include "meshtrain/runtime/device_context.hpp"
#include "meshtrain/settings/settings.hpp"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace meshtrain::parallel {

struct ParallelOptions {
  bool reshard_after_forward = true;  // parallel.reshard_after_forward
  // Activation checkpointing (activation_checkpointing): every layer i with i % checkpoint_every == 0 keeps only its
  // input from forward and runs its forward again in backward; 0 = none, 1 = every layer ("full").
  int checkpoint_every = 0;
  // What FSDP all-gathers carry: kFloat, or kBFloat16 with bf16 compute (compute_dtype=bfloat16: half the bytes;
  // the shards, the optimizer and the gradient reduce-scatters stay fp32).
  at::ScalarType gather_dtype = at::kFloat;
  // A Mixtral's expert capacity (moe.capacity_factor): 0 dropless, c > 0 see MixtralSparseMoe::set_capacity_factor.
  double capacity_factor = 0;
  // pipeline.*, and the rows' length the stages are balanced for (block_size).
  settings::PipelineSettings pipeline;
  int64_t block_size = 0;

  // parallel.*, moe.capacity_factor, activation_checkpointing, pipeline.*, block_size; the gathers in the compute
  // dtype.
  static ParallelOptions from(const settings::Settings& settings);
};

class ParallelModel {
 public:
  // `values`: the parameters' values, asked for this device's pieces only. UserError if the layout does not divide
  // the model (expert > 1 needs a Mixtral whose experts split evenly).
  ParallelModel(std::shared_ptr<model::LlamaForCausalLM> model, runtime::DeviceContext& ctx, ParallelOptions options,
                const model::SliceSource& values);

  model::LlamaForCausalLM& model() { return *model_; }
  // The devices that hold other tokens of the batch (mesh::MeshRoles::token_axes: (data, fsdp), expert when the mesh
  // has expert > 1, context when it has context > 1): the sums of losses and routing statistics run over it.
  runtime::Comm& batch_comm() { return batch_comm_; }
  // (A Mixtral's routing of the last loss_sum, over the global batch: model().router_stats().)

  // The training loss of this device's int64 tokens: the sum of the token cross entropies of targets_BT (fp32
  // scalar), the head's loss fused and chunked (the logits never whole). Without grad mode it only evaluates.
  // `documents_BT` (int64, optional): keeps the documents packed in a row apart (model::RopeTables).
  at::Tensor loss_sum(const at::Tensor& tokens_BT, const at::Tensor& targets_BT, const at::Tensor& documents_BT = {});
  // After loss.backward(): waits for the last layer gradient reduce-scatter still in flight and reduce-scatters the
  // embedding's gradients (the others' were during the backward).
  void finish_backward();
  // One forward and backward pass over this device's rows, the loss's gradient scaled by `loss_scale`: loss_sum, its
  // backward and finish_backward(), or with a pipeline the rows in pipeline micro-batches through the stages in the
  // schedule's order. Returns the loss sum of the rows (0 on a stage other than the last: loss_comm() sums it).
  double forward_backward(const at::Tensor& tokens_BT, const at::Tensor& targets_BT, const at::Tensor& documents_BT,
                          double loss_scale);
  // The loss sum of the rows without gradients (evaluation), through the stages with a pipeline; 0 on a stage other
  // than the last.
  double evaluation_loss_sum(const at::Tensor& tokens_BT, const at::Tensor& targets_BT,
                             const at::Tensor& documents_BT);
  // The devices whose loss sums add up to the global batch's (mesh::MeshRoles::loss_axes: batch_comm() and, with a
  // pipeline, its stages).
  runtime::Comm& loss_comm() { return loss_comm_; }
  // Pipeline parallelism: this device's pipeline rank, every stage's layers (one stage of every layer without a
  // pipeline; with virtual stages, stage s on rank s mod pipeline),
  // and, stage by stage, the seconds the devices of this one's pipeline group waited for a neighbouring stage
  // (activations, gradients, sends to complete) since the last call: the bubble. Collective over pipeline; empty
  // without a pipeline.
  int stage() const { return stage_; }
  const std::vector<StageLayers>& stage_layers() const { return stage_layers_; }
  std::vector<double> take_stage_wait_seconds();
  // What an embedding lookup's backward leaves for finish_backward(): the token ids and their gradient rows.
  struct LookupGradient {
    at::Tensor tokens_N, grad_ND;
  };
  // After the last micro-batch of a step: all-reduces every gradient shard over `data`.
  void synchronize_gradients();
  // The L2 norm of the whole model's gradient (every shard on every device counted once). Same on every device.
  double gradient_norm();
  void zero_gradients();

  // What the optimizer updates: one flat fp32 shard per unit, and the matching gradient shards.
  std::vector<at::Tensor> parameter_shards();
  std::vector<at::Tensor> gradient_shards();

  // The most elements of a whole tensor assemble_whole_tensors() hands over at once (8 MB in fp32).
  static constexpr int64_t kAssemblePartElements = int64_t{2} << 20;
  // Assembles the whole Hugging Face tensor of every parameter from shard-shaped buffers (parameter_shards() itself,
  // or optimizer moments laid out like them), parameter by parameter in unit order (index i; every expert of an
  // expert unit, wherever it is held), each on one device, in consecutive parts of at most `part_elements`:
  // world rank owner(i) gets fn(i, name, part, first) for each part in order, `part` being the flat (row-major)
  // elements [first, first + part.numel()) of the whole tensor. The devices of data replica 0 send their pieces of
  // each part to the owner point to point, so each byte of the state crosses the network at most once and a device
  // holds at most one part (and its received pieces) at a time, whatever the size of the tensor. Collective over the
  // world: every device calls it alike.
  using WholeTensorPart = std::function<void(size_t index, const std::string& name, const at::Tensor& part,
                                             int64_t first)>;
  void assemble_whole_tensors(const std::vector<at::Tensor>& shard_buffers, const std::function<int(size_t)>& owner,
                              const WholeTensorPart& fn, int64_t part_elements = kAssemblePartElements);
  // The Hugging Face names and whole shapes of the parameters, in unit order (the order of assemble_whole_tensors).
  std::vector<std::pair<std::string, std::vector<int64_t>>> whole_parameter_shapes() const;
  // Fills shard-shaped buffers (optimizer moments) from `values`, asked for this device's pieces only. No
  // communication (a checkpoint of any mesh loads on any other).
  void load_shards(std::vector<at::Tensor>& shard_buffers, const model::SliceSource& values);

  // "parameters 1.2 MB + gradients 1.2 MB + AdamW 2.4 MB per device (fsdp=4, tensor=1); largest gathered unit 0.4 MB"
  std::string memory_summary() const;

  // Whether a training loss over `tokens` tokens per device takes the head's weight a piece of every shard at a time
  // instead of gathering it whole (HeadLoss in parallel_model.cpp): sharded, whole rows in every shard, and the
  // logits' gradient no larger than the weight's. Asked on the last stage.
  bool head_by_pieces(int64_t tokens);

 private:
  // The stages' parts of loss_sum: the embedding of tokens_BT (first stage; its gradient rows kept for
  // finish_backward()), and the final norm and head's loss sum of the layers' output x_BTD (last stage).
  at::Tensor embedded(const at::Tensor& tokens_BT);
  at::Tensor head_loss_sum(const at::Tensor& x_BTD, const at::Tensor& targets_BT);
  // Runs this stage's part of one pass over the rows with a pipeline (parallel/pipeline_run.cpp): with
  // `loss_scale` set, forward and backward in the schedule's order; without, forwards only. Returns the loss sum
  // (last stage) or 0.
  double run_pipeline(const at::Tensor& tokens_BT, const at::Tensor& targets_BT, const at::Tensor& documents_BT,
                      std::optional<double> loss_scale);
  // The pipeline rank that holds unit u, stage s of stage_layers_ (with virtual stages s mod pipeline), a layer.
  int stage_of_unit(size_t u) const;
  int rank_of_stage(size_t stage) const;
  int rank_of_layer(int64_t layer) const;
  bool holds(size_t u) const { return stage_of_unit(u) == stage_; }

  at::Tensor run_layer(int64_t index, model::LlamaDecoderLayer& layer, const at::Tensor& x_BTD,
                       const model::RopeTables& rope);
  FsdpUnit& head();         // the unit of the head's weight: lm_head, or the embedding table when tied
  bool resharding() const;  // units freed after their forward (reshard_after_forward, fsdp > 1)

  std::shared_ptr<model::LlamaForCausalLM> model_;
  runtime::DeviceContext& ctx_;
  ParallelOptions options_;
  mesh::MeshRoles roles_;  // of ctx_'s mesh
  runtime::Comm& fsdp_comm_;
  runtime::Comm& tensor_comm_;
  runtime::Comm& expert_comm_;
  // Over the axes that mesh::MeshRoles names: the replicas of a non-expert parameter's gradient, of an expert's, and
  // the batch's rows. The first two are one Comm when the experts are not split.
  runtime::Comm& dense_gradient_comm_;
  runtime::Comm& expert_gradient_comm_;
  runtime::Comm& batch_comm_;
  runtime::Comm& pipeline_comm_;
  runtime::Comm& loss_comm_;
  std::unique_ptr<ContextParallel> context_;  // context > 1: the model's ContextExchange
  int stage_ = 0;                             // this device's pipeline coordinate (its rank in pipeline_comm_)
  std::vector<StageLayers> stage_layers_;     // of every stage (pipeline x virtual_stages of them)
  double pipeline_wait_seconds_ = 0;          // since take_stage_wait_seconds()
  // Inside a pipeline pass with fsdp > 1: the stage's units stay gathered from their first forward to the pass's end
  // and their gradients accumulate in the parameters' .grad over the micro-batches, reduce-scattered once when it
  // ends (instead of gathering and reducing each unit once per micro-batch).
  bool per_pass_ = false;
  // Every parameter of the whole model in unit order, the same on every device: where its pieces are (the unit and
  // member; an expert's member is the one at the same place among the local experts of its holder, who has
  // expert coordinate `expert_holder`, 0 for the other parameters).
  struct WholeParameter {
    std::string name;
    std::vector<int64_t> shape;
    size_t unit = 0, member = 0;
    int expert_holder = 0;
  };
  // Unit u's place in parameter_shards() (the units this stage holds, in unit order); -1 where another stage holds it.
  std::vector<int> shard_index_;
  std::vector<WholeParameter> whole_parameters_;
  // Unit u of the checkpoint and shard-buffer order: 0 the embedding, 1..L the layers, L + 1 the final norm, L + 2
  // lm_head (when not tied), then each layer's experts (a Mixtral).
  const FsdpUnit& unit(size_t u) const;
  FsdpUnit& unit(size_t u);
  size_t num_dense_units() const { return layers_.size() + (lm_head_ ? 3 : 2); }
  size_t num_units() const { return num_dense_units() + expert_units_.size(); }

  std::unique_ptr<FsdpUnit> embedding_;             // model.embed_tokens (the head's weight too when tied)
  // Every unit exists on every device (the layout of its shards: assemble_whole_tensors), but a device holds the
  // shards of its pipeline stage's units only.
  std::vector<std::unique_ptr<FsdpUnit>> layers_;  // one per decoder layer
  std::unique_ptr<FsdpUnit> final_norm_;            // model.norm
  std::unique_ptr<FsdpUnit> lm_head_;               // lm_head; null when tied
  std::vector<std::unique_ptr<FsdpUnit>> expert_units_;  // a Mixtral's: this device's experts of each layer
  FsdpUnit* reducing_ = nullptr;  // the unit whose gradient reduce-scatter is in flight (backward)
  bool head_by_pieces_ = false;   // head_by_pieces() for this forward's tokens (set by loss_sum())
  // Whether the embedding lookup and its gradient go by rows instead of gathering the table: sharded over fsdp,
  // whole rows in every shard.
  bool lookup_by_rows() const;
  // Rows [B, T, D] (fp32) of the table for this device's tokens, without gathering it: the fsdp group's tokens are
  // all-gathered, each device looks up those in its shard's rows (zeros elsewhere) and a reduce-scatter brings each
  // device its tokens' rows (exact: one term of each sum is not zero). Checks the token ids against the vocabulary.
  at::Tensor rows_by_shard(const at::Tensor& tokens_BT);
  std::vector<LookupGradient> lookup_gradients_;  // the embedding lookups' gradient rows since finish_backward()
  // The table's gradient from lookup_gradients_ into its gradient shard: with lookup_by_rows() the group's token ids
  // and gradient rows are all-gathered and each device sums those of its own rows; otherwise reduce-scattered a
  // piece at a time (with fsdp=1 added in place). The V x D gradient of a lookup never exists.
  void reduce_embedding_gradient();
};

}  // namespace meshtrain::parallel
