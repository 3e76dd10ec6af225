// parallel_model.cpp — tensor parallelism + FSDP units + data-parallel gradient sync around a Llama model.
#include "meshtrain/parallel/parallel_model.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/model/compute_matmul.hpp"
#include "meshtrain/model/fused_cross_entropy.hpp"
#include "meshtrain/model/moe.hpp"
#include "meshtrain/parallel/expert_parallel.hpp"

#include <c10/util/accumulate.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <array>
#include <cmath>
#include <optional>
#include <utility>

namespace meshtrain::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Identity on a unit's input (a decoder layer's, the final norm's) whose backward runs once the unit's backward is
// done (every parameter gradient of the unit has been accumulated: AccumulateGrad nodes run first), so it starts the
// unit's gradient reduce-scatter, which then overlaps the backward of the units before it. `reducing` is the model's
// unit whose reduction is in flight: it is finished first, so one is in flight at a time (finish_backward() ends
// the last).
struct GradientBoundary : torch::autograd::Function<GradientBoundary> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, FsdpUnit* unit, FsdpUnit** reducing) {
    ctx->saved_data["unit"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(unit));
    ctx->saved_data["reducing"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(reducing));
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* unit = reinterpret_cast<FsdpUnit*>(static_cast<intptr_t>(ctx->saved_data["unit"].toInt()));
    FsdpUnit*& reducing = *reinterpret_cast<FsdpUnit**>(static_cast<intptr_t>(ctx->saved_data["reducing"].toInt()));
    for (const FsdpUnit::Member& m : unit->members())
      MT_CHECK(m.param.grad().defined(), "FSDP unit {}: the gradient of {} was not ready when the unit's backward "
               "finished", unit->label(), m.name);
    if (reducing) reducing->finish_reducing_gradients();
    unit->start_reducing_gradients();
    reducing = unit;
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

// The positions of the tokens of `tokens_N` that are rows [first, end) of the embedding table.
at::Tensor positions_in_rows(const at::Tensor& tokens_N, int64_t first, int64_t end) {
  return ((tokens_N >= first) & (tokens_N < end)).nonzero().squeeze(1);
}

// The head's weight for CrossEntropyWithLogitGradients a piece of every shard at a time (whole rows: the caller
// checks that a shard holds whole rows), each piece's all-gather started while the one before is computed on.
std::function<model::CrossEntropyWithLogitGradients::WeightBlock()> head_blocks(const FsdpUnit& head) {
  const int n = static_cast<int>(head.padded_numel() / head.shard().numel());
  const int64_t shard_numel = head.shard().numel(), D = head.members().front().shape.at(1);
  const int64_t piece_numel = std::max<int64_t>(1, FsdpUnit::kReducePieceElements / n / D) * D;
  auto begin = std::make_shared<int64_t>(0);
  auto next = std::make_shared<std::optional<runtime::PendingCollective>>(
      head.gather_piece_async(0, std::min(piece_numel, shard_numel)));
  return [&head, n, shard_numel, D, piece_numel, begin, next]() {
    model::CrossEntropyWithLogitGradients::WeightBlock block;
    if (!next->has_value()) return block;
    const int64_t count = std::min(piece_numel, shard_numel - *begin);
    block.weight_RD = (*next)->wait().view({n * count / D, D});
    for (int r = 0; r < n; ++r) block.row_ranges.emplace_back((r * shard_numel + *begin) / D, count / D);
    *begin += count;
    next->reset();
    if (*begin < shard_numel) *next = head.gather_piece_async(*begin, std::min(piece_numel, shard_numel - *begin));
    return block;
  };
}

// The training loss of the output head, the fused chunked cross-entropy (model/fused_cross_entropy.hpp) with its
// weight's gradient handled here: reduce-scattered as soon as the pass has made it, then the head's gathered weight
// and that V x D gradient are freed, so neither sits through the backward, which starts at the peak of the
// activations. Sharded (fsdp > 1), and when the logits' gradient is the smaller of the two, the V x D gradient is
// never whole: the pass keeps the logits' gradient, and each reduce-scatter piece's elements of the weight's
// gradient are computed from it as the piece is filled. If the head was not gathered (ParallelModel::loss_sum
// leaves it so when its shards hold whole rows), neither is its weight: the pass takes it a piece at a time.
// Kept for backward: the hidden states' gradient and this device's shard of the weight's; backward scales both by
// the incoming gradient and adds the shard to the head unit's gradient shard.
struct HeadLoss : torch::autograd::Function<HeadLoss> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden_ND, const at::Tensor& targets_N,
                            FsdpUnit* head, int64_t chunk_rows) {
    const at::Tensor& weight_VD = head->members().front().param;
    at::Tensor loss, grad_hidden_ND, weight_grad_shard;
    const bool sharded = head->shard().numel() < head->padded_numel();
    if (!sharded ||
        !model::logit_gradients_fit_in_weight_gradient(hidden_ND.size(0), hidden_ND.size(1), hidden_ND.scalar_type())) {
      head->gather();  // a no-op unless the forward planned otherwise (ParallelModel::head_by_pieces)
      model::CrossEntropyWithGradients pass =
          model::cross_entropy_with_gradients(hidden_ND, weight_VD, targets_N, chunk_rows);
      weight_grad_shard = head->reduce_scatter({pass.grad_weight_VD});
      head->free_full();
      loss = pass.loss;
      grad_hidden_ND = pass.grad_hidden_ND;
    } else {
      const model::CrossEntropyWithLogitGradients pass =
          head->gathered()
              ? model::CrossEntropyWithLogitGradients(hidden_ND, weight_VD, targets_N, chunk_rows)
              : model::CrossEntropyWithLogitGradients(hidden_ND, head->members().front().shape.at(0), targets_N,
                                                      chunk_rows, head_blocks(*head));
      head->free_full();
      weight_grad_shard = head->reduce_scatter([&pass](size_t, int64_t from, int64_t to, at::Tensor& into) {
        into.copy_(pass.weight_gradient_elements(from, to));
      });
      loss = pass.loss();
      grad_hidden_ND = pass.grad_hidden_ND();
    }
    ctx->saved_data["head"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(head));
    ctx->save_for_backward({grad_hidden_ND, weight_grad_shard});
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* head = reinterpret_cast<FsdpUnit*>(static_cast<intptr_t>(ctx->saved_data["head"].toInt()));
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& grad_loss = grads[0];  // a scalar
    head->grad_shard().add_(saved[1], grad_loss.item<double>());
    return {saved[0] * grad_loss.to(saved[0].scalar_type()), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The embedding lookup's backward without a V x D gradient: the lookup runs outside autograd, and this identity on
// its output hands the incoming gradient (a row per token) with the token ids to `lookups`, from which
// ParallelModel::finish_backward() makes the table's gradient a piece at a time. `table` is an input only so that
// autograd runs this node; it gets no gradient here.
struct EmbeddingGradientRows : torch::autograd::Function<EmbeddingGradientRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_BTD, const at::Tensor& table,
                            const at::Tensor& tokens_BT, std::vector<ParallelModel::LookupGradient>* lookups) {
    ctx->saved_data["lookups"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(lookups));
    ctx->saved_data["tokens"] = tokens_BT;
    return x_BTD.view_as(x_BTD);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* lookups = reinterpret_cast<std::vector<ParallelModel::LookupGradient>*>(
        static_cast<intptr_t>(ctx->saved_data["lookups"].toInt()));
    lookups->push_back({ctx->saved_data["tokens"].toTensor().reshape({-1}), grads[0].reshape({-1, grads[0].size(-1)})});
    return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// A decoder layer that keeps only its input: forward runs without recording a graph; backward runs the layer's
// forward again with grad (its parameters gathered again by then: the hook on the output) and backpropagates
// through it, which accumulates the parameter gradients and gives the input's (PyTorch's reentrant checkpoint).
struct CheckpointedLayer : torch::autograd::Function<CheckpointedLayer> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_BTD, model::LlamaDecoderLayer* layer,
                            const model::RopeTables& rope) {
    ctx->saved_data["layer"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(layer));
    ctx->saved_data["cos"] = rope.cos;
    ctx->saved_data["sin"] = rope.sin;
    ctx->saved_data["documents"] = rope.documents_BT;
    ctx->saved_data["exchange"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(rope.exchange));
    ctx->saved_data["positions"] = rope.positions_T;
    ctx->saved_data["key_documents"] = rope.key_documents_BS;
    ctx->save_for_backward({x_BTD});
    return layer->forward(x_BTD, rope);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* layer = reinterpret_cast<model::LlamaDecoderLayer*>(static_cast<intptr_t>(ctx->saved_data["layer"].toInt()));
    model::RopeTables rope;
    rope.cos = ctx->saved_data["cos"].toTensor();
    rope.sin = ctx->saved_data["sin"].toTensor();
    rope.documents_BT = ctx->saved_data["documents"].toTensor();
    rope.exchange =
        reinterpret_cast<model::ContextExchange*>(static_cast<intptr_t>(ctx->saved_data["exchange"].toInt()));
    rope.positions_T = ctx->saved_data["positions"].toTensor();
    rope.key_documents_BS = ctx->saved_data["key_documents"].toTensor();
    const at::Tensor x_BTD = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    at::Tensor y_BTD;
    {
      torch::AutoGradMode grad_mode(true);
      y_BTD = layer->forward(x_BTD, rope);
    }
    torch::autograd::backward({y_BTD}, {grads[0]});
    return {x_BTD.grad(), at::Tensor(), at::Tensor()};
  }
};

// The layout checks, run before any group is created: a device that failed while its peers were still connecting
// would leave them with a transport error instead of the reason.
std::shared_ptr<model::LlamaForCausalLM> checked_for_mesh(std::shared_ptr<model::LlamaForCausalLM> model,
                                                           const mesh::Mesh& mesh) {
  check_expert_parallel(model->config(), mesh.size(mesh::Axis::expert));
  check_tensor_parallel(model->config(), mesh.size(mesh::Axis::tensor));
  const int stages = mesh.size(mesh::Axis::pipeline);
  MT_USER_CHECK(stages == 1 || !model->config().tie_word_embeddings,
                "pipeline={}: the model ties its embedding and output head (model.tie_word_embeddings=true), but the "
                "embedding is on the first stage and the head on the last; pipeline parallelism needs untied "
                "embeddings (model.tie_word_embeddings=false, e.g. model=llama-10m) or pipeline=1", stages);
  MT_USER_CHECK(stages == 1 || !model->config().is_moe(),
                "pipeline={}: a Mixtral (model.num_local_experts={}) does not run in a pipeline yet (its routing "
                "statistics are summed over one stage's layers); use pipeline=1 with expert, fsdp or data parallelism",
                stages, model->config().num_local_experts);
  return model;
}

std::string megabytes(int64_t bytes) { return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6); }

}  // namespace

ParallelOptions ParallelOptions::from(const settings::Settings& settings) {
  ParallelOptions options;
  options.reshard_after_forward = settings.parallel.reshard_after_forward;
  options.checkpoint_every = settings.parallel.checkpoint_every;
  options.gather_dtype = model::torch_dtype(settings.compute_dtype);  // bf16 compute gathers bf16
  options.capacity_factor = settings.parallel.capacity_factor;
  options.pipeline = settings.pipeline;
  options.block_size = settings.block_size;
  return options;
}

ParallelModel::ParallelModel(std::shared_ptr<model::LlamaForCausalLM> model, runtime::DeviceContext& ctx,
                             ParallelOptions options, const model::SliceSource& values)
    : model_(checked_for_mesh(std::move(model), ctx.mesh())),
      ctx_(ctx),
      options_(options),
      roles_(ctx.mesh()),
      fsdp_comm_(ctx.over(mesh::Axis::fsdp)),
      tensor_comm_(ctx.over(mesh::Axis::tensor)),
      expert_comm_(ctx.over(mesh::Axis::expert)),
      dense_gradient_comm_(ctx.over(roles_.dense_gradient_axes())),
      expert_gradient_comm_(ctx.over(roles_.expert_gradient_axes())),
      batch_comm_(ctx.over(roles_.token_axes())),
      pipeline_comm_(ctx.over(mesh::Axis::pipeline)),
      loss_comm_(ctx.over(roles_.loss_axes())),
      stage_(ctx.info().coords[static_cast<int>(mesh::Axis::pipeline)]),
      stage_layers_(split_layers(model_->config(), options.block_size, ctx.mesh().size(mesh::Axis::pipeline),
                                 options.pipeline.layers_per_stage, options.pipeline.virtual_stages)) {
  if (roles_.context_split()) {
    context_ = std::make_unique<ContextParallel>(ctx.over(mesh::Axis::context));
    model_->set_context_exchange(context_.get());
  }
  apply_tensor_parallel(*model_, tensor_comm_);
  apply_expert_parallel(*model_, expert_comm_);
  for (const auto& layer : model_->model->layers)
    if (layer->block_sparse_moe) layer->block_sparse_moe->set_capacity_factor(options_.capacity_factor);

  const int64_t num_layers = model_->config().num_hidden_layers;
  std::vector<FsdpUnit::Parameter> embedding_params, final_norm_params, lm_head_params;
  std::vector<std::vector<FsdpUnit::Parameter>> layer_params(num_layers), expert_params(num_layers);
  const std::string layer_prefix = "model.layers.";
  for (const auto& named : model_->named_parameters()) {
    const std::string& name = named.key();
    const TensorSplit split = tensor_split_of(name);
    const std::vector<int64_t> whole = whole_shape(named.value().sizes().vec(), split, tensor_comm_.size());
    FsdpUnit::Parameter p{name, named.value(),
                          tensor_block_slice(name, whole, split, tensor_comm_.rank(), tensor_comm_.size())};
    if (name.compare(0, layer_prefix.size(), layer_prefix) == 0)
      (expert_of_parameter(name) >= 0 ? expert_params : layer_params)
          .at(std::stoll(name.substr(layer_prefix.size())))
          .push_back(std::move(p));
    else if (name == "model.embed_tokens.weight")
      embedding_params.push_back(std::move(p));
    else if (name == "model.norm.weight")
      final_norm_params.push_back(std::move(p));
    else
      lm_head_params.push_back(std::move(p));
  }
  // Units numbered as unit(u) numbers them; a unit of another pipeline stage has its layout only.
  size_t next_unit = 0;
  auto make_unit = [&](const std::string& label, const std::vector<FsdpUnit::Parameter>& params) {
    const bool held = holds(next_unit++);
    return std::make_unique<FsdpUnit>(label, params, fsdp_comm_, values, options_.gather_dtype, held);
  };
  embedding_ = make_unit("embedding", embedding_params);
  for (int64_t i = 0; i < num_layers; ++i)
    layers_.push_back(make_unit(layer_prefix + std::to_string(i), layer_params[i]));
  final_norm_ = make_unit("final_norm", final_norm_params);
  if (!lm_head_params.empty()) lm_head_ = make_unit("lm_head", lm_head_params);
  if (model_->config().is_moe())
    for (int64_t i = 0; i < num_layers; ++i)
      expert_units_.push_back(make_unit(layer_prefix + std::to_string(i) + ".experts", expert_params[i]));
  for (size_t u = 0, held = 0; u < num_units(); ++u) shard_index_.push_back(holds(u) ? static_cast<int>(held++) : -1);
  // The whole model's parameters: the units' members, and for each expert unit the experts of every device (the
  // member at the same place among the local ones has the same shape and offset on the expert's holder).
  for (size_t u = 0; u < num_dense_units(); ++u)
    for (size_t k = 0; k < unit(u).members().size(); ++k)
      whole_parameters_.push_back({unit(u).members()[k].name, unit(u).members()[k].block.full_shape, u, k, 0});
  const int64_t num_experts = model_->config().num_local_experts, experts_here = num_experts / expert_comm_.size();
  for (size_t i = 0; i < expert_units_.size(); ++i) {
    const std::vector<FsdpUnit::Member>& members = expert_units_[i]->members();
    const size_t per_expert = members.size() / static_cast<size_t>(experts_here);
    for (int64_t e = 0; e < num_experts; ++e)
      for (size_t k = 0; k < per_expert; ++k) {
        const size_t member = static_cast<size_t>(e % experts_here) * per_expert + k;
        whole_parameters_.push_back({with_expert_index(members[member].name, e), members[member].block.full_shape,
                                     num_dense_units() + i, member,
                                     expert_holder(e, num_experts, expert_comm_.size())});
      }
  }
  MT_CHECK(head().members().size() == 1, "the head unit holds {} parameters, expected the head's weight alone",
           head().members().size());
  model_->set_layer_runner([this](int64_t index, model::LlamaDecoderLayer& layer, const torch::Tensor& x_BTD,
                                  const model::RopeTables& rope) { return run_layer(index, layer, x_BTD, rope); });
}

FsdpUnit& ParallelModel::head() { return lm_head_ ? *lm_head_ : *embedding_; }

int ParallelModel::stage_of_unit(size_t u) const {
  // Counted from the config: called while the units are being made.
  const config::LlamaConfig& config = model_->config();
  const size_t num_layers = static_cast<size_t>(config.num_hidden_layers);
  const size_t dense_units = num_layers + (config.tie_word_embeddings ? 2 : 3);
  if (u == 0) return 0;
  if (u > num_layers && u < dense_units) return rank_of_stage(stage_layers_.size() - 1);
  return rank_of_layer(static_cast<int64_t>(u <= num_layers ? u - 1 : u - dense_units));
}

int ParallelModel::rank_of_stage(size_t stage) const {
  return static_cast<int>(stage % static_cast<size_t>(ctx_.mesh().size(mesh::Axis::pipeline)));
}

int ParallelModel::rank_of_layer(int64_t layer) const {
  for (size_t s = 0; s < stage_layers_.size(); ++s)
    if (layer < stage_layers_[s].end) return rank_of_stage(s);
  MT_CHECK(false, "layer {} is past the model's {} layers", layer, stage_layers_.back().end);
}

bool ParallelModel::resharding() const { return options_.reshard_after_forward && fsdp_comm_.size() > 1; }

at::Tensor ParallelModel::run_layer(int64_t index, model::LlamaDecoderLayer& layer, const at::Tensor& x_BTD,
                                    const model::RopeTables& rope) {
  // The layer's units: its own parameters, and a Mixtral's experts on this device.
  auto units_of = [this](int64_t i) {
    std::vector<FsdpUnit*> units;
    // None past the ends, nor another pipeline rank's.
    if (i < 0 || i >= static_cast<int64_t>(layers_.size()) || rank_of_layer(i) != stage_) return units;
    units.push_back(layers_[i].get());
    if (!expert_units_.empty()) units.push_back(expert_units_[i].get());
    return units;
  };
  const std::vector<FsdpUnit*> units = units_of(index), next = units_of(index + 1), previous = units_of(index - 1);
  at::Tensor input_BTD = x_BTD;
  if (!per_pass_)  // in a pipeline pass the gradients are reduced once, when it ends
    for (FsdpUnit* unit : units) input_BTD = GradientBoundary::apply(input_BTD, unit, &reducing_);
  for (FsdpUnit* unit : units) unit->gather();
  // The next units' all-gathers overlap this layer's forward.
  for (FsdpUnit* unit : next) unit->prefetch();
  if (index + 1 == static_cast<int64_t>(layers_.size())) {
    final_norm_->prefetch();
    if (!head_by_pieces_) head().prefetch();
  }
  const bool checkpointed = options_.checkpoint_every > 0 && index % options_.checkpoint_every == 0;
  at::Tensor y_BTD = checkpointed ? CheckpointedLayer::apply(input_BTD, &layer, rope)
                                  : layer.forward(input_BTD, rope);
  if (resharding() && !per_pass_) {
    for (FsdpUnit* unit : units) unit->free_full();
    // Backward runs the layers in reverse: gather this one again, and start the one before it (an evaluation has
    // no backward).
    if (y_BTD.requires_grad())
      y_BTD.register_hook([units, previous](const at::Tensor&) {
        for (FsdpUnit* unit : units) unit->gather();
        for (FsdpUnit* unit : previous) unit->prefetch();
      });
  }
  return y_BTD;
}

bool ParallelModel::head_by_pieces(int64_t tokens) {
  const FsdpUnit& h = head();
  const int64_t D = h.members().front().shape.at(1);
  return torch::GradMode::is_enabled() && h.shard().numel() < h.padded_numel() && h.padded_numel() == h.numel() &&
         h.shard().numel() % D == 0 &&
         model::logit_gradients_fit_in_weight_gradient(tokens, D, model_->compute_dtype());
}

bool ParallelModel::lookup_by_rows() const {
  const FsdpUnit& table = *embedding_;
  const int64_t D = table.members().front().shape.at(1);
  return fsdp_comm_.size() > 1 && table.padded_numel() == table.numel() && table.shard().numel() % D == 0;
}

at::Tensor ParallelModel::rows_by_shard(const at::Tensor& tokens_BT) {
  const FsdpUnit& table = *embedding_;
  const int64_t V = table.members().front().shape.at(0), D = table.members().front().shape.at(1);
  const at::Tensor tokens_N = fsdp_comm_.allgather(tokens_BT.reshape({-1}).contiguous());  // the group's, in rank order
  const int64_t min_token = tokens_N.min().item<int64_t>(), max_token = tokens_N.max().item<int64_t>();
  MT_CHECK(min_token >= 0 && max_token < V, "token ids from {} to {} for an embedding of {} rows", min_token,
           max_token, V);
  const int64_t rows = table.shard().numel() / D, first = fsdp_comm_.rank() * rows;
  const at::Tensor here_K = positions_in_rows(tokens_N, first, first + rows);
  at::Tensor rows_ND = at::zeros({tokens_N.size(0), D}, at::kFloat);
  rows_ND.index_copy_(0, here_K,
                      table.shard().view({rows, D}).index_select(0, tokens_N.index_select(0, here_K) - first));
  std::vector<int64_t> shape = tokens_BT.sizes().vec();
  shape.push_back(D);
  return fsdp_comm_.reduce_scatter_sum(rows_ND).view(shape);
}

at::Tensor ParallelModel::loss_sum(const at::Tensor& tokens_BT, const at::Tensor& targets_BT,
                                  const at::Tensor& documents_BT) {
  MT_CHECK(pipeline_comm_.size() == 1, "loss_sum runs the whole model: with a pipeline, forward_backward and "
           "evaluation_loss_sum run the stages");
  head_by_pieces_ = head_by_pieces(tokens_BT.numel());
  const at::Tensor x_BTD = model_->run_layers(embedded(tokens_BT), documents_BT);
  if (model::RouterStats* stats = model_->router_stats().get())
    stats->close([this](at::Tensor& sums) { batch_comm_.allreduce_sum(sums); });
  return head_loss_sum(x_BTD, targets_BT);
}

at::Tensor ParallelModel::embedded(const at::Tensor& tokens_BT) {
  const bool by_rows = lookup_by_rows();
  if (!by_rows) embedding_->gather();
  at::Tensor x_BTD;
  {
    torch::NoGradGuard no_grad;  // the lookup's backward is EmbeddingGradientRows'
    x_BTD = by_rows ? model_->embed(tokens_BT, [this](const at::Tensor& tokens) { return rows_by_shard(tokens); })
                    : model_->embed(tokens_BT);
  }
  if (torch::GradMode::is_enabled())
    x_BTD = EmbeddingGradientRows::apply(x_BTD, embedding_->members().front().param, tokens_BT, &lookup_gradients_);
  if (resharding()) embedding_->free_full();  // the lookup's backward needs the token ids only
  return x_BTD;
}

at::Tensor ParallelModel::head_loss_sum(const at::Tensor& x_BTD, const at::Tensor& targets_BT) {
  const at::Tensor input_BTD = per_pass_ ? x_BTD : GradientBoundary::apply(x_BTD, final_norm_.get(), &reducing_);
  final_norm_->gather();
  const at::Tensor hidden_BTD = model_->final_norm(input_BTD);
  const at::Tensor hidden_ND = hidden_BTD.reshape({-1, hidden_BTD.size(-1)}), targets_N = targets_BT.reshape({-1});
  const int64_t chunk_rows = model::cross_entropy_chunk_rows(model_->config().vocab_size);
  FsdpUnit& head_unit = head();
  const bool training = torch::GradMode::is_enabled() && hidden_ND.requires_grad();
  if (!(training && head_by_pieces_)) head_unit.gather();  // else HeadLoss takes it a piece at a time
  if (training) return HeadLoss::apply(hidden_ND, targets_N, &head_unit, chunk_rows);
  const at::Tensor loss = model::fused_cross_entropy_sum(hidden_ND, head_unit.members().front().param.detach(),
                                                         targets_N, chunk_rows);
  // No backward follows an evaluation to free what stayed gathered (every unit without resharding, the final norm).
  for (size_t u = 0; u < num_units(); ++u)
    if (holds(u)) unit(u).free_full();
  return loss;
}

double ParallelModel::forward_backward(const at::Tensor& tokens_BT, const at::Tensor& targets_BT,
                                       const at::Tensor& documents_BT, double loss_scale) {
  if (pipeline_comm_.size() > 1) return run_pipeline(tokens_BT, targets_BT, documents_BT, loss_scale);
  const at::Tensor loss = loss_sum(tokens_BT, targets_BT, documents_BT);
  (loss * loss_scale).backward();
  finish_backward();
  return loss.item<double>();
}

double ParallelModel::evaluation_loss_sum(const at::Tensor& tokens_BT, const at::Tensor& targets_BT,
                                          const at::Tensor& documents_BT) {
  const torch::NoGradGuard no_grad;
  if (pipeline_comm_.size() > 1) return run_pipeline(tokens_BT, targets_BT, documents_BT, std::nullopt);
  return loss_sum(tokens_BT, targets_BT, documents_BT).item<double>();
}

std::vector<double> ParallelModel::take_stage_wait_seconds() {
  if (pipeline_comm_.size() == 1) return {};
  const at::Tensor waits =
      pipeline_comm_.allgather(at::tensor({std::exchange(pipeline_wait_seconds_, 0.0)}, at::kDouble));
  return std::vector<double>(waits.data_ptr<double>(), waits.data_ptr<double>() + waits.numel());
}

void ParallelModel::finish_backward() {
  if (reducing_) reducing_->finish_reducing_gradients();
  reducing_ = nullptr;
  // (With virtual stages, the backwards of the first rank's later stages have no lookup: every member of its fsdp
  // group runs the same schedule, so they skip alike.)
  if (holds(0) && !lookup_gradients_.empty()) reduce_embedding_gradient();
}

void ParallelModel::reduce_embedding_gradient() {
  FsdpUnit& table = *embedding_;
  const FsdpUnit::Member& m = table.members().front();
  MT_CHECK(!m.param.grad().defined(), "the embedding table got a gradient through autograd: its lookups' gradient "
           "is reduced from their rows");
  const int64_t D = m.shape.at(1);
  if (fsdp_comm_.size() == 1) {  // the shard is the table: add the rows in place
    at::Tensor table_grad_VD = table.grad_shard().narrow(0, m.offset, m.numel).view(m.shape);
    for (const LookupGradient& g : lookup_gradients_) table_grad_VD.index_add_(0, g.tokens_N, g.grad_ND.to(at::kFloat));
  } else if (lookup_by_rows()) {
    // Every device's token ids and gradient rows; this device sums those of its rows, each device's sum apart and
    // then in rank order (the order of a reduce-scatter's sum: the same bits as the pieces' path below), over the
    // rows some token touched only.
    const int n = fsdp_comm_.size();
    const int64_t rows = table.grad_shard().numel() / D, first = fsdp_comm_.rank() * rows;
    std::vector<std::pair<at::Tensor, at::Tensor>> gathered;  // per lookup: the group's tokens, their gradient rows
    std::vector<at::Tensor> touched;                          // per lookup: the rows of this shard its tokens touch
    for (const LookupGradient& g : lookup_gradients_) {
      const at::Tensor tokens_N = fsdp_comm_.allgather(g.tokens_N.contiguous());
      gathered.emplace_back(tokens_N, fsdp_comm_.allgather(g.grad_ND.to(at::kFloat).contiguous()));
      touched.push_back(tokens_N.index_select(0, positions_in_rows(tokens_N, first, first + rows)));
    }
    const at::Tensor touched_U = std::get<0>(at::_unique(at::cat(touched), /*sorted=*/true));
    at::Tensor sum_UD = at::zeros({touched_U.size(0), D}, at::kFloat), device_sum_UD = at::empty_like(sum_UD);
    for (int r = 0; r < n; ++r) {
      device_sum_UD.zero_();
      for (const auto& [tokens_N, grad_ND] : gathered) {
        const int64_t N = tokens_N.size(0) / n;
        const at::Tensor device_tokens_N = tokens_N.narrow(0, r * N, N);
        const at::Tensor here_K = positions_in_rows(device_tokens_N, first, first + rows);
        device_sum_UD.index_add_(0, at::searchsorted(touched_U, device_tokens_N.index_select(0, here_K)),
                                 grad_ND.narrow(0, r * N, N).index_select(0, here_K));
      }
      sum_UD.add_(device_sum_UD);
    }
    table.grad_shard().view({rows, D}).index_add_(0, touched_U - first, sum_UD);
  } else {
    // Elements [from, to) of the table's gradient: the rows they touch, each the sum of its tokens' gradient rows.
    at::Tensor reduced = table.reduce_scatter([this, D](size_t, int64_t from, int64_t to, at::Tensor& into) {
      const int64_t first = from / D, end = (to + D - 1) / D;
      at::Tensor rows_RD = at::zeros({end - first, D}, at::kFloat);
      for (const LookupGradient& g : lookup_gradients_) {
        const at::Tensor here_K = positions_in_rows(g.tokens_N, first, end);
        rows_RD.index_add_(0, g.tokens_N.index_select(0, here_K) - first,
                           g.grad_ND.index_select(0, here_K).to(at::kFloat));
      }
      into.copy_(rows_RD.view({-1}).narrow(0, from - first * D, to - from));
    });
    table.grad_shard().add_(reduced);
  }
  lookup_gradients_.clear();
  table.free_full();
}

void ParallelModel::synchronize_gradients() {
  // The units [first, last) summed over `comm` in one all-reduce.
  auto sum_over = [this](size_t first, size_t last, runtime::Comm& comm) {
    std::vector<at::Tensor> grads;
    for (size_t u = first; u < last; ++u)
      if (holds(u)) grads.push_back(unit(u).grad_shard());
    if (comm.size() == 1 || grads.empty()) return;
    at::Tensor flat = at::cat(grads);
    comm.allreduce_sum(flat);
    int64_t offset = 0;
    for (at::Tensor& g : grads) {
      g.copy_(flat.narrow(0, offset, g.numel()));
      offset += g.numel();
    }
  };
  // Experts differ over `expert`: their replicas are over fewer axes (mesh_roles.hpp).
  if (&dense_gradient_comm_ == &expert_gradient_comm_) {
    sum_over(0, num_units(), dense_gradient_comm_);
  } else {
    sum_over(0, num_dense_units(), dense_gradient_comm_);
    sum_over(num_dense_units(), num_units(), expert_gradient_comm_);
  }
}

double ParallelModel::gradient_norm() {
  // [tensor-split, replicated over tensor] square sums of the non-expert units, then of the expert units.
  std::array<double, 4> square_sums{};
  for (size_t u = 0; u < num_units(); ++u) {
    if (!holds(u)) continue;
    auto [split, replicated] = unit(u).grad_square_sums();
    const size_t at = u < num_dense_units() ? 0 : 2;
    square_sums[at] += split;
    square_sums[at + 1] += replicated;
  }
  // Shards differ over fsdp; experts differ over expert; tensor blocks differ over tensor, replicated parameters do
  // not; data (and, outside the experts, expert) holds replicas; each pipeline stage holds its own units.
  at::Tensor sums = at::tensor(std::vector<double>(square_sums.begin(), square_sums.end()), at::kDouble);
  fsdp_comm_.allreduce_sum(sums);
  at::Tensor experts = sums.narrow(0, 2, 2).clone();
  expert_comm_.allreduce_sum(experts);
  at::Tensor split = (sums.narrow(0, 0, 1) + experts.narrow(0, 0, 1)).clone();
  tensor_comm_.allreduce_sum(split);
  at::Tensor total = at::tensor({split.item<double>() + sums[1].item<double>() + experts[1].item<double>()}, at::kDouble);
  pipeline_comm_.allreduce_sum(total);
  return std::sqrt(total.item<double>());
}

void ParallelModel::zero_gradients() {
  for (at::Tensor& g : gradient_shards()) g.zero_();
}

const FsdpUnit& ParallelModel::unit(size_t u) const {
  if (u == 0) return *embedding_;
  if (u <= layers_.size()) return *layers_[u - 1];
  if (u >= num_dense_units()) return *expert_units_.at(u - num_dense_units());
  return u == layers_.size() + 1 ? *final_norm_ : *lm_head_;
}

FsdpUnit& ParallelModel::unit(size_t u) { return const_cast<FsdpUnit&>(std::as_const(*this).unit(u)); }

std::vector<at::Tensor> ParallelModel::parameter_shards() {
  std::vector<at::Tensor> shards;
  for (size_t u = 0; u < num_units(); ++u)
    if (holds(u)) shards.push_back(unit(u).shard());
  return shards;
}

std::vector<at::Tensor> ParallelModel::gradient_shards() {
  std::vector<at::Tensor> grads;
  for (size_t u = 0; u < num_units(); ++u)
    if (holds(u)) grads.push_back(unit(u).grad_shard());
  return grads;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> ParallelModel::whole_parameter_shapes() const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const WholeParameter& p : whole_parameters_) shapes.emplace_back(p.name, p.shape);
  return shapes;
}

void ParallelModel::assemble_whole_tensors(const std::vector<at::Tensor>& shard_buffers,
                                           const std::function<int(size_t)>& owner, const WholeTensorPart& fn,
                                           int64_t part_elements) {
  const size_t held_units = parameter_shards().size();
  MT_CHECK(shard_buffers.size() == held_units, "{} shard buffers for the {} units this stage holds",
           shard_buffers.size(), held_units);
  MT_CHECK(part_elements >= 1, "parts of {} elements", part_elements);
  runtime::Comm& world = ctx_.world();
  const mesh::Mesh& mesh = ctx_.mesh();
  const std::vector<mesh::Axis> all_axes(mesh::kAllAxes.begin(), mesh::kAllAxes.end());
  const int fsdp_size = fsdp_comm_.size(), tensor_size = tensor_comm_.size();
  // The world rank of the device of data (and context) replica 0 at (fsdp f, tensor t, expert x, pipeline stage p):
  // it holds shard f of tensor block t (of expert x's experts, for an expert's parameter) of stage p's units.
  mesh::Coords coords = ctx_.info().coords;
  for (mesh::Axis a : {mesh::Axis::data, mesh::Axis::expert, mesh::Axis::context}) coords[static_cast<int>(a)] = 0;
  auto holder = [&](int f, int t, int x, int p) {
    mesh::Coords c = coords;
    c[static_cast<int>(mesh::Axis::fsdp)] = f;
    c[static_cast<int>(mesh::Axis::tensor)] = t;
    c[static_cast<int>(mesh::Axis::expert)] = x;
    c[static_cast<int>(mesh::Axis::pipeline)] = p;
    return mesh.index_along(mesh.device_at(c), all_axes);
  };
  const int me = world.rank();

  for (size_t u = 0; u < num_units(); ++u) {
    if (!holds(u)) continue;
    const int64_t shard_numel = unit(u).padded_numel() / fsdp_size;
    const at::Tensor& buffer = shard_buffers[static_cast<size_t>(shard_index_[u])];
    MT_CHECK(buffer.numel() == shard_numel, "unit {}: a shard buffer of {} elements, expected {}", unit(u).label(),
             buffer.numel(), shard_numel);
  }
  // The runs of `slice` (consecutive elements of the whole tensor) that fall in the whole tensor's elements
  // [first, end): fn(index in the whole tensor, count, offset in the slice).
  auto runs_within = [](const model::ParameterSlice& slice, int64_t first, int64_t end,
                        const std::function<void(int64_t, int64_t, int64_t)>& fn) {
    slice.for_each_run([&](int64_t whole_index, int64_t count, int64_t offset) {
      const int64_t lo = std::max(whole_index, first), hi = std::min(whole_index + count, end);
      if (lo < hi) fn(lo, hi - lo, offset + lo - whole_index);
    });
  };
  int exchange_tag = 0;  // one per exchange, counted alike on every device
  for (size_t index = 0; index < whole_parameters_.size(); ++index) {
    const WholeParameter& whole_parameter = whole_parameters_[index];
    const FsdpUnit& this_unit = unit(whole_parameter.unit);
    const FsdpUnit::Member& m = this_unit.members()[whole_parameter.member];
    const int buffer_index = shard_index_[whole_parameter.unit];  // -1 on another stage: it sends nothing
    const at::Tensor shard_buffer = buffer_index >= 0 ? shard_buffers[buffer_index] : at::Tensor();
    const int stage = stage_of_unit(whole_parameter.unit);
    const int dest = owner(index);
    // The pieces of this member: shard f of tensor block t, held by world rank `source`.
    struct Piece {
      FsdpUnit::ShardPiece in_shard;
      int source;
    };
    std::vector<Piece> pieces;
    for (int f = 0; f < fsdp_size; ++f)
      for (int t = 0; t < tensor_size; ++t)
        if (const auto p = this_unit.piece_in_shard(
                m, f, tensor_block_slice(m.name, m.block.full_shape, m.split, t, tensor_size)))
          pieces.push_back({*p, holder(f, t, whole_parameter.expert_holder, stage)});
    const int64_t whole_numel = c10::multiply_integers(whole_parameter.shape);
    for (int64_t first = 0; first < whole_numel; first += part_elements) {
      const int64_t end = std::min(whole_numel, first + part_elements);
      std::vector<std::pair<int, at::Tensor>> sends, receives;
      at::Tensor part = dest == me ? at::empty({end - first}, at::kFloat) : at::Tensor();
      // Received pieces are unpacked into `part` once the exchange is done.
      std::vector<std::pair<const model::ParameterSlice*, at::Tensor>> unpack;
      for (const Piece& piece : pieces) {
        const model::ParameterSlice& slice = piece.in_shard.slice;
        if (piece.source == me) {
          const at::Tensor values = shard_buffer.narrow(0, piece.in_shard.offset_in_shard, slice.numel());
          if (dest == me) {
            runs_within(slice, first, end, [&](int64_t whole_index, int64_t count, int64_t offset) {
              part.narrow(0, whole_index - first, count).copy_(values.narrow(0, offset, count));
            });
            continue;
          }
          std::vector<at::Tensor> runs;  // this piece's elements in the part, packed in order
          runs_within(slice, first, end, [&](int64_t, int64_t count, int64_t offset) {
            runs.push_back(values.narrow(0, offset, count));
          });
          if (!runs.empty()) sends.emplace_back(dest, runs.size() == 1 ? runs[0] : at::cat(runs));
        } else if (dest == me) {
          int64_t count_within = 0;
          runs_within(slice, first, end, [&](int64_t, int64_t count, int64_t) { count_within += count; });
          if (count_within == 0) continue;
          receives.emplace_back(piece.source, at::empty({count_within}, at::kFloat));
          unpack.emplace_back(&slice, receives.back().second);
        }
      }
      const int tag = exchange_tag++;
      if (!sends.empty() || !receives.empty()) world.exchange(sends, receives, tag);
      if (dest != me) continue;
      for (const auto& [slice, packed] : unpack) {
        int64_t packed_offset = 0;
        runs_within(*slice, first, end, [&, &packed = packed](int64_t whole_index, int64_t count, int64_t) {
          part.narrow(0, whole_index - first, count).copy_(packed.narrow(0, packed_offset, count));
          packed_offset += count;
        });
      }
      fn(index, whole_parameter.name, part, first);
    }
  }
}

void ParallelModel::load_shards(std::vector<at::Tensor>& shard_buffers, const model::SliceSource& values) {
  const size_t held_units = parameter_shards().size();
  MT_CHECK(shard_buffers.size() == held_units, "{} shard buffers for the {} units this stage holds",
           shard_buffers.size(), held_units);
  for (size_t u = 0; u < num_units(); ++u)
    if (holds(u)) unit(u).fill_shard(shard_buffers[static_cast<size_t>(shard_index_[u])], values);
}

std::string ParallelModel::memory_summary() const {
  int64_t shard_bytes = 0, largest_unit = 0;
  for (size_t u = 0; u < num_units(); ++u) {
    if (!holds(u)) continue;
    shard_bytes += static_cast<int64_t>(sizeof(float)) * unit(u).padded_numel() / fsdp_comm_.size();
    largest_unit = std::max(largest_unit, unit(u).padded_numel());
  }
  return fmt::format(
      "parameters {} + gradients {} + AdamW moments {} per device (fsdp={}, tensor={}{}{}); gathered during a "
      "step: {} ({})",
      megabytes(shard_bytes), megabytes(shard_bytes), megabytes(2 * shard_bytes), fsdp_comm_.size(),
      tensor_comm_.size(),
      pipeline_comm_.size() == 1 ? "" : fmt::format(", pipeline={}: stage {}'s units", pipeline_comm_.size(), stage_),
      expert_units_.empty() ? ""
                            : fmt::format(", expert={}: {} of the {} experts of each layer", expert_comm_.size(),
                                          model_->config().num_local_experts / expert_comm_.size(),
                                          model_->config().num_local_experts),
      fsdp_comm_.size() == 1 ? "none (the shards are the parameters)"
                             : megabytes(static_cast<int64_t>(sizeof(float)) * largest_unit) + " for the largest unit",
      fsdp_comm_.size() == 1        ? "no FSDP"
      : pipeline_comm_.size() > 1 ? "the stage's layers each gathered once per pass of its micro-batches and kept "
                                    "with their gradients until the pass ends"
      : resharding()              ? "one unit at a time: the embedding for the lookup, each layer (regathered for "
                                    "backward), the final norm and the head for the loss"
                                  : "every unit kept from forward to backward");
}

}  // namespace meshtrain::parallel
