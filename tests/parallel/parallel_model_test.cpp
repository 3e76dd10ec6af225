// parallel_model_test.cpp — the parallel model against the single-device model on simulated meshes (one thread per
// device, real Gloo groups): same loss, same full gradient, same gradient norm, for FSDP (resharded after forward
// or kept), data parallel, the hybrid, tensor parallel and their combinations, and a Mixtral's expert parallelism
// with each of them (its loss with the load-balancing loss's gradient), context parallelism (each device holding two
// chunks of every row, documents kept apart or not) alone and with each of them; and the checkpoint helpers (full
// tensors out, shards back in on another mesh, experts included).
#include "meshtrain/common/error.hpp"
#include "meshtrain/mesh/mesh_roles.hpp"
#include "meshtrain/model/parameter_init.hpp"
#include "meshtrain/parallel/parallel_model.hpp"
#include "meshtrain/sharding/spec.hpp"

#include "simulated_devices.hpp"
#include "tiny_llama.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <mutex>

namespace meshtrain::parallel {
namespace {

using mesh::Axis;
using testing::axis_sizes;
using testing::expect_no_failures;
using testing::run_on_all_devices;
using testing::tiny_llama_config;

constexpr int64_t kRows = 8, kSeq = 16;

constexpr uint64_t kSeed = 7;

// The whole model, initialized on one device.
std::shared_ptr<model::LlamaForCausalLM> fresh_model(bool tied = false, bool moe = false, int64_t vocab_size = 40,
                                                     int64_t layers = 2) {
  auto m = std::make_shared<model::LlamaForCausalLM>(tiny_llama_config(tied, moe, vocab_size, layers));
  model::initialize_parameters(*m, kSeed);
  return m;
}

// A device's model on a mesh: built unwritten, each device initializing only its pieces.
ParallelModel sharded_model(runtime::DeviceContext& ctx, ParallelOptions options = {}, bool tied = false,
                            bool moe = false, int64_t vocab_size = 40, int64_t layers = 2) {
  const config::LlamaConfig config = tiny_llama_config(tied, moe, vocab_size, layers);
  return ParallelModel(std::make_shared<model::LlamaForCausalLM>(config), ctx, options,
                       model::initial_value_source(config, kSeed));
}

// Puts the parts assemble_whole_tensors() hands over into whole tensors in `whole` (under `mutex`), checking that
// each tensor's parts come in order and tile it.
ParallelModel::WholeTensorPart into_whole_tensors(const ParallelModel& pm, std::map<std::string, at::Tensor>& whole,
                                                  std::mutex& mutex) {
  return [&pm, &whole, &mutex](size_t index, const std::string& name, const at::Tensor& part, int64_t first) {
    std::lock_guard<std::mutex> lock(mutex);
    at::Tensor& tensor = whole[name];
    if (!tensor.defined()) tensor = at::full(pm.whole_parameter_shapes().at(index).second, NAN, at::kFloat);
    at::Tensor flat = tensor.view({-1});
    ASSERT_TRUE(first == 0 || !std::isnan(flat[first - 1].item<float>())) << name << ": a part before its predecessor";
    flat.narrow(0, first, part.numel()).copy_(part);
  };
}

// Every whole tensor of `shard_buffers`, assembled on device 0 (empty on the others) in parts of `part_elements`.
// Ends with a barrier over the world: a device that ended its test (closing its connections) while peers still
// exchanged pieces over the world group would fail their transfers.
std::map<std::string, at::Tensor> whole_tensors_on_device_0(
    runtime::DeviceContext& ctx, ParallelModel& pm, const std::vector<at::Tensor>& shard_buffers,
    int64_t part_elements = ParallelModel::kAssemblePartElements) {
  std::map<std::string, at::Tensor> whole;
  std::mutex mutex;
  pm.assemble_whole_tensors(shard_buffers, [](size_t) { return 0; }, into_whole_tensors(pm, whole, mutex),
                            part_elements);
  ctx.world().barrier();
  return whole;
}

// The same global batch [kRows, kSeq + 1] on every call.
at::Tensor tokens_BT() {
  return at::randint(0, 40, {kRows, kSeq + 1}, at::detail::createCPUGenerator(3), at::TensorOptions().dtype(at::kLong));
}

// Document numbers [kRows, kSeq] for the global batch: row r packs documents that start at (r + 1) % 5 and then
// every 5 + r tokens (some start inside a context chunk, some at a chunk's first token).
at::Tensor documents_BT() {
  at::Tensor documents = at::zeros({kRows, kSeq}, at::kLong);
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t t = 1; t < kSeq; ++t)
      documents[r][t] = documents[r][t - 1].item<int64_t>() + ((t - (r + 1) % 5) % (5 + r) == 0 ? 1 : 0);
  return documents;
}

// Sum of token cross entropies of `rows` over the whole batch's token count: summed over every device holding
// distinct rows, the gradient of the global mean.
at::Tensor scaled_loss(const at::Tensor& logits_BTV, const at::Tensor& targets_BT, double replicas) {
  const at::Tensor sum = torch::nn::functional::cross_entropy(
      logits_BTV.reshape({-1, logits_BTV.size(-1)}), targets_BT.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  return sum / static_cast<double>(kRows * kSeq) / replicas;
}

struct Reference {
  double loss = 0;
  double grad_norm = 0;
  std::map<std::string, at::Tensor> grads;
};

// The single-device loss and gradients (a Mixtral's with its load-balancing loss's, as Hugging Face trains it),
// with the documents of documents_BT() kept apart if `documents`.
Reference single_device_reference(bool tied, bool moe, int64_t vocab_size, bool documents, int64_t layers) {
  auto m = fresh_model(tied, moe, vocab_size, layers);
  const at::Tensor t = tokens_BT();
  at::Tensor loss =
      documents ? m->loss_sum(t.narrow(1, 0, kSeq), t.narrow(1, 1, kSeq), documents_BT()) / double(kRows * kSeq)
                : scaled_loss(m->forward(t.narrow(1, 0, kSeq)), t.narrow(1, 1, kSeq), 1);
  loss.backward();
  Reference ref;
  ref.loss = loss.item<double>();
  double sq = 0;
  for (const auto& p : m->named_parameters()) {
    ref.grads[p.key()] = p.value().grad().clone();
    sq += p.value().grad().pow(2).sum().item<double>();
  }
  ref.grad_norm = std::sqrt(sq);
  return ref;
}

// One step of the parallel model on `mesh` (batch rows over (data, fsdp, expert), each row's tokens over context in
// its load-balanced chunks, the layers over pipeline in `pipeline`'s stages and schedule) in `passes` forward and
// backward passes (gradient accumulation); checks loss, every full gradient and the norm against the single-device
// run.
void expect_parity(const mesh::Mesh& mesh, bool reshard, bool tied = false, bool moe = false,
                   int checkpoint_every = 0, int64_t vocab_size = 40, bool documents = false, int64_t layers = 2,
                   const settings::PipelineSettings& pipeline = {}, int64_t passes = 1) {
  const Reference ref = single_device_reference(tied, moe, vocab_size, documents, layers);
  std::mutex mutex;
  expect_no_failures(run_on_all_devices(mesh, [&](runtime::DeviceContext& ctx) {
    ParallelOptions options;
    options.reshard_after_forward = reshard;
    options.checkpoint_every = checkpoint_every;
    options.pipeline = pipeline;
    options.block_size = kSeq;
    ParallelModel pm = sharded_model(ctx, options, tied, moe, vocab_size, layers);
    const std::vector<Axis> batch_axes{Axis::data, Axis::fsdp, Axis::expert};
    const int parts = mesh.size_along(batch_axes), part = mesh.index_along(ctx.device(), batch_axes);
    const at::Tensor rows = tokens_BT().chunk(parts, 0)[part];
    std::vector<at::Tensor> chunks;  // this device's positions of each row
    for (const mesh::TokenRange& chunk : mesh::MeshRoles::context_chunks(
             kSeq, mesh.size(Axis::context), mesh.index_along(ctx.device(), {Axis::context})))
      chunks.push_back(at::arange(chunk.begin, chunk.end, at::kLong));
    const at::Tensor positions = at::cat(chunks);
    const at::Tensor inputs = rows.narrow(1, 0, kSeq).index_select(1, positions),
                     targets = rows.narrow(1, 1, kSeq).index_select(1, positions);
    const at::Tensor row_documents =
        documents ? documents_BT().chunk(parts, 0)[part].index_select(1, positions) : at::Tensor();
    double loss_sum = 0;
    for (int64_t k = 0; k < passes; ++k)
      loss_sum += pm.forward_backward(inputs.chunk(passes, 0)[k], targets.chunk(passes, 0)[k],
                                      row_documents.defined() ? row_documents.chunk(passes, 0)[k] : at::Tensor(),
                                      1.0 / static_cast<double>(kRows * kSeq));
    pm.synchronize_gradients();
    at::Tensor global_loss = at::tensor({loss_sum / static_cast<double>(kRows * kSeq)}, at::kDouble);
    pm.loss_comm().allreduce_sum(global_loss);
    const double norm = pm.gradient_norm();
    std::map<std::string, at::Tensor> grads = whole_tensors_on_device_0(ctx, pm, pm.gradient_shards());
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_NEAR(global_loss.item<double>(), ref.loss, 1e-5) << "device " << ctx.device();
    EXPECT_NEAR(norm, ref.grad_norm, 1e-5 * ref.grad_norm) << "device " << ctx.device();
    if (ctx.device() != 0) {
      EXPECT_TRUE(grads.empty()) << "device " << ctx.device();
      return;
    }
    ASSERT_EQ(grads.size(), ref.grads.size());
    for (const auto& [name, g] : ref.grads) {
      ASSERT_TRUE(grads.count(name)) << name;
      EXPECT_TRUE(at::allclose(grads[name], g, 1e-4, 1e-6))
          << name << " on device " << ctx.device() << ": max diff " << (grads[name] - g).abs().max().item<double>();
    }
  }));
}

mesh::Mesh ici(int data, int fsdp, int tensor, int hosts = 1, int expert = 1, int context = 1, int pipeline = 1) {
  const int devices = data * fsdp * tensor * expert * context * pipeline;
  return mesh::Mesh::create(axis_sizes(data, fsdp, tensor, expert, context, pipeline), axis_sizes(1, 1, 1, 1), hosts,
                            devices / hosts);
}

settings::PipelineSettings pipeline_of(settings::PipelineSchedule schedule, int64_t microbatches,
                                       std::vector<int64_t> layers_per_stage = {}, int virtual_stages = 1) {
  settings::PipelineSettings p;
  p.schedule = schedule;
  p.microbatches = microbatches;
  p.layers_per_stage = std::move(layers_per_stage);
  p.virtual_stages = virtual_stages;
  return p;
}
constexpr auto kGpipe = settings::PipelineSchedule::gpipe;
constexpr auto k1f1b = settings::PipelineSchedule::one_f_one_b;

// Pipeline parallelism: loss, gradients and norm of one device (the parity above), each stage holding its layers.
TEST(ParallelModelTest, PipelineGpipeMatchesOneDevice) {
  expect_parity(ici(1, 1, 1, 1, 1, 1, 2), true, false, false, 0, 40, false, 4, pipeline_of(kGpipe, 4));
}
TEST(ParallelModelTest, Pipeline1f1bMatchesOneDevice) {
  expect_parity(ici(1, 1, 1, 2, 1, 1, 2), true, false, false, 0, 40, true, 4, pipeline_of(k1f1b, 0));
}
TEST(ParallelModelTest, PipelineOfFourStagesMatchesOneDevice) {
  expect_parity(ici(1, 1, 1, 2, 1, 1, 4), true, false, false, 0, 40, false, 5, pipeline_of(k1f1b, 4, {2, 1, 1, 1}));
}
TEST(ParallelModelTest, PipelineOverDcnWithFsdpInsideMatchesOneDevice) {
  expect_parity(mesh::Mesh::create(axis_sizes(1, 2, 1, 1), axis_sizes(1, 1, 1, 1, 1, 2), 2, 2), true, false, false,
                0, 40, false, 4, pipeline_of(k1f1b, 2));
}
TEST(ParallelModelTest, PipelineWithFsdpKeptAndGpipeMatchesOneDevice) {
  // Without resharding, GPipe's backwards follow each other: each gathers its units again.
  expect_parity(ici(1, 2, 1, 1, 1, 1, 2), false, false, false, 0, 40, false, 4, pipeline_of(kGpipe, 2));
}
TEST(ParallelModelTest, PipelineWithTensorMatchesOneDevice) {
  expect_parity(ici(1, 1, 2, 1, 1, 1, 2), true, false, false, 0, 40, false, 4, pipeline_of(k1f1b, 2));
}
TEST(ParallelModelTest, PipelineWithDataAccumulationAndCheckpointingMatchesOneDevice) {
  expect_parity(ici(2, 1, 1, 2, 1, 1, 2), true, false, false, 1, 40, false, 4, pipeline_of(k1f1b, 2), 2);
}
TEST(ParallelModelTest, PipelineWithContextMatchesOneDevice) {
  expect_parity(ici(1, 1, 1, 2, 1, 2, 2), true, false, false, 0, 40, true, 4, pipeline_of(k1f1b, 4));
}

TEST(ParallelModelTest, PipelineInterleavedOverVirtualStagesMatchesOneDevice) {
  // 2 ranks x 2 virtual stages of 1 layer; then 3 virtual stages with fsdp inside and GPipe, over 2 simulated hosts.
  expect_parity(ici(1, 1, 1, 1, 1, 1, 2), true, false, false, 0, 40, false, 4, pipeline_of(k1f1b, 4, {}, 2));
  expect_parity(ici(1, 2, 1, 2, 1, 1, 2), true, false, false, 0, 40, true, 6, pipeline_of(kGpipe, 2, {}, 3));
  expect_parity(ici(1, 2, 1, 2, 1, 1, 2), false, false, false, 1, 40, false, 5, pipeline_of(k1f1b, 2, {1, 1, 2, 1}, 2),
                2);
}

TEST(ParallelModelTest, PipelineTransfersAreCountedAndNamedInTheFlightRecorder) {
  // 2 stages, 2 micro-batches of 4 rows x 16 tokens x 32 hidden (fp32): stage 0 sends activations, stage 1 their
  // gradients, each 2 x 2 KB; the recorder says which micro-batch went to or came from which stage.
  std::mutex mutex;
  expect_no_failures(run_on_all_devices(ici(1, 1, 1, 2, 1, 1, 2), [&](runtime::DeviceContext& ctx) {
    ParallelOptions options;
    options.pipeline = pipeline_of(k1f1b, 2);
    options.block_size = kSeq;
    ParallelModel pm = sharded_model(ctx, options, false, false, 40, 4);
    const at::Tensor t = tokens_BT();
    pm.forward_backward(t.narrow(1, 0, kSeq), t.narrow(1, 1, kSeq), {}, 1.0);
    const runtime::CollectiveCounters& counters = ctx.counters();
    std::string recent;
    for (const std::string& line : counters.recent_lines()) recent += line + "\n";
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_EQ(counters.bytes(runtime::Collective::stage_transfer), 2 * (kRows / 2) * kSeq * 32 * 4) << recent;
    EXPECT_NE(recent.find(pm.stage() == 0 ? "pipeline: activations of micro-batch 1 to stage 1"
                                          : "pipeline: activation gradients of micro-batch 1 to stage 0"),
              std::string::npos)
        << recent;
    EXPECT_NE(recent.find(pm.stage() == 0 ? "pipeline: activation gradients of micro-batch 1 from stage 1"
                                          : "pipeline: activations of micro-batch 1 from stage 0"),
              std::string::npos)
        << recent;
  }));
}

TEST(ParallelModelTest, PipelineRefusesTiedEmbeddingsAndMixtral) {
  for (bool moe : {false, true}) {
    const std::vector<std::string> failures = run_on_all_devices(ici(1, 1, 1, 1, 1, 1, 2), [&](runtime::DeviceContext& ctx) {
      sharded_model(ctx, {}, !moe, moe);
    });
    for (const std::string& failure : failures)
      EXPECT_NE(failure.find(moe ? "model.num_local_experts" : "model.tie_word_embeddings=true"), std::string::npos)
          << failure;
  }
}


TEST(ParallelModelTest, OneDeviceMatchesTheModelWithoutCommunication) {
  const mesh::Mesh mesh = ici(1, 1, 1);
  expect_parity(mesh, true);
  runtime::DeviceContext ctx = runtime::make_single_device_context(mesh);
  ParallelModel pm = sharded_model(ctx);
  pm.loss_sum(tokens_BT().narrow(1, 0, kSeq), tokens_BT().narrow(1, 1, kSeq)).backward();
  pm.finish_backward();
  pm.synchronize_gradients();
  EXPECT_EQ(ctx.counters().total_bytes(), 0) << ctx.counters().summary();
}

TEST(ParallelModelTest, FsdpReshardedAfterForwardMatchesOneDevice) { expect_parity(ici(1, 4, 1, 2), true); }
TEST(ParallelModelTest, FsdpKeptFromForwardToBackwardMatchesOneDevice) { expect_parity(ici(1, 2, 1), false); }
TEST(ParallelModelTest, FsdpWithTiedEmbeddingsMatchesOneDevice) { expect_parity(ici(1, 4, 1), true, true); }
TEST(ParallelModelTest, FsdpHeadTakenAPieceAtATimeMatchesOneDevice) {
  // 70000 x 32 elements: each device's shard of the head (17500 rows) comes in two pieces (16384 and 1116 rows of
  // every shard) through the online softmax; tied and untied.
  expect_parity(ici(1, 4, 1), true, false, false, 0, 70000);
  expect_parity(ici(1, 4, 1), true, true, false, 0, 70000);
  // 24 tokens per device against hidden size 32: by pieces; 96 tokens: the logits' gradient would be larger.
  expect_no_failures(run_on_all_devices(ici(1, 4, 1), [](runtime::DeviceContext& ctx) {
    ParallelModel pm = sharded_model(ctx, {}, false, false, 70000);
    EXPECT_TRUE(pm.head_by_pieces(24));
    EXPECT_FALSE(pm.head_by_pieces(96));
  }));
}
TEST(ParallelModelTest, FsdpTableRowsAcrossShardsMatchesOneDevice) {
  // 42 x 32 elements over 4 shards of 336: rows cut between shards, so the lookup gathers the table (elsewhere each
  // device looks up its shard's rows, ParallelModel::rows_by_shard); tied and untied.
  expect_parity(ici(1, 4, 1), true, false, false, 0, 42);
  expect_parity(ici(1, 4, 1), true, true, false, 0, 42);
}
TEST(ParallelModelTest, DataParallelMatchesOneDevice) { expect_parity(ici(2, 1, 1), true); }
TEST(ParallelModelTest, HybridDataAndFsdpMatchesOneDevice) { expect_parity(ici(2, 2, 1, 2), true); }
TEST(ParallelModelTest, TensorParallelMatchesOneDevice) { expect_parity(ici(1, 1, 2), true); }
TEST(ParallelModelTest, FsdpWithTensorParallelMatchesOneDevice) { expect_parity(ici(1, 2, 2, 2), true); }
TEST(ParallelModelTest, TiedEmbeddingsUnderFsdpAndTensorMatchOneDevice) { expect_parity(ici(1, 2, 2), true, true); }

TEST(ParallelModelTest, ContextParallelMatchesOneDevice) {
  expect_parity(ici(1, 1, 1, 1, 1, 2), true);
  expect_parity(ici(1, 1, 1, 2, 1, 4), true);
}
TEST(ParallelModelTest, ContextParallelWithDocumentsMatchesOneDevice) {
  expect_parity(ici(1, 1, 1, 1, 1, 1), true, false, false, 0, 40, true);
  expect_parity(ici(1, 1, 1, 1, 1, 2), true, false, false, 0, 40, true);
  expect_parity(ici(1, 1, 1, 2, 1, 4), true, false, false, 0, 40, true);
}
TEST(ParallelModelTest, ContextWithFsdpAndCheckpointingMatchesOneDevice) {
  expect_parity(ici(1, 2, 1, 2, 1, 2), true, false, false, 1, 40, true);
  expect_parity(ici(1, 2, 1, 1, 1, 2), false, true);
}
TEST(ParallelModelTest, ContextWithDataAndTensorMatchesOneDevice) {
  expect_parity(ici(2, 1, 1, 2, 1, 2), true, false, false, 0, 40, true);
  expect_parity(ici(1, 1, 2, 1, 1, 2), true);
}
TEST(ParallelModelTest, ContextOverDcnWithFsdpMatchesOneDevice) {
  expect_parity(mesh::Mesh::create(axis_sizes(1, 2, 1, 1), axis_sizes(1, 1, 1, 1, 2), 2, 2), true, false, false, 0,
                40, true);
}
TEST(ParallelModelTest, ContextWithExpertMatchesOneDevice) { expect_parity(ici(1, 1, 1, 2, 2, 2), true, false, true); }

TEST(ParallelModelTest, MultiSliceFsdpMatchesOneDevice) {
  expect_parity(mesh::Mesh::create(axis_sizes(1, 2, 1, 1), axis_sizes(1, 2, 1, 1), 2, 2), true);
}

TEST(ParallelModelTest, FsdpShardsShrinkWithTheDegree) {
  std::map<int, int64_t> shard_elements;
  std::mutex mutex;
  for (int fsdp : {1, 2, 4}) {
    expect_no_failures(run_on_all_devices(ici(1, fsdp, 1), [&](runtime::DeviceContext& ctx) {
      ParallelModel pm = sharded_model(ctx);
      int64_t n = 0;
      for (const at::Tensor& s : pm.parameter_shards()) n += s.numel();
      // No device may tear its fsdp group down while a peer is still connecting to it.
      ctx.over(Axis::fsdp).barrier();
      std::lock_guard<std::mutex> lock(mutex);
      shard_elements[fsdp] = n;
    }));
  }
  const int64_t total = tiny_llama_config().parameter_count();
  EXPECT_EQ(shard_elements[1], total);
  EXPECT_LE(shard_elements[2], total / 2 + 8);
  EXPECT_LE(shard_elements[4], total / 4 + 16);
}

// The whole tensors of a model sharded on `mesh` (every shard times 1.5, so they differ from a fresh init), assembled
// on device 0; checked against the whole model initialized on one device.
std::map<std::string, at::Tensor> perturbed_whole_tensors(const mesh::Mesh& mesh, bool moe, int64_t layers = 2) {
  std::map<std::string, at::Tensor> saved;
  std::mutex mutex;
  expect_no_failures(run_on_all_devices(mesh, [&](runtime::DeviceContext& ctx) {
    ParallelModel pm = sharded_model(ctx, {}, false, moe, 40, layers);
    for (at::Tensor& s : pm.parameter_shards()) s.mul_(1.5);
    // Parts of 7 elements: most cut a tensor-parallel block's rows in the middle.
    std::map<std::string, at::Tensor> whole = whole_tensors_on_device_0(ctx, pm, pm.parameter_shards(), 7);
    std::lock_guard<std::mutex> lock(mutex);
    if (ctx.device() == 0) saved = whole;
  }));
  auto expected = fresh_model(false, moe, 40, layers);
  EXPECT_EQ(saved.size(), expected->named_parameters().size());
  for (const auto& p : expected->named_parameters()) {
    EXPECT_TRUE(saved.count(p.key()) && at::allclose(saved[p.key()], p.value() * 1.5)) << p.key();
  }
  return saved;
}

// `saved` loaded as shards on a 4-device `mesh` and assembled again, tensor i on device i mod 4; each device's
// point-to-point bytes in `sent_bytes`.
std::map<std::string, at::Tensor> reassembled_on(const mesh::Mesh& mesh, const std::map<std::string, at::Tensor>& saved,
                                                 bool moe, std::vector<int64_t>& sent_bytes, int64_t layers = 2) {
  std::map<std::string, at::Tensor> reassembled;
  std::mutex mutex;
  sent_bytes.assign(mesh.num_devices(), 0);
  expect_no_failures(run_on_all_devices(mesh, [&](runtime::DeviceContext& ctx) {
    ParallelModel pm = sharded_model(ctx, {}, false, moe, 40, layers);
    std::vector<at::Tensor> shards = pm.parameter_shards();
    pm.load_shards(shards, model::slices_of_whole_tensors([&](const std::string& name) { return saved.at(name); }));
    pm.assemble_whole_tensors(pm.parameter_shards(), [](size_t i) { return static_cast<int>(i % 4); },
                              into_whole_tensors(pm, reassembled, mutex), 7);
    sent_bytes[ctx.device()] = ctx.counters().bytes(runtime::Collective::point_to_point);
    ctx.world().barrier();  // as in whole_tensors_on_device_0
  }));
  EXPECT_EQ(reassembled.size(), saved.size());
  for (const auto& [name, whole] : saved)
    EXPECT_TRUE(reassembled.count(name) && at::equal(reassembled.at(name), whole)) << name;
  return reassembled;
}

TEST(ParallelModelTest, ShardsSavedOnOneMeshLoadOnAnother) {
  // Whole tensors out of fsdp=2 x tensor=2, shards back in on fsdp=4 and assembled again.
  const std::map<std::string, at::Tensor> saved = perturbed_whole_tensors(ici(1, 2, 2), false);
  std::vector<int64_t> sent_bytes;
  reassembled_on(ici(1, 4, 1), saved, false, sent_bytes);
  // Each piece crossed the network once at most: the model's bytes, less the pieces each owner held itself.
  const int64_t model_bytes = tiny_llama_config().parameter_count() * static_cast<int64_t>(sizeof(float));
  const int64_t total_sent = sent_bytes[0] + sent_bytes[1] + sent_bytes[2] + sent_bytes[3];
  EXPECT_GT(total_sent, model_bytes / 2);
  EXPECT_LT(total_sent, model_bytes);
}

TEST(ParallelModelTest, ShardsSavedOnAPipelineLoadOnAnother) {
  // Whole tensors out of pipeline=2 x fsdp=2 (each stage's units on its devices), back in on pipeline=4 and on fsdp=4.
  const std::map<std::string, at::Tensor> saved = perturbed_whole_tensors(ici(1, 2, 1, 2, 1, 1, 2), false, 4);
  std::vector<int64_t> sent_bytes;
  reassembled_on(ici(1, 1, 1, 2, 1, 1, 4), saved, false, sent_bytes, 4);
  reassembled_on(ici(1, 4, 1, 2), saved, false, sent_bytes, 4);
}

TEST(ParallelModelTest, MixtralOnOneDeviceMatchesTheModel) { expect_parity(ici(1, 1, 1), true, false, true); }
TEST(ParallelModelTest, ExpertParallelMatchesOneDevice) { expect_parity(ici(1, 1, 1, 1, 2), true, false, true); }
TEST(ParallelModelTest, OneExpertPerDeviceMatchesOneDevice) {
  expect_parity(ici(1, 1, 1, 2, 4), true, false, true);
}
TEST(ParallelModelTest, ExpertWithFsdpMatchesOneDevice) { expect_parity(ici(1, 2, 1, 2, 2), true, false, true); }
TEST(ParallelModelTest, ExpertWithDataMatchesOneDevice) { expect_parity(ici(2, 1, 1, 2, 2), false, false, true); }
TEST(ParallelModelTest, ExpertWithTensorMatchesOneDevice) { expect_parity(ici(1, 1, 2, 2, 2), true, false, true); }
TEST(ParallelModelTest, ExpertWithFsdpAndCheckpointingMatchesOneDevice) {
  expect_parity(ici(1, 2, 1, 2, 2), true, false, true, /*checkpoint_every=*/1);
}

TEST(ParallelModelTest, ExpertsSavedOnOneLayoutLoadOnAnother) {
  // Whole tensors out of expert=2 x fsdp=2, shards back in on expert=4 and assembled again.
  const std::map<std::string, at::Tensor> saved = perturbed_whole_tensors(ici(1, 2, 1, 1, 2), true);
  std::vector<int64_t> sent_bytes;
  reassembled_on(ici(1, 1, 1, 1, 4), saved, true, sent_bytes);
}

TEST(ParallelModelTest, ExpertAxisNeedsExpertsThatSplit) {
  const mesh::Mesh mesh = mesh::Mesh::create(axis_sizes(1, 1, 1, 2), axis_sizes(1, 1, 1, 1), 1, 2);
  const auto dense = run_on_all_devices(mesh, [&](runtime::DeviceContext& ctx) { sharded_model(ctx); });
  for (const std::string& f : dense) EXPECT_NE(f.find("a dense Llama has no experts"), std::string::npos) << f;
  const mesh::Mesh three = mesh::Mesh::create(axis_sizes(1, 1, 1, 3), axis_sizes(1, 1, 1, 1), 1, 3);
  const auto uneven = run_on_all_devices(three, [&](runtime::DeviceContext& ctx) { sharded_model(ctx, {}, false, true); });
  for (const std::string& f : uneven)
    EXPECT_NE(f.find("num_local_experts (4) to be a multiple of 3"), std::string::npos) << f;
}

TEST(ParallelModelTest, TensorParallelNeedsDivisibleHeads) {
  const auto failures = run_on_all_devices(ici(1, 1, 4), [&](runtime::DeviceContext& ctx) {
    sharded_model(ctx);  // 2 key/value heads over 4 ranks
  });
  for (const std::string& f : failures) EXPECT_NE(f.find("num_key_value_heads (2)"), std::string::npos) << f;
}

}  // namespace
}  // namespace meshtrain::parallel
