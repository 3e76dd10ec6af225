// parallel_model.cpp — tensor parallelism + FSDP units + data-parallel gradient sync around a Llama model.
#include "meshtrain/parallel/parallel_model.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/model/fused_cross_entropy.hpp"

#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <utility>

namespace meshtrain::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Identity on a unit's input (a decoder layer's, the final norm's) whose backward runs once the unit's backward is
// done (every parameter gradient of the unit has been accumulated: AccumulateGrad nodes run first), so it hands
// them to the unit's reduce-scatter.
struct GradientBoundary : torch::autograd::Function<GradientBoundary> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, FsdpUnit* unit) {
    ctx->saved_data["unit"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(unit));
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* unit = reinterpret_cast<FsdpUnit*>(static_cast<intptr_t>(ctx->saved_data["unit"].toInt()));
    for (const FsdpUnit::Member& m : unit->members())
      MT_CHECK(m.param.grad().defined(), "FSDP unit {}: the gradient of {} was not ready when the unit's backward "
               "finished", unit->label(), m.name);
    unit->reduce_gradients_from_params();
    return {grads[0], at::Tensor()};
  }
};

// The training loss of the output head, the fused chunked cross-entropy (model/fused_cross_entropy.hpp) with its
// weight's gradient handled here: reduce-scattered as soon as the pass has made it, then the head's gathered weight
// and that V x D gradient are freed, so neither sits through the backward, which starts at the peak of the
// activations. Kept for backward: the hidden states' gradient and this device's shard of the weight's; backward
// scales both by the incoming gradient and adds the shard to the head unit's gradient shard.
struct HeadLoss : torch::autograd::Function<HeadLoss> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden_ND, const at::Tensor& targets_N,
                            FsdpUnit* head, int64_t chunk_rows) {
    model::CrossEntropyWithGradients pass =
        model::cross_entropy_with_gradients(hidden_ND, head->members().front().param, targets_N, chunk_rows);
    const at::Tensor weight_grad_shard = head->reduce_scatter({pass.grad_weight_VD});
    pass.grad_weight_VD = at::Tensor();
    head->free_full();
    ctx->saved_data["head"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(head));
    ctx->save_for_backward({pass.grad_hidden_ND, weight_grad_shard});
    return pass.loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* head = reinterpret_cast<FsdpUnit*>(static_cast<intptr_t>(ctx->saved_data["head"].toInt()));
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& grad_loss = grads[0];  // a scalar
    head->grad_shard().add_(saved[1], grad_loss.item<double>());
    return {saved[0] * grad_loss.to(saved[0].scalar_type()), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// A decoder layer that keeps only its input: forward runs without recording a graph; backward runs the layer's
// forward again with grad (its parameters gathered again by then: the hook on the output) and backpropagates
// through it, which accumulates the parameter gradients and gives the input's (PyTorch's reentrant checkpoint).
struct CheckpointedLayer : torch::autograd::Function<CheckpointedLayer> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_BTD, model::LlamaDecoderLayer* layer,
                            const at::Tensor& cos_TE, const at::Tensor& sin_TE) {
    ctx->saved_data["layer"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(layer));
    ctx->saved_data["cos"] = cos_TE;
    ctx->saved_data["sin"] = sin_TE;
    ctx->save_for_backward({x_BTD});
    return layer->forward(x_BTD, {cos_TE, sin_TE});
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto* layer = reinterpret_cast<model::LlamaDecoderLayer*>(static_cast<intptr_t>(ctx->saved_data["layer"].toInt()));
    const model::RopeTables rope{ctx->saved_data["cos"].toTensor(), ctx->saved_data["sin"].toTensor()};
    const at::Tensor x_BTD = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    at::Tensor y_BTD;
    {
      torch::AutoGradMode grad_mode(true);
      y_BTD = layer->forward(x_BTD, rope);
    }
    torch::autograd::backward({y_BTD}, {grads[0]});
    return {x_BTD.grad(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// The layout checks, run before any group is created: a device that failed while its peers were still connecting
// would leave them with a transport error instead of the reason.
std::shared_ptr<model::LlamaForCausalLM> checked_for_mesh(std::shared_ptr<model::LlamaForCausalLM> model,
                                                           const mesh::Mesh& mesh) {
  MT_USER_CHECK(mesh.size(mesh::Axis::expert) == 1,
                "the mesh has expert={} but Llama models have no experts to place; set ici_mesh.expert=1 and "
                "dcn_mesh.expert=1", mesh.size(mesh::Axis::expert));
  check_tensor_parallel(model->config(), mesh.size(mesh::Axis::tensor));
  return model;
}

std::string megabytes(int64_t bytes) { return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6); }

}  // namespace

int ParallelOptions::parse_checkpoint_every(const std::string& value) {
  if (value == "none") return 0;
  if (value == "full") return 1;
  const std::string prefix = "every_";
  int every = 0;
  if (value.compare(0, prefix.size(), prefix) == 0) {
    try {
      size_t used = 0;
      every = std::stoi(value.substr(prefix.size()), &used);
      if (used != value.size() - prefix.size()) every = 0;
    } catch (const std::exception&) {
      every = 0;
    }
  }
  MT_USER_CHECK(every >= 1, "activation_checkpointing={}: expected none, full or every_<k> (k >= 1, e.g. every_2)",
                value);
  return every;
}

ParallelModel::ParallelModel(std::shared_ptr<model::LlamaForCausalLM> model, runtime::DeviceContext& ctx,
                             ParallelOptions options, const model::SliceSource& values)
    : model_(checked_for_mesh(std::move(model), ctx.mesh())),
      ctx_(ctx),
      options_(options),
      fsdp_comm_(ctx.over(mesh::Axis::fsdp)),
      tensor_comm_(ctx.over(mesh::Axis::tensor)),
      data_comm_(ctx.over(mesh::Axis::data)) {
  apply_tensor_parallel(*model_, tensor_comm_);

  const int64_t num_layers = model_->config().num_hidden_layers;
  std::vector<FsdpUnit::Parameter> embedding_params, final_norm_params, lm_head_params;
  std::vector<std::vector<FsdpUnit::Parameter>> layer_params(num_layers);
  const std::string layer_prefix = "model.layers.";
  for (const auto& named : model_->named_parameters()) {
    const std::string& name = named.key();
    const TensorSplit split = tensor_split_of(name);
    const std::vector<int64_t> whole = whole_shape(named.value().sizes().vec(), split, tensor_comm_.size());
    FsdpUnit::Parameter p{name, named.value(),
                          tensor_block_slice(name, whole, split, tensor_comm_.rank(), tensor_comm_.size())};
    if (name.compare(0, layer_prefix.size(), layer_prefix) == 0)
      layer_params.at(std::stoll(name.substr(layer_prefix.size()))).push_back(std::move(p));
    else if (name == "model.embed_tokens.weight")
      embedding_params.push_back(std::move(p));
    else if (name == "model.norm.weight")
      final_norm_params.push_back(std::move(p));
    else
      lm_head_params.push_back(std::move(p));
  }
  auto make_unit = [&](const std::string& label, const std::vector<FsdpUnit::Parameter>& params) {
    return std::make_unique<FsdpUnit>(label, params, fsdp_comm_, values, options_.gather_dtype);
  };
  embedding_ = make_unit("embedding", embedding_params);
  for (int64_t i = 0; i < num_layers; ++i)
    layers_.push_back(make_unit(layer_prefix + std::to_string(i), layer_params[i]));
  final_norm_ = make_unit("final_norm", final_norm_params);
  if (!lm_head_params.empty()) lm_head_ = make_unit("lm_head", lm_head_params);
  MT_CHECK(head().members().size() == 1, "the head unit holds {} parameters, expected the head's weight alone",
           head().members().size());
  model_->set_layer_runner([this](int64_t index, model::LlamaDecoderLayer& layer, const torch::Tensor& x_BTD,
                                  const model::RopeTables& rope) { return run_layer(index, layer, x_BTD, rope); });
}

FsdpUnit& ParallelModel::head() { return lm_head_ ? *lm_head_ : *embedding_; }

bool ParallelModel::resharding() const { return options_.reshard_after_forward && fsdp_comm_.size() > 1; }

at::Tensor ParallelModel::run_layer(int64_t index, model::LlamaDecoderLayer& layer, const at::Tensor& x_BTD,
                                    const model::RopeTables& rope) {
  FsdpUnit& unit = *layers_[index];
  FsdpUnit* next = index + 1 < static_cast<int64_t>(layers_.size()) ? layers_[index + 1].get() : nullptr;
  FsdpUnit* previous = index > 0 ? layers_[index - 1].get() : nullptr;
  const at::Tensor input_BTD = GradientBoundary::apply(x_BTD, &unit);
  unit.gather();
  // The next unit's all-gather overlaps this layer's forward.
  if (next) {
    next->prefetch();
  } else {
    final_norm_->prefetch();
    head().prefetch();
  }
  const bool checkpointed = options_.checkpoint_every > 0 && index % options_.checkpoint_every == 0;
  at::Tensor y_BTD = checkpointed ? CheckpointedLayer::apply(input_BTD, &layer, rope.cos_TE, rope.sin_TE)
                                  : layer.forward(input_BTD, rope);
  if (resharding()) {
    unit.free_full();
    // Backward runs the layers in reverse: gather this one again, and start the one before it (an evaluation has
    // no backward).
    if (y_BTD.requires_grad())
      y_BTD.register_hook([&unit, previous](const at::Tensor&) {
        unit.gather();
        if (previous) previous->prefetch();
      });
  }
  return y_BTD;
}

at::Tensor ParallelModel::loss_sum(const at::Tensor& tokens_BT, const at::Tensor& targets_BT) {
  embedding_->gather();
  at::Tensor x_BTD = model_->embed(tokens_BT);
  if (resharding()) embedding_->free_full();  // the lookup's backward needs the token ids only
  x_BTD = GradientBoundary::apply(model_->run_layers(x_BTD), final_norm_.get());
  final_norm_->gather();
  const at::Tensor hidden_BTD = model_->final_norm(x_BTD);
  const at::Tensor hidden_ND = hidden_BTD.reshape({-1, hidden_BTD.size(-1)}), targets_N = targets_BT.reshape({-1});
  const int64_t chunk_rows = model::cross_entropy_chunk_rows(model_->config().vocab_size);
  FsdpUnit& head_unit = head();
  head_unit.gather();
  if (torch::GradMode::is_enabled() && hidden_ND.requires_grad())
    return HeadLoss::apply(hidden_ND, targets_N, &head_unit, chunk_rows);
  const at::Tensor loss = model::fused_cross_entropy_sum(hidden_ND, head_unit.members().front().param.detach(),
                                                         targets_N, chunk_rows);
  // No backward follows an evaluation to free what stayed gathered (every unit without resharding, the final norm).
  for (size_t u = 0; u < num_units(); ++u) unit(u).free_full();
  return loss;
}

void ParallelModel::finish_backward() { embedding_->reduce_gradients_from_params(); }

void ParallelModel::synchronize_gradients() {
  if (data_comm_.size() == 1) return;
  std::vector<at::Tensor> grads = gradient_shards();
  at::Tensor flat = at::cat(grads);
  data_comm_.allreduce_sum(flat);
  int64_t offset = 0;
  for (at::Tensor& g : grads) {
    g.copy_(flat.narrow(0, offset, g.numel()));
    offset += g.numel();
  }
}

double ParallelModel::gradient_norm() {
  double split_sum = 0, replicated_sum = 0;
  auto add = [&](const FsdpUnit& unit) {
    auto [split, replicated] = unit.grad_square_sums();
    split_sum += split;
    replicated_sum += replicated;
  };
  for (size_t u = 0; u < num_units(); ++u) add(unit(u));
  // Shards differ over fsdp; tensor blocks differ over tensor, replicated parameters do not; data holds replicas.
  at::Tensor sums = at::tensor({split_sum, replicated_sum}, at::kDouble);
  fsdp_comm_.allreduce_sum(sums);
  at::Tensor split = sums.narrow(0, 0, 1).clone();
  tensor_comm_.allreduce_sum(split);
  return std::sqrt(split.item<double>() + sums[1].item<double>());
}

void ParallelModel::zero_gradients() {
  for (at::Tensor& g : gradient_shards()) g.zero_();
}

const FsdpUnit& ParallelModel::unit(size_t u) const {
  if (u == 0) return *embedding_;
  if (u <= layers_.size()) return *layers_[u - 1];
  return u == layers_.size() + 1 ? *final_norm_ : *lm_head_;
}

FsdpUnit& ParallelModel::unit(size_t u) { return const_cast<FsdpUnit&>(std::as_const(*this).unit(u)); }

std::vector<at::Tensor> ParallelModel::parameter_shards() {
  std::vector<at::Tensor> shards;
  for (size_t u = 0; u < num_units(); ++u) shards.push_back(unit(u).shard());
  return shards;
}

std::vector<at::Tensor> ParallelModel::gradient_shards() {
  std::vector<at::Tensor> grads;
  for (size_t u = 0; u < num_units(); ++u) grads.push_back(unit(u).grad_shard());
  return grads;
}

std::vector<std::pair<std::string, std::vector<int64_t>>> ParallelModel::whole_parameter_shapes() const {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (size_t u = 0; u < num_units(); ++u)
    for (const FsdpUnit::Member& m : unit(u).members())
      shapes.emplace_back(m.name, m.block.full_shape);
  return shapes;
}

void ParallelModel::assemble_whole_tensors(
    const std::vector<at::Tensor>& shard_buffers, const std::function<int(size_t)>& owner,
    const std::function<void(size_t, const std::string&, const at::Tensor&)>& fn) {
  MT_CHECK(shard_buffers.size() == num_units(), "{} shard buffers for {} units", shard_buffers.size(), num_units());
  runtime::Comm& world = ctx_.world();
  const mesh::Mesh& mesh = ctx_.mesh();
  const std::vector<mesh::Axis> all_axes(mesh::kAllAxes.begin(), mesh::kAllAxes.end());
  const int fsdp_size = fsdp_comm_.size(), tensor_size = tensor_comm_.size();
  // The world rank of the device of data replica 0 at (fsdp f, tensor t): it holds shard f of tensor block t.
  mesh::Coords coords = ctx_.info().coords;
  for (mesh::Axis a : {mesh::Axis::data, mesh::Axis::expert}) coords[static_cast<int>(a)] = 0;
  auto holder = [&](int f, int t) {
    mesh::Coords c = coords;
    c[static_cast<int>(mesh::Axis::fsdp)] = f;
    c[static_cast<int>(mesh::Axis::tensor)] = t;
    return mesh.index_along(mesh.device_at(c), all_axes);
  };
  const int me = world.rank();

  size_t index = 0;
  for (size_t u = 0; u < shard_buffers.size(); ++u) {
    const FsdpUnit& this_unit = unit(u);
    const int64_t shard_numel = this_unit.padded_numel() / fsdp_size;
    MT_CHECK(shard_buffers[u].numel() == shard_numel, "unit {}: a shard buffer of {} elements, expected {}",
             this_unit.label(), shard_buffers[u].numel(), shard_numel);
    for (const FsdpUnit::Member& m : this_unit.members()) {
      const int dest = owner(index);
      // The piece of this member in shard f of tensor block t.
      auto piece = [&](int f, int t) {
        return this_unit.piece_in_shard(m, f, tensor_block_slice(m.name, m.block.full_shape, m.split, t, tensor_size));
      };
      std::vector<std::pair<int, at::Tensor>> sends, receives;
      std::vector<std::pair<model::ParameterSlice, at::Tensor>> pieces;  // on the owner
      for (int f = 0; f < fsdp_size; ++f)
        for (int t = 0; t < tensor_size; ++t) {
          const auto p = piece(f, t);
          if (!p) continue;
          const int source = holder(f, t);
          if (source == me) {
            const at::Tensor mine = shard_buffers[u].narrow(0, p->offset_in_shard, p->slice.numel()).contiguous();
            if (dest == me)
              pieces.emplace_back(p->slice, mine);
            else
              sends.emplace_back(dest, mine);
          } else if (dest == me) {
            at::Tensor buffer = at::empty({p->slice.numel()}, at::kFloat);
            receives.emplace_back(source, buffer);
            pieces.emplace_back(p->slice, buffer);
          }
        }
      if (!sends.empty() || !receives.empty()) world.exchange(sends, receives, static_cast<int>(index));
      if (dest == me) {
        at::Tensor whole = at::empty(m.block.full_shape, at::kFloat);
        at::Tensor whole_flat = whole.view({-1});
        for (const auto& [slice, values] : pieces)
          slice.for_each_run([&, &values = values](int64_t whole_index, int64_t count, int64_t offset) {
            whole_flat.narrow(0, whole_index, count).copy_(values.narrow(0, offset, count));
          });
        fn(index, m.name, whole);
      }
      ++index;
    }
  }
}

void ParallelModel::load_shards(std::vector<at::Tensor>& shard_buffers, const model::SliceSource& values) {
  MT_CHECK(shard_buffers.size() == num_units(), "{} shard buffers for {} units", shard_buffers.size(), num_units());
  for (size_t u = 0; u < num_units(); ++u) unit(u).fill_shard(shard_buffers[u], values);
}

std::string ParallelModel::memory_summary() const {
  int64_t shard_bytes = 0, largest_unit = 0;
  for (size_t u = 0; u < num_units(); ++u) {
    shard_bytes += static_cast<int64_t>(sizeof(float)) * unit(u).padded_numel() / fsdp_comm_.size();
    largest_unit = std::max(largest_unit, unit(u).padded_numel());
  }
  return fmt::format(
      "parameters {} + gradients {} + AdamW moments {} per device (fsdp={}, tensor={}); gathered during a step: "
      "{} ({})",
      megabytes(shard_bytes), megabytes(shard_bytes), megabytes(2 * shard_bytes), fsdp_comm_.size(),
      tensor_comm_.size(),
      fsdp_comm_.size() == 1 ? "none (the shards are the parameters)"
                             : megabytes(static_cast<int64_t>(sizeof(float)) * largest_unit) + " for the largest unit",
      fsdp_comm_.size() == 1 ? "no FSDP"
      : resharding()         ? "one unit at a time: the embedding for the lookup, each layer (regathered for "
                               "backward), the final norm and the head for the loss"
                             : "every unit kept from forward to backward");
}

}  // namespace meshtrain::parallel
