// expert_parallel.cpp — the experts' split over `expert` and the token exchange around them.
// Shape suffixes: S routed slots sorted by expert, R rows received for the local experts, D hidden.
#include "meshtrain/parallel/expert_parallel.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/model/moe.hpp"

#include <algorithm>
#include <numeric>

namespace meshtrain::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int kExpertRowsTag = 0x457850;

// Where one layer's rows go and come from on this device, from the counts every device sent (step 1). The rows of
// x_SD are grouped by expert, so the rows for rank r are one block; the rows for this device's own experts (its
// "own" rows) never leave it. The rows received from the others arrive source by source, each source's expert by
// expert, into one buffer ("remote" rows) that by_expert regroups expert by expert.
struct ExchangePlan : torch::CustomClassHolder {
  std::vector<int64_t> send_offset, send_rows;        // per rank: this device's rows for its experts, in x_SD
  std::vector<int64_t> receive_offset, receive_rows;  // per rank: its rows for this device's experts, in the buffer
  int64_t remote_rows = 0;
  std::vector<int64_t> by_expert, back;  // buffer row of each regrouped row, and its inverse
  std::vector<int64_t> remote_per_expert;               // regrouped remote rows per local expert
  std::vector<int64_t> own_first, own_second;           // own rows per local expert, in two halves of the rows
  int64_t own_offset = 0, own_rows = 0, own_first_rows = 0;

  ExchangePlan(const std::vector<int64_t>& rows_E, const int64_t* from, int size, int me) {
    const int64_t local = static_cast<int64_t>(rows_E.size()) / size;
    send_offset.assign(size, 0), send_rows.assign(size, 0), receive_offset.assign(size, 0),
        receive_rows.assign(size, 0);
    int64_t sent = 0;
    for (int r = 0; r < size; ++r) {
      send_offset[r] = sent;
      for (int64_t j = 0; j < local; ++j) send_rows[r] += rows_E[r * local + j];
      sent += send_rows[r];
      if (r == me) continue;
      receive_offset[r] = remote_rows;
      for (int64_t j = 0; j < local; ++j) receive_rows[r] += from[r * local + j];
      remote_rows += receive_rows[r];
    }
    remote_per_expert.assign(local, 0);
    for (int64_t j = 0; j < local; ++j)
      for (int s = 0; s < size; ++s) {
        if (s == me) continue;
        int64_t start = receive_offset[s];
        for (int64_t i = 0; i < j; ++i) start += from[s * local + i];
        for (int64_t i = 0; i < from[s * local + j]; ++i) by_expert.push_back(start + i);
        remote_per_expert[j] += from[s * local + j];
      }
    back.resize(by_expert.size());
    for (size_t i = 0; i < by_expert.size(); ++i) back[by_expert[i]] = static_cast<int64_t>(i);
    own_offset = send_offset[me];
    own_rows = send_rows[me];
    own_first_rows = own_rows / 2;
    int64_t left = own_first_rows;
    for (int64_t j = 0; j < local; ++j) {
      const int64_t rows = rows_E[me * local + j], first = std::min(rows, left);
      own_first.push_back(first);
      own_second.push_back(rows - first);
      left -= first;
    }
  }

  // The exchange that carries rows (or their gradients) from the senders' side (`x_side`, laid out as x_SD) to the
  // experts' side (`buffer_side`, laid out as the remote buffer) when `to_experts`, else the way back.
  runtime::PendingCollective start(runtime::Comm& comm, const at::Tensor& x_side, const at::Tensor& buffer_side,
                                   bool to_experts, const std::string& what) const {
    std::vector<std::pair<int, at::Tensor>> sends, receives;
    for (int r = 0; r < comm.size(); ++r) {
      if (r == comm.rank()) continue;
      const at::Tensor x_block = x_side.narrow(0, send_offset[r], send_rows[r]);
      const at::Tensor buffer_block = buffer_side.narrow(0, receive_offset[r], receive_rows[r]);
      if (send_rows[r] > 0) (to_experts ? sends : receives).emplace_back(r, x_block);
      if (receive_rows[r] > 0) (to_experts ? receives : sends).emplace_back(r, buffer_block);
    }
    return comm.exchange_async(sends, receives, kExpertRowsTag, runtime::Collective::all_to_all, what);
  }
};

// Steps 2-4 of expert_parallel.hpp for one layer as one autograd node, the exchanges overlapped with the computation
// that does not wait for them: the own rows are computed in two halves, the first while the others' rows travel here,
// the second while their results travel back; backward the same with the gradients. Inputs: x_SD (rows_E[e] rows of
// expert e in turn, all experts), the plan and the local experts' weights (which get their gradients).
struct OverlappedExpertExchange : torch::autograd::Function<OverlappedExpertExchange> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in_SD, const c10::intrusive_ptr<ExchangePlan>& plan,
                            runtime::Comm* comm, at::TensorList weight_list) {
    const std::vector<at::Tensor> weights = weight_list.vec();
    const at::Tensor x_SD = x_in_SD.contiguous();
    const int64_t D = x_SD.size(1);
    const at::Tensor remote_RD = at::empty({plan->remote_rows, D}, x_SD.options());
    runtime::PendingCollective rows_in = plan->start(*comm, x_SD, remote_RD, true, "routed rows to their experts");
    at::Tensor y_SD = at::empty_like(x_SD);
    model::ExpertActivations first, remote, second;
    const at::Tensor own_SD = x_SD.narrow(0, plan->own_offset, plan->own_rows);
    own_part(weights, own_SD, y_SD, plan->own_offset, 0, plan->own_first, first);
    rows_in.wait();
    const at::Tensor y_remote_RD =
        model::experts_forward(weights, remote_RD.index_select(0, index(plan->by_expert)), plan->remote_per_expert,
                               &remote)
            .index_select(0, index(plan->back));
    runtime::PendingCollective rows_out = plan->start(*comm, y_SD, y_remote_RD, false, "expert outputs back");
    own_part(weights, own_SD, y_SD, plan->own_offset, plan->own_first_rows, plan->own_second, second);
    rows_out.wait();

    std::vector<at::Tensor> saved;
    for (const model::ExpertActivations* kept : {&first, &remote, &second})
      saved.insert(saved.end(), {kept->x_RD, kept->h1_RF, kept->h3_RF});
    saved.insert(saved.end(), weights.begin(), weights.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["plan"] = c10::IValue::make_capsule(plan);
    ctx->saved_data["comm"] = reinterpret_cast<intptr_t>(comm);
    return y_SD;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const auto plan = c10::static_intrusive_pointer_cast<ExchangePlan>(ctx->saved_data["plan"].toCapsule());
    auto* comm = reinterpret_cast<runtime::Comm*>(ctx->saved_data["comm"].toInt());
    const model::ExpertActivations first{saved[0], saved[1], saved[2], plan->own_first},
        remote{saved[3], saved[4], saved[5], plan->remote_per_expert},
        second{saved[6], saved[7], saved[8], plan->own_second};
    const std::vector<at::Tensor> weights(saved.begin() + 9, saved.end());
    std::vector<at::Tensor> weight_grads(weights.size());

    const at::Tensor grad_y_SD = grads[0].contiguous();
    const at::Tensor grad_remote_RD = at::empty({plan->remote_rows, grad_y_SD.size(1)}, grad_y_SD.options());
    runtime::PendingCollective grads_in =
        plan->start(*comm, grad_y_SD, grad_remote_RD, true, "gradients of expert outputs to their experts");
    at::Tensor grad_x_SD = at::empty_like(grad_y_SD);
    const int64_t own = plan->own_offset, split = plan->own_first_rows;
    grad_x_SD.narrow(0, own, split)
        .copy_(model::experts_backward(weights, first, grad_y_SD.narrow(0, own, split), weight_grads));
    grads_in.wait();
    const at::Tensor grad_x_remote_RD =
        model::experts_backward(weights, remote, grad_remote_RD.index_select(0, index(plan->by_expert)),
                                weight_grads)
            .index_select(0, index(plan->back));
    runtime::PendingCollective grads_out =
        plan->start(*comm, grad_x_SD, grad_x_remote_RD, false, "gradients of routed rows back");
    const int64_t rest = plan->own_rows - split;
    grad_x_SD.narrow(0, own + split, rest)
        .copy_(model::experts_backward(weights, second, grad_y_SD.narrow(0, own + split, rest), weight_grads));
    grads_out.wait();

    variable_list result{grad_x_SD, at::Tensor(), at::Tensor()};
    result.insert(result.end(), weight_grads.begin(), weight_grads.end());
    return result;
  }

 private:
  static int64_t sum(const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }
  static at::Tensor index(const std::vector<int64_t>& rows) { return at::tensor(rows, at::kLong); }
  // The own rows [begin, begin + sum(rows_per_expert)) of own_SD through the experts, into y_SD.
  static void own_part(const std::vector<at::Tensor>& weights, const at::Tensor& own_SD, at::Tensor& y_SD,
                       int64_t own_offset, int64_t begin, const std::vector<int64_t>& rows_per_expert,
                       model::ExpertActivations& kept) {
    const int64_t rows = sum(rows_per_expert);
    y_SD.narrow(0, own_offset + begin, rows)
        .copy_(model::experts_forward(weights, own_SD.narrow(0, begin, rows), rows_per_expert, &kept));
  }
};

// Steps 1-4 of expert_parallel.hpp for one layer: x_SD holds rows_E[e] rows of expert e in turn (all experts).
at::Tensor run_on_expert_devices(model::MixtralSparseMoe& moe, const at::Tensor& x_SD,
                                 const std::vector<int64_t>& rows_E, runtime::Comm& comm) {
  // Chunk r of the counts goes to rank r (the counts of its experts); chunk s of the answer came from rank s.
  const at::Tensor received_counts = comm.all_to_all(at::tensor(rows_E, at::kLong));
  auto plan = c10::make_intrusive<ExchangePlan>(rows_E, received_counts.data_ptr<int64_t>(), comm.size(), comm.rank());
  const std::vector<at::Tensor> weights = moe.expert_weights();
  return OverlappedExpertExchange::apply(x_SD, plan, &comm, at::TensorList(weights));  // a list: one input each
}

}  // namespace

int expert_holder(int64_t expert, int64_t num_experts, int expert_size) {
  return static_cast<int>(expert / (num_experts / expert_size));
}

namespace {
const std::string kExpertsMarker = ".block_sparse_moe.experts.";
}  // namespace

int64_t expert_of_parameter(const std::string& name) {
  const size_t at = name.find(kExpertsMarker);
  if (at == std::string::npos) return -1;
  return std::stoll(name.substr(at + kExpertsMarker.size()));
}

std::string with_expert_index(const std::string& name, int64_t expert) {
  const size_t at = name.find(kExpertsMarker);
  MT_CHECK(at != std::string::npos, "{} is not an expert's parameter", name);
  const size_t index_begin = at + kExpertsMarker.size(), index_end = name.find('.', index_begin);
  return name.substr(0, index_begin) + std::to_string(expert) + name.substr(index_end);
}

void check_expert_parallel(const config::LlamaConfig& config, int size) {
  if (size == 1) return;
  MT_USER_CHECK(config.is_moe(),
                "the mesh has expert={} but a dense Llama has no experts to place; pick a Mixtral (model=mixtral-tiny) "
                "or set ici_mesh.expert=1 and dcn_mesh.expert=1", size);
  MT_USER_CHECK(config.num_local_experts % size == 0,
                "expert parallelism over {} devices needs num_local_experts ({}) to be a multiple of {}", size,
                config.num_local_experts, size);
}

void distribute_experts(model::MixtralSparseMoe& moe, runtime::Comm& expert_comm) {
  const int64_t local = static_cast<int64_t>(moe.experts().size()) / expert_comm.size();
  moe.keep_experts(expert_comm.rank() * local, local);
  model::MixtralSparseMoe* block = &moe;
  runtime::Comm* comm = &expert_comm;
  moe.set_exchange([block, comm](const at::Tensor& x_SD, const std::vector<int64_t>& rows_E) {
    return run_on_expert_devices(*block, x_SD, rows_E, *comm);
  });
}

void apply_expert_parallel(model::LlamaForCausalLM& model, runtime::Comm& expert_comm) {
  if (expert_comm.size() == 1) return;
  check_expert_parallel(model.config(), expert_comm.size());
  for (const auto& layer : model.model->layers) distribute_experts(*layer->block_sparse_moe, expert_comm);
}

}  // namespace meshtrain::parallel
