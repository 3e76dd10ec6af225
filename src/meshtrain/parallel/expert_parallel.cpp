// expert_parallel.cpp — the experts' split over `expert` and the token exchange around them.
// Shape suffixes: S routed slots sorted by expert, R rows received for the local experts, D hidden.
#include "meshtrain/parallel/expert_parallel.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/model/moe.hpp"
#include "meshtrain/parallel/autograd_collectives.hpp"

#include <numeric>

namespace meshtrain::parallel {
namespace {

// Steps 1-4 of expert_parallel.hpp for one layer: x_SD holds rows_E[e] rows of expert e in turn (all experts).
at::Tensor run_on_expert_devices(model::MixtralSparseMoe& moe, const at::Tensor& x_SD,
                                 const std::vector<int64_t>& rows_E, runtime::Comm& comm) {
  const int size = comm.size();
  const int64_t E = static_cast<int64_t>(rows_E.size()), local = E / size;
  // Chunk r of the counts goes to rank r (the counts of its experts); chunk s of the answer came from rank s.
  const at::Tensor received_counts = comm.all_to_all(at::tensor(rows_E, at::kLong));
  const int64_t* from = received_counts.data_ptr<int64_t>();  // from[s * local + j]: rank s's rows for local expert j
  std::vector<int64_t> send_rows(size, 0), receive_rows(size, 0);
  for (int r = 0; r < size; ++r)
    for (int64_t j = 0; j < local; ++j) {
      send_rows[r] += rows_E[r * local + j];
      receive_rows[r] += from[r * local + j];
    }
  const at::Tensor received_RD = all_to_all_rows(x_SD, send_rows, receive_rows, comm);

  // The received rows come source by source, each source's expert by expert: regroup them expert by expert.
  std::vector<int64_t> block_start(size * local);
  int64_t offset = 0;
  for (int s = 0; s < size; ++s)
    for (int64_t j = 0; j < local; ++j) {
      block_start[s * local + j] = offset;
      offset += from[s * local + j];
    }
  std::vector<int64_t> by_expert, rows_per_local_expert(local, 0);
  by_expert.reserve(offset);
  for (int64_t j = 0; j < local; ++j)
    for (int s = 0; s < size; ++s) {
      const int64_t start = block_start[s * local + j], count = from[s * local + j];
      for (int64_t i = 0; i < count; ++i) by_expert.push_back(start + i);
      rows_per_local_expert[j] += count;
    }
  std::vector<int64_t> back(by_expert.size());
  for (size_t i = 0; i < by_expert.size(); ++i) back[by_expert[i]] = static_cast<int64_t>(i);
  const at::Tensor y_RD = moe.run_local_experts(received_RD.index_select(0, at::tensor(by_expert, at::kLong)),
                                                rows_per_local_expert);
  return all_to_all_rows(y_RD.index_select(0, at::tensor(back, at::kLong)), receive_rows, send_rows, comm);
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

void apply_expert_parallel(model::LlamaForCausalLM& model, runtime::Comm& expert_comm) {
  const config::LlamaConfig& config = model.config();
  const int size = expert_comm.size();
  if (size == 1) return;
  check_expert_parallel(config, size);
  const int64_t local = config.num_local_experts / size;
  runtime::Comm* comm = &expert_comm;
  for (const auto& layer : model.model->layers) {
    model::MixtralSparseMoe* moe = layer->block_sparse_moe.get();
    moe->keep_experts(expert_comm.rank() * local, local);
    moe->set_exchange([moe, comm](const at::Tensor& x_SD, const std::vector<int64_t>& rows_E) {
      return run_on_expert_devices(*moe, x_SD, rows_E, *comm);
    });
  }
}

}  // namespace meshtrain::parallel
