// pipeline_test.cpp — the data path end to end on simulated jobs (every host's pipeline and one thread per device in
// this process: tests/simulated_devices.hpp): over whole epochs and several meshes, every sample is read once
// per epoch, the global batches are the sampler's on every mesh, replicas are identical, the device loader calls no
// collective, resume continues with the same batches on another mesh, and mismatched states are refused. With the
// sequence over context (load-balanced order), every device's tile equals the same positions of the batch without
// context. Also the dataset, the read plan (rows and token ranges), the instrumentation lines and the config errors.
//
// Legend: B = global_batch_size rows, T = block_size tokens, S = a device's or host's tokens of a row.
#include "data/data_test_support.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/data/host_loader.hpp"
#include "meshtrain/data/pipeline.hpp"
#include "meshtrain/mesh/mesh_roles.hpp"
#include "scratch_dir.hpp"
#include "simulated_devices.hpp"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <deque>
#include <functional>
#include <set>
#include <thread>

namespace meshtrain::data {
namespace {

using testing::data_config;
using testing::write_counting_shards;
using testing::axis_sizes;

struct NamedMesh {
  std::string name;
  mesh::Mesh mesh;
  std::string input_sharding = "(data,fsdp),None";
};

// The meshes of the issue: one device, 2 hosts x 4 with fsdp, data x fsdp, tensor=2 (rows replicated over tensor),
// multi-slice (data over DCN), and multi-slice with the rows over (fsdp,data) so a host's rows are not contiguous.
std::vector<NamedMesh> meshes() {
  return {{"1x1", mesh::Mesh::create(axis_sizes(1, 1, 1, 1), axis_sizes(1, 1, 1, 1), 1, 1)},
          {"2x4 fsdp=8", mesh::Mesh::create(axis_sizes(1, 8, 1, 1), axis_sizes(1, 1, 1, 1), 2, 4)},
          {"2x4 data=2 fsdp=4", mesh::Mesh::create(axis_sizes(2, 4, 1, 1), axis_sizes(1, 1, 1, 1), 2, 4)},
          {"2x4 fsdp=4 tensor=2", mesh::Mesh::create(axis_sizes(1, 4, 2, 1), axis_sizes(1, 1, 1, 1), 2, 4)},
          {"4x2 dcn data=2, ici fsdp=2 tensor=2",
           mesh::Mesh::create(axis_sizes(1, 2, 2, 1), axis_sizes(2, 1, 1, 1), 4, 2)},
          {"4x2 dcn data=2, ici fsdp=4, rows over (fsdp,data)",
           mesh::Mesh::create(axis_sizes(1, 4, 1, 1), axis_sizes(2, 1, 1, 1), 4, 2), "(fsdp,data),None"}};
}

// What one device got at one step.
struct DeviceStep {
  DataCursor cursor;
  sharding::ShardBounds bounds;
  at::Tensor inputs_RT, labels_RT;  // the device's shards
  int64_t collectives = 0;          // issued by next()
  at::Tensor documents_RS;          // its document_ids shard (data.document_mask), else undefined
};

// Runs `steps` steps of the data path on every device of `mesh`: one DataPipeline per host starting where
// `saved_state` says (null: at the first batch), one thread per device. With `check_replicas`, the first and last
// steps also run the replica check (collective). Returns, per device, what next() gave at every step; fails the test
// on any device's exception.
std::vector<std::vector<DeviceStep>> run_job(const settings::Settings& config, const mesh::Mesh& mesh,
                                             const nlohmann::json* saved_state,
                                             int64_t steps, bool check_replicas = false,
                                             DataPipeline::Purpose purpose = DataPipeline::Purpose::training) {
  std::vector<std::unique_ptr<DataPipeline>> pipelines;
  for (int host = 0; host < mesh.hosts(); ++host)
    pipelines.push_back(std::make_unique<DataPipeline>(config, mesh, host, saved_state, purpose));
  std::vector<std::vector<DeviceStep>> got(mesh.num_devices());
  testing::expect_no_failures(testing::run_on_all_devices(mesh, [&](runtime::DeviceContext& ctx) {
    for (int64_t step = 0; step < steps; ++step) {
      const int64_t calls_before = ctx.counters().total_calls();
      DeviceBatch batch = pipelines[ctx.host()]->next(ctx);
      got[ctx.device()].push_back({batch.cursor, batch.input_ids.bounds(), batch.input_ids.local(),
                                   batch.labels.local(), ctx.counters().total_calls() - calls_before,
                                   batch.document_ids ? batch.document_ids->local() : at::Tensor()});
      if (check_replicas && (step == 0 || step == steps - 1)) {
        batch.input_ids.check_replicas(ctx);
        batch.labels.check_replicas(ctx);
      }
    }
  }));
  return got;
}

// The global batches a job saw, assembled from the devices' shards: per step, the inputs [B, T]. Checks on the way
// that every device of a step has the same cursor, that devices holding the same rows hold identical data (replicas),
// that every row is covered, that the device loader issued no collective, and that labels are the inputs shifted.
std::vector<at::Tensor> assemble(const std::vector<std::vector<DeviceStep>>& got, int64_t global_batch_size,
                                 int64_t block_size, std::vector<DataCursor>* cursors = nullptr) {
  std::vector<at::Tensor> batches;
  for (size_t step = 0; step < got[0].size(); ++step) {
    at::Tensor inputs_BT = at::full({global_batch_size, block_size}, -1, at::kInt);
    for (size_t device = 0; device < got.size(); ++device) {
      const DeviceStep& d = got[device].at(step);
      EXPECT_EQ(d.cursor, got[0][step].cursor) << "device " << device << " step " << step;
      EXPECT_EQ(d.collectives, 0) << "the device loader communicated on device " << device;
      EXPECT_TRUE(at::equal(d.labels_RT.narrow(1, 0, block_size - 1), d.inputs_RT.narrow(1, 1, block_size - 1)));
      EXPECT_TRUE(at::equal(d.labels_RT.select(1, block_size - 1), d.inputs_RT.select(1, block_size - 1) + 1));
      at::Tensor rows = inputs_BT.narrow(0, d.bounds.offset[0], d.bounds.shape[0]);
      if (rows.select(1, 0).eq(-1).all().item<bool>())
        rows.copy_(d.inputs_RT);
      else
        EXPECT_TRUE(at::equal(rows, d.inputs_RT)) << "replicas differ: device " << device << " step " << step;
    }
    EXPECT_FALSE(inputs_BT.eq(-1).any().item<bool>()) << "rows nobody holds at step " << step;
    batches.push_back(inputs_BT);
    if (cursors) cursors->push_back(got[0][step].cursor);
  }
  return batches;
}

// The sample id each row of `inputs_BT` holds (the counting dataset starts sample i at token i * T).
std::vector<int64_t> sample_ids(const at::Tensor& inputs_BT, int64_t block_size) {
  std::vector<int64_t> ids;
  for (int64_t row = 0; row < inputs_BT.size(0); ++row) {
    const int64_t first = inputs_BT[row][0].item<int64_t>();
    EXPECT_TRUE(at::equal(inputs_BT[row], at::arange(first, first + block_size, at::kInt))) << "row " << row;
    ids.push_back(first / block_size);
  }
  return ids;
}

class DataPipelineTest : public ::testing::Test {
 protected:
  DataPipelineTest() { write_counting_shards(dir_, {500, 700, 401}); }  // 1601 tokens: 200 samples of 8+1

  meshtrain::testing::ScratchDir scratch_{"meshtrain_pipeline_test"};
  const std::filesystem::path dir_ = scratch_.path() / "counting";
};

TEST_F(DataPipelineTest, DatasetPacksSamplesAcrossDocumentsAndShards) {
  for (uint32_t token_bytes : {2u, 4u}) {
    const std::filesystem::path dir = scratch_.path() / ("width" + std::to_string(token_bytes));
    write_counting_shards(dir, {500, 700, 401}, token_bytes);
    const TokenDataset dataset(dir, 8);
    ASSERT_EQ(dataset.num_samples(), 200);
    std::vector<int32_t> sample(9);
    for (int64_t id = 0; id < dataset.num_samples(); ++id) {  // samples 62 and 149 straddle the shard boundaries
      dataset.read_sample(id, sample.data());
      for (int64_t t = 0; t < 9; ++t) ASSERT_EQ(sample[t], id * 8 + t) << "sample " << id << " token " << t;
    }
  }
}

TEST_F(DataPipelineTest, DatasetPathIsADirectoryOrANameUnderAssets) {
  EXPECT_EQ(TokenDataset::resolve(dir_.string()), dir_);
  EXPECT_TRUE(std::filesystem::exists(TokenDataset::resolve("moby-dick-byte") / "index.json"));
  try {
    TokenDataset::resolve("no-such-dataset");
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("dataset.path=no-such-dataset: no such token-shard directory"),
              std::string::npos) << e.what();
  }
}

// The host loader alone, on every split of a batch's rows it makes (1 to 3 loader threads, so 2 to 4 shares, with
// consumers reading shares while they wait) and every read-ahead, reading whole rows or two token ranges of each
// (context parallelism's chunks, the later one first): every consumer gets every batch in order, each row holding
// its sample's ranges and their next tokens; and a batch a consumer still holds is never overwritten by a later one
// (buffer reuse).
TEST_F(DataPipelineTest, HostLoaderGivesEveryConsumerEveryBatchWhateverTheThreadsAndReadAhead) {
  auto dataset = std::make_shared<const TokenDataset>(dir_, 8);
  const GlobalSampler sampler(7, dataset->num_samples(), 8);  // 25 batches per epoch
  const std::vector<int64_t> rows = {1, 5, 6, 7, 0, 3};      // not in order, not contiguous
  for (const std::vector<RowPiece>& pieces : {std::vector<RowPiece>{{{0, 8}, 0}},
                                               std::vector<RowPiece>{{{6, 8}, 0}, {{1, 2}, 2}}}) {
    // The tokens of sample `id` at the pieces' places, shifted by `shift`.
    auto expected = [&](int64_t id, int64_t shift) {
      std::vector<at::Tensor> parts;
      for (const RowPiece& piece : pieces)
        parts.push_back(at::arange(id * 8 + piece.range.begin + shift, id * 8 + piece.range.end + shift, at::kInt));
      return at::cat(parts);
    };
    auto expect_batch = [&](const HostBatch& batch, DataCursor cursor, const std::string& where) {
      ASSERT_EQ(batch.cursor, cursor) << where;
      for (size_t r = 0; r < rows.size(); ++r) {
        const int64_t id = sampler.sample_at(cursor.epoch, cursor.step, rows[r]);
        ASSERT_EQ(batch.sample_ids[r], id) << where << " row " << r;
        ASSERT_TRUE(at::equal(batch.inputs_RS[r], expected(id, 0))) << where << " row " << r;
        ASSERT_TRUE(at::equal(batch.labels_RS[r], expected(id, 1))) << where << " row " << r;
      }
    };
    for (int threads : {1, 2, 3})
      for (int prefetch : {1, 2, 3})
        for (int consumers : {1, 3}) {
          const std::string config = fmt::format("{} pieces threads={} prefetch={} consumers={}", pieces.size(),
                                                 threads, prefetch, consumers);
          HostLoader loader(dataset, sampler, rows, pieces, {0, 20}, {prefetch, threads, consumers});
          std::vector<std::thread> consumer_threads;
          for (int c = 0; c < consumers; ++c)
            consumer_threads.emplace_back([&, c] {
              std::deque<std::pair<DataCursor, std::shared_ptr<const HostBatch>>> held;  // the last two taken
              DataCursor cursor{0, 20};
              for (int64_t n = 0; n < 60; ++n, cursor = sampler.next(cursor)) {
                const std::string where = fmt::format("{} consumer {} batch {}", config, c, n);
                held.emplace_back(cursor, loader.take(n).batch);
                for (const auto& [held_cursor, batch] : held) expect_batch(*batch, held_cursor, where);
                if (held.size() > 2) held.pop_front();
              }
            });
          for (std::thread& thread : consumer_threads) thread.join();
        }
  }
}

TEST(ReadPlanTest, RowsPerHostAndDevice) {
  const sharding::PartitionSpec rows = sharding::PartitionSpec::parse("(data,fsdp),None");
  // The seed's scenario: 2 hosts x 4 devices, fsdp=8: host 1 reads rows 4:8, device k holds row k (minibatch).
  const mesh::AxisSizes one = axis_sizes(1, 1, 1, 1);
  const ReadPlan fsdp = ReadPlan::make(mesh::Mesh::create(axis_sizes(1, 8, 1, 1), one, 2, 4), 8, 16, rows, 1);
  EXPECT_EQ(fsdp.rows, (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_TRUE(fsdp.minibatch);
  EXPECT_EQ(fsdp.summary(8), "host 1 reads rows 4:8 of 8; device 4 holds rows 4:5, device 5 holds rows 5:6, device 6 "
                             "holds rows 6:7, device 7 holds rows 7:8");
  // tensor=2: devices 2k and 2k+1 hold the same rows, read once by their host.
  const ReadPlan tensor = ReadPlan::make(mesh::Mesh::create(axis_sizes(1, 4, 2, 1), one, 2, 4), 8, 16, rows, 0);
  EXPECT_EQ(tensor.rows, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_FALSE(tensor.minibatch);
  EXPECT_EQ(tensor.summary(8), "host 0 reads rows 0:4 of 8; device 0 holds rows 0:2, device 1 holds rows 0:2, device 2 "
                               "holds rows 2:4, device 3 holds rows 2:4");
  // Replicated rows (spec without data): every host reads the whole batch.
  const ReadPlan whole = ReadPlan::make(mesh::Mesh::create(axis_sizes(2, 4, 1, 1), one, 2, 4), 8, 16,
                                        sharding::PartitionSpec::parse("fsdp,None"), 1);
  EXPECT_EQ(rows_string(whole.rows), "0:8");
  // Rows over (fsdp,data) with data over DCN: host 0 (data=0) holds every other block.
  const ReadPlan strided = ReadPlan::make(mesh::Mesh::create(axis_sizes(1, 4, 1, 1), axis_sizes(2, 1, 1, 1), 2, 4),
                                          8, 16,
                                          sharding::PartitionSpec::parse("(fsdp,data),None"), 0);
  EXPECT_EQ(rows_string(strided.rows), "0:1, 2:3, 4:5, 6:7");
  EXPECT_EQ(strided.devices[2].local_begin, 2);
}

TEST(ReadPlanTest, RejectsSpecsTheLoaderCannotServe) {
  const mesh::Mesh mesh = mesh::Mesh::create(axis_sizes(1, 8, 1, 1), axis_sizes(1, 1, 1, 1), 2, 4);
  auto error_of = [&](int64_t batch, const std::string& spec) -> std::string {
    try {
      ReadPlan::make(mesh, batch, 16, sharding::PartitionSpec::parse(spec), 0);
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of(6, "(data,fsdp),None").find("global_batch_size=6 is not divisible by the 8 row blocks"),
            std::string::npos);
  EXPECT_NE(error_of(8, "None,fsdp").find("sequence sharding"), std::string::npos);
}

// The natural tokens of a row that context rank `rank` of `context` holds, in load-balanced order.
std::vector<int64_t> natural_positions(int64_t block_size, int context, int rank) {
  std::vector<int64_t> positions;
  const std::vector<mesh::TokenRange> chunks =
      context == 1 ? std::vector<mesh::TokenRange>{{0, block_size}}
                   : mesh::MeshRoles::context_chunks(block_size, context, rank);
  for (const mesh::TokenRange& chunk : chunks)
    for (int64_t p = chunk.begin; p < chunk.end; ++p) positions.push_back(p);
  return positions;
}

// Every host's read plan of a [batch, block_size] batch under data.input_sharding `text` on `mesh`: each device's
// chunks are context_chunks of its context coordinate at its block of the (load-balanced) sequence, and its tile's
// place in the host-local batch holds exactly those tokens; each host reads each (row, token) its devices hold once
// and nothing else; every (row, token) is held by some device.
void expect_plans_cover_the_batch(const mesh::Mesh& mesh, int64_t batch, int64_t block_size, const std::string& text) {
  const sharding::PartitionSpec spec = input_sharding(text, mesh);
  const int context = mesh.size(mesh::Axis::context);
  std::set<std::pair<int64_t, int64_t>> held_by_job;
  for (int host = 0; host < mesh.hosts(); ++host) {
    SCOPED_TRACE(fmt::format("host {}", host));
    const ReadPlan plan = ReadPlan::make(mesh, batch, block_size, spec, host);
    EXPECT_EQ(plan.context, context);
    // What the host reads, and the natural token at each host-local position.
    std::vector<int64_t> natural_at(plan.local_tokens(), -1);
    int64_t filled = 0;
    for (const RowPiece& piece : plan.pieces) {
      EXPECT_EQ(piece.local_begin, filled) << "pieces not dense";
      for (int64_t p = piece.range.begin; p < piece.range.end; ++p) natural_at.at(filled++) = p;
    }
    EXPECT_EQ(filled, plan.local_tokens());
    std::multiset<std::pair<int64_t, int64_t>> read;
    for (int64_t row : plan.rows)
      for (int64_t p : natural_at) read.insert({row, p});
    std::set<std::pair<int64_t, int64_t>> held_by_host;
    for (const DeviceTile& tile : plan.devices) {
      SCOPED_TRACE(fmt::format("device {}", tile.device));
      const int rank = mesh.device(tile.device).coords[static_cast<int>(mesh::Axis::context)];
      EXPECT_EQ(tile.sequence.context_rank, rank);
      EXPECT_EQ(tile.bounds(), sharding::shard_bounds(mesh, sharding::Shape{batch, block_size}, spec, tile.device));
      EXPECT_EQ(tile.sequence.begin, rank * block_size / context);
      const std::vector<int64_t> positions = natural_positions(block_size, context, rank);
      for (size_t i = 0; i < positions.size(); ++i)
        EXPECT_EQ(natural_at.at(tile.sequence.local_begin + i), positions[i]) << "host-local position";
      for (int64_t row : tile.rows()) {
        EXPECT_EQ(plan.rows.at(tile.local_begin + row - tile.begin), row) << "host-local row";
        for (int64_t p : positions) held_by_host.insert({row, p});
      }
    }
    for (const auto& token : read)
      EXPECT_EQ(read.count(token), 1u) << "row " << token.first << " token " << token.second;
    const std::set<std::pair<int64_t, int64_t>> read_once(read.begin(), read.end());
    EXPECT_EQ(read_once, held_by_host);
    held_by_job.insert(held_by_host.begin(), held_by_host.end());
  }
  EXPECT_EQ(held_by_job.size(), static_cast<size_t>(batch * block_size));
}

TEST(ReadPlanTest, ContextSplitsEachRowsTokensIntoLoadBalancedChunks) {
  const mesh::AxisSizes one = axis_sizes(1, 1, 1, 1);
  // 1 host x 4 devices, context=4: the host reads every token, in load-balanced order (chunks 0 7 | 1 6 | 2 5 | 3 4).
  const mesh::Mesh context4 = mesh::Mesh::create(axis_sizes(1, 1, 1, 1, 4), one, 1, 4);
  expect_plans_cover_the_batch(context4, 4, 16, "(data,fsdp),None");
  const ReadPlan all = ReadPlan::make(context4, 4, 16, input_sharding("(data,fsdp),None", context4), 0);
  EXPECT_EQ(all.pieces, (std::vector<RowPiece>{{{0, 2}, 0}, {{14, 16}, 2}, {{2, 4}, 4}, {{12, 14}, 6}, {{4, 6}, 8},
                                               {{10, 12}, 10}, {{6, 10}, 12}}));
  EXPECT_TRUE(all.minibatch);
  EXPECT_EQ(all.summary(4), "host 0 reads rows 0:4 of 4, tokens [0:16] of 16 in load-balanced order; device 0 holds "
                            "rows 0:4 x tokens [0:2, 14:16], device 1 holds rows 0:4 x tokens [2:4, 12:14], device 2 "
                            "holds rows 0:4 x tokens [4:6, 10:12], device 3 holds rows 0:4 x tokens [6:8, 8:10]");

  // 2 hosts x 2 devices, dcn context=2, ici fsdp=2: host 0 reads chunks 0 and 3 of every row, host 1 chunks 1 and 2.
  const mesh::Mesh dcn_context = mesh::Mesh::create(axis_sizes(1, 2, 1, 1), axis_sizes(1, 1, 1, 1, 2), 2, 2);
  expect_plans_cover_the_batch(dcn_context, 4, 16, "(data,fsdp),None");
  const sharding::PartitionSpec spec = input_sharding("(data,fsdp),None", dcn_context);
  const ReadPlan host0 = ReadPlan::make(dcn_context, 4, 16, spec, 0);
  const ReadPlan host1 = ReadPlan::make(dcn_context, 4, 16, spec, 1);
  EXPECT_EQ(host0.rows, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(host0.token_ranges(), (std::vector<mesh::TokenRange>{{0, 4}, {12, 16}}));
  EXPECT_EQ(host1.token_ranges(), (std::vector<mesh::TokenRange>{{4, 12}}));
  EXPECT_EQ(host1.pieces, (std::vector<RowPiece>{{{4, 12}, 0}}));  // chunks 1 and 2 are adjacent: one range
  EXPECT_EQ(host0.devices[1].bounds(), (sharding::ShardBounds{{2, 0}, {2, 8}}));
  EXPECT_EQ(host1.devices[1].bounds(), (sharding::ShardBounds{{2, 8}, {2, 8}}));
  EXPECT_TRUE(host0.minibatch);

  // context x data, and replicas over tensor: 2 hosts x 4, ici data=2 context=2, dcn fsdp=2; and ici tensor=2
  // context=2, dcn data=2.
  expect_plans_cover_the_batch(mesh::Mesh::create(axis_sizes(2, 1, 1, 1, 2), axis_sizes(1, 2, 1, 1), 2, 4), 8, 16,
                               "(data,fsdp),None");
  expect_plans_cover_the_batch(mesh::Mesh::create(axis_sizes(1, 1, 2, 1, 2), axis_sizes(2, 1, 1, 1), 2, 4), 8, 16,
                               "(data,fsdp),context");
  // Rows over (fsdp,data) with data over DCN, context inside each host.
  expect_plans_cover_the_batch(mesh::Mesh::create(axis_sizes(1, 2, 1, 1, 2), axis_sizes(2, 1, 1, 1), 2, 4), 8, 16,
                               "(fsdp,data),None");
}

TEST(ReadPlanTest, InputShardingPutsTheSequenceOverContext) {
  const mesh::Mesh context2 = mesh::Mesh::create(axis_sizes(1, 2, 1, 1, 2), axis_sizes(1, 1, 1, 1), 1, 4);
  EXPECT_EQ(input_sharding("(data,fsdp),None", context2), sharding::PartitionSpec::parse("(data,fsdp),context"));
  EXPECT_EQ(input_sharding("[[data, fsdp], context]", context2), sharding::PartitionSpec::parse("(data,fsdp),context"));
  // With experts split too, both are appended.
  const mesh::Mesh experts = mesh::Mesh::create(axis_sizes(1, 1, 1, 2, 2), axis_sizes(1, 1, 1, 1), 1, 4);
  EXPECT_EQ(input_sharding("(data,fsdp),None", experts), sharding::PartitionSpec::parse("(data,fsdp,expert),context"));
  // context = 1: nothing appended; naming context is allowed and changes nothing.
  const mesh::Mesh fsdp = mesh::Mesh::create(axis_sizes(1, 4, 1, 1), axis_sizes(1, 1, 1, 1), 1, 4);
  EXPECT_EQ(input_sharding("(data,fsdp),None", fsdp), sharding::PartitionSpec::parse("(data,fsdp),None"));
  const ReadPlan named = ReadPlan::make(fsdp, 8, 16, input_sharding("(data,fsdp),context", fsdp), 0);
  const ReadPlan plain = ReadPlan::make(fsdp, 8, 16, input_sharding("(data,fsdp),None", fsdp), 0);
  EXPECT_FALSE(named.sequence_split());
  EXPECT_EQ(named.pieces, (std::vector<RowPiece>{{{0, 16}, 0}}));
  EXPECT_EQ(named.summary(8), plain.summary(8));

  auto error_of = [](const std::function<void()>& call) -> std::string {
    try {
      call();
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  };
  // The sequence may go over context only.
  const std::string fsdp_sequence = error_of([&] { input_sharding("data,fsdp", context2); });
  EXPECT_NE(fsdp_sequence.find("data.input_sharding=[data, fsdp]: the sequence dimension may be split over context "
                               "only, not over fsdp"), std::string::npos) << fsdp_sequence;
  EXPECT_NE(fsdp_sequence.find("\"(data,fsdp),context\""), std::string::npos) << fsdp_sequence;
  // Rows over context are refused (context splits tokens).
  const std::string context_rows = error_of([&] {
    ReadPlan::make(context2, 8, 16, input_sharding("(fsdp,context),None", context2), 0);
  });
  EXPECT_NE(context_rows.find("splits the batch's rows over context"), std::string::npos) << context_rows;
  // block_size must split into 2 x context chunks; the error names block_size and the multiple.
  const std::string block = error_of([&] {
    ReadPlan::make(context2, 8, 6, input_sharding("(data,fsdp),None", context2), 0);
  });
  EXPECT_NE(block.find("block_size=6 does not split into 2 x context = 4 equal chunks"), std::string::npos) << block;
  EXPECT_NE(block.find("use a multiple of 4"), std::string::npos) << block;
}

TEST_F(DataPipelineTest, WholeEpochsOnEveryMeshReadEachSampleOnceInTheSamplersOrder) {
  const settings::Settings config = data_config(dir_);
  const GlobalSampler sampler(42, 200, 8);
  ASSERT_EQ(sampler.batches_per_epoch(), 25);
  const int64_t steps = 2 * sampler.batches_per_epoch();
  std::vector<at::Tensor> first_mesh_batches;
  for (const NamedMesh& m : meshes()) {
    SCOPED_TRACE(m.name);
    const settings::Settings mesh_config = data_config(dir_, {"data.input_sharding=" + m.input_sharding});
    std::vector<DataCursor> cursors;
    const std::vector<at::Tensor> batches =
        assemble(run_job(mesh_config, m.mesh, nullptr, steps, /*check_replicas=*/true), 8, 8, &cursors);
    ASSERT_EQ(batches.size(), static_cast<size_t>(steps));
    std::vector<std::set<int64_t>> seen(2);
    for (int64_t k = 0; k < steps; ++k) {
      const DataCursor expected{k / 25, k % 25};
      EXPECT_EQ(cursors[k], expected) << "step " << k;
      const std::vector<int64_t> ids = sample_ids(batches[k], 8);
      EXPECT_EQ(ids, sampler.global_batch(expected.epoch, expected.step)) << "step " << k;
      for (int64_t id : ids) EXPECT_TRUE(seen[expected.epoch].insert(id).second) << "sample " << id << " twice";
    }
    EXPECT_EQ(seen[0].size(), 200u);  // 200 samples, 25 batches of 8: every sample once per epoch
    EXPECT_EQ(seen[1].size(), 200u);
    if (first_mesh_batches.empty()) first_mesh_batches = batches;
    for (int64_t k = 0; k < steps; ++k) EXPECT_TRUE(at::equal(batches[k], first_mesh_batches[k])) << "step " << k;
  }
}

// Context parallelism: on meshes with context = 2 and 4 (a host reading two separate chunks of each row, a host
// reading one range, a host reading every chunk), every device's input_ids, labels and document_ids shards equal the
// positions of its context rank's chunks (load-balanced order) of the batch without context at the same step, labels
// across chunk boundaries and document numbers counted over the whole row included; no collective; replicas agree.
TEST_F(DataPipelineTest, ContextShardsEqualTheirChunksOfTheBatchWithoutContext) {
  const settings::Settings config = data_config(dir_, {"block_size=16", "data.document_mask=true"});
  const int64_t steps = 14;  // 100 samples: 12 batches of 8 per epoch, and into the next
  const mesh::Mesh one = mesh::Mesh::create(axis_sizes(1, 1, 1, 1), axis_sizes(1, 1, 1, 1), 1, 1);
  const std::vector<std::vector<DeviceStep>> reference = run_job(config, one, nullptr, steps);
  const std::vector<NamedMesh> context_meshes = {
      {"2x2 dcn context=2, ici fsdp=2", mesh::Mesh::create(axis_sizes(1, 2, 1, 1), axis_sizes(1, 1, 1, 1, 2), 2, 2)},
      {"1x4 context=4", mesh::Mesh::create(axis_sizes(1, 1, 1, 1, 4), axis_sizes(1, 1, 1, 1), 1, 4)},
      {"2x4 ici context=4, dcn data=2", mesh::Mesh::create(axis_sizes(1, 1, 1, 1, 4), axis_sizes(2, 1, 1, 1), 2, 4)},
      {"2x4 ici tensor=2 context=2, dcn fsdp=2",
       mesh::Mesh::create(axis_sizes(1, 1, 2, 1, 2), axis_sizes(1, 2, 1, 1), 2, 4), "(data,fsdp),context"}};
  for (const NamedMesh& m : context_meshes) {
    SCOPED_TRACE(m.name);
    const int context = m.mesh.size(mesh::Axis::context);
    const std::vector<std::vector<DeviceStep>> got =
        run_job(data_config(dir_, {"block_size=16", "data.document_mask=true", "data.input_sharding=" +
                                   m.input_sharding}), m.mesh, nullptr, steps, /*check_replicas=*/true);
    for (int device = 0; device < m.mesh.num_devices(); ++device) {
      const int rank = m.mesh.device(device).coords[static_cast<int>(mesh::Axis::context)];
      const std::vector<int64_t> positions = natural_positions(16, context, rank);
      const at::Tensor columns = at::tensor(positions, at::kLong);
      for (int64_t step = 0; step < steps; ++step) {
        const DeviceStep& d = got[device][step];
        const DeviceStep& whole = reference[0][step];
        const std::string where = fmt::format("device {} step {}", device, step);
        ASSERT_EQ(d.cursor, whole.cursor) << where;
        EXPECT_EQ(d.collectives, 0) << where;
        EXPECT_EQ(d.bounds.offset[1], rank * 16 / context) << where;
        ASSERT_EQ(d.inputs_RT.sizes().vec(), (std::vector<int64_t>{d.bounds.shape[0], 16 / context})) << where;
        auto expected = [&](const at::Tensor& whole_BT) {
          return whole_BT.narrow(0, d.bounds.offset[0], d.bounds.shape[0]).index_select(1, columns);
        };
        EXPECT_TRUE(at::equal(d.inputs_RT, expected(whole.inputs_RT))) << where;
        EXPECT_TRUE(at::equal(d.labels_RT, expected(whole.labels_RT))) << where;
        ASSERT_TRUE(d.documents_RS.defined()) << where;
        EXPECT_TRUE(at::equal(d.documents_RS, expected(whole.documents_RS))) << where;
      }
    }
  }
  // The reference's rows do cross documents (so the document numbers are tested), and the data state does not
  // depend on the mesh.
  EXPECT_GT(reference[0][0].documents_RS.max().item<int32_t>(), 0);
  EXPECT_EQ(DataPipeline(config, one, 0, nullptr).fingerprint(),
            DataPipeline(config, context_meshes[0].mesh, 1, nullptr).fingerprint());
}

TEST_F(DataPipelineTest, EvaluationReadsOnlyHeldOutSamplesTheSameBatchesEveryRoundOnEveryMesh) {
  // 200 samples; 10% held out: training draws from samples 0..179 (22 batches of 8 per epoch), evaluation from
  // 180..199, 2 batches per round.
  const settings::Settings config =
      data_config(dir_, {"eval.every_steps=5", "eval.batches=2", "eval.holdout_fraction=0.1"});
  const mesh::Mesh mesh = mesh::Mesh::create(axis_sizes(1, 8, 1, 1), axis_sizes(1, 1, 1, 1), 2, 4);
  std::set<int64_t> trained;
  for (const at::Tensor& batch : assemble(run_job(config, mesh, nullptr, 2 * 22), 8, 8))
    for (int64_t id : sample_ids(batch, 8)) trained.insert(id);
  EXPECT_GE(trained.size(), 176u);  // two epochs of 176 samples, each leaving out a different 4 of the 180
  EXPECT_LT(*trained.rbegin(), 180);

  // Two rounds of evaluation.
  const std::vector<at::Tensor> evaluated =
      assemble(run_job(config, mesh, nullptr, 4, /*check_replicas=*/true, DataPipeline::Purpose::evaluation), 8, 8);
  std::set<int64_t> held_out;
  for (int64_t k = 0; k < 2; ++k) {
    EXPECT_TRUE(at::equal(evaluated[k], evaluated[k + 2])) << "round 2 read other batches at batch " << k;
    for (int64_t id : sample_ids(evaluated[k], 8)) {
      EXPECT_TRUE(held_out.insert(id).second) << "sample " << id << " twice in one round";
      EXPECT_GE(id, 180);
      EXPECT_LT(id, 200);
      EXPECT_EQ(trained.count(id), 0u) << "held-out sample " << id << " was trained on";
    }
  }
  EXPECT_EQ(held_out.size(), 16u);
  // Another mesh evaluates the same batches.
  const mesh::Mesh other = mesh::Mesh::create(axis_sizes(1, 2, 2, 1), axis_sizes(2, 1, 1, 1), 4, 2);
  const std::vector<at::Tensor> on_other =
      assemble(run_job(config, other, nullptr, 2, false, DataPipeline::Purpose::evaluation), 8, 8);
  for (int64_t k = 0; k < 2; ++k) EXPECT_TRUE(at::equal(on_other[k], evaluated[k])) << "batch " << k;

  // The held-out split is part of the data state: a run saved with it does not resume without it.
  const mesh::Mesh one = mesh::Mesh::create(axis_sizes(1, 1, 1, 1), axis_sizes(1, 1, 1, 1), 1, 1);
  const nlohmann::json saved = DataPipeline(config, one, 0, nullptr).state({0, 3});
  try {
    DataPipeline(data_config(dir_), one, 0, nullptr).check_state(saved);
    ADD_FAILURE() << "resumed without the held-out split";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("samples: saved [0,180], now [0,200]"), std::string::npos) << e.what();
  }
  // Too few held-out samples for eval.batches names the keys.
  try {
    DataPipeline(data_config(dir_, {"eval.every_steps=5", "eval.batches=3", "eval.holdout_fraction=0.1"}), one, 0,
                 nullptr, DataPipeline::Purpose::evaluation);
    ADD_FAILURE() << "3 batches of 8 from 20 held-out samples";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("eval.batches=3 needs 3 x 8 (global_batch_size) = 24 held-out samples"),
              std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("raise eval.holdout_fraction"), std::string::npos) << e.what();
  }
}

TEST_F(DataPipelineTest, ResumeOnAnotherMeshContinuesWithTheSameBatches) {
  const settings::Settings config = data_config(dir_);
  const mesh::Mesh before = mesh::Mesh::create(axis_sizes(1, 8, 1, 1), axis_sizes(1, 1, 1, 1), 2, 4);
  const mesh::Mesh after = mesh::Mesh::create(axis_sizes(1, 2, 2, 1), axis_sizes(2, 1, 1, 1), 4, 2);
  const std::vector<at::Tensor> uninterrupted = assemble(run_job(config, before, nullptr, 32), 8, 8);
  // Stop after 20 steps (mid-epoch 0), save the state, resume on 4 hosts x 2 devices across the epoch boundary.
  const DataPipeline saver(config, before, 0, nullptr);
  const nlohmann::json saved = saver.state({0, 20});
  EXPECT_EQ(saved["epoch"], 0);
  EXPECT_EQ(saved["step"], 20);
  const DataCursor resume_at = DataPipeline(config, after, 3, nullptr).check_state(saved);
  EXPECT_EQ(resume_at, (DataCursor{0, 20}));
  const std::vector<at::Tensor> resumed = assemble(run_job(config, after, &saved, 12), 8, 8);
  for (int64_t k = 0; k < 12; ++k) EXPECT_TRUE(at::equal(resumed[k], uninterrupted[20 + k])) << "step " << 20 + k;
}

TEST_F(DataPipelineTest, RefusesAStateOfAnotherDatasetSeedOrBlockSize) {
  const mesh::Mesh mesh = mesh::Mesh::create(axis_sizes(1, 1, 1, 1), axis_sizes(1, 1, 1, 1), 1, 1);
  const nlohmann::json saved = DataPipeline(data_config(dir_), mesh, 0, nullptr).state({0, 3});
  auto refusal = [&](const settings::Settings& config, const nlohmann::json& state) -> std::string {
    try {
      DataPipeline(config, mesh, 0, nullptr).check_state(state);
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(refusal(data_config(dir_), saved), "");
  EXPECT_NE(refusal(data_config(dir_, {"seed=7"}), saved).find("seed: saved 42, now 7"), std::string::npos);
  const std::string block = refusal(data_config(dir_, {"block_size=4"}), saved);
  EXPECT_NE(block.find("block_size: saved 8, now 4"), std::string::npos) << block;
  EXPECT_NE(block.find("refusing to resume"), std::string::npos) << block;
  // Same sizes, other tokens and tokenizer: the shard checksums and the fingerprint differ.
  const std::filesystem::path other = scratch_.path() / "other";
  write_counting_shards(other, {500, 700, 401}, 2, "other:65536", 1000);
  const std::string dataset = refusal(data_config(other), saved);
  EXPECT_NE(dataset.find("tokenizer_fingerprint: saved \"test:65536\", now \"other:65536\""), std::string::npos)
      << dataset;
  EXPECT_NE(dataset.find("shards: saved"), std::string::npos) << dataset;
  nlohmann::json no_seed = saved;
  no_seed.erase("seed");
  EXPECT_NE(refusal(data_config(dir_), no_seed).find("seed is missing"), std::string::npos);
  nlohmann::json past_the_end = saved;
  past_the_end["step"] = 25;
  EXPECT_NE(refusal(data_config(dir_), past_the_end).find("outside the 25 batches of an epoch"), std::string::npos);
}

TEST_F(DataPipelineTest, InstrumentationLogsEveryStageForTheFirstSteps) {
  const mesh::Mesh mesh = mesh::Mesh::create(axis_sizes(1, 8, 1, 1), axis_sizes(1, 1, 1, 1), 2, 4);
  const settings::Settings config = data_config(dir_, {"debug.data_shapes=true", "debug.data_shape_steps=2"});
  ::testing::internal::CaptureStderr();
  run_job(config, mesh, nullptr, 3);
  const std::string log = ::testing::internal::GetCapturedStderr();
  auto count = [&](const std::string& what) {
    int n = 0;
    for (size_t at = log.find(what); at != std::string::npos; at = log.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("Minibatch dataloading: True"), 2) << log;
  EXPECT_EQ(count("[host_loader] host 0: input_ids i32[4, 8] rows 0:4 (samples "), 2) << log;
  EXPECT_EQ(count("[host_loader] host 1: input_ids i32[4, 8] rows 4:8 (samples "), 2) << log;
  EXPECT_EQ(count("[device_loader] input_ids i32[8@(data,fsdp), 8]; device 3 (host 0, fsdp=3) holds rows 3:4"), 2)
      << log;
  EXPECT_EQ(count("[device_loader] "), 16) << log;  // 8 devices x 2 steps
  EXPECT_EQ(count(", 0 collectives"), 16) << log;
  EXPECT_EQ(count("input_ids i32[8@(data,fsdp), 8] on mesh"), 1) << log;  // the picture, once for the job
}

// With the sequence over context, every stage's line shows the 2-D tiles and the token ranges, in load-balanced
// order; the picture names each tile's tokens.
TEST_F(DataPipelineTest, InstrumentationShowsTheTokenRangesWithContext) {
  const mesh::Mesh mesh = mesh::Mesh::create(axis_sizes(1, 2, 1, 1), axis_sizes(1, 1, 1, 1, 2), 2, 2);
  const settings::Settings config =
      data_config(dir_, {"block_size=16", "debug.data_shapes=true", "debug.data_shape_steps=1"});
  ::testing::internal::CaptureStderr();
  run_job(config, mesh, nullptr, 2);
  const std::string log = ::testing::internal::GetCapturedStderr();
  for (const std::string& line : {
           std::string("Data read plan (input_ids/labels i32[8@(data,fsdp), 16@context], rows over (data,fsdp), tokens "
                       "over context in load-balanced order: context rank r holds chunks r and 3-r of 4): host 0 reads "
                       "rows 0:8 of 8, tokens [0:4, 12:16] of 16 in load-balanced order; device 0 holds rows 0:4 x "
                       "tokens [0:4, 12:16], device 1 holds rows 4:8 x tokens [0:4, 12:16]"),
           std::string("host 1 reads rows 0:8 of 8, tokens [4:12] of 16 in load-balanced order; device 2 holds rows "
                       "0:4 x tokens [4:8, 8:12]"),
           std::string("Minibatch dataloading: True"),
           std::string("[host_loader] host 0: input_ids i32[8, 8] rows 0:8 (samples "),
           std::string("x tokens [0:4, 12:16] in load-balanced order, labels alike; epoch 0 step 0"),
           std::string("[device_loader] input_ids i32[8@(data,fsdp), 16@context]; device 3 (host 1, fsdp=1, context=1) "
                       "holds rows 4:8 x tokens [4:8, 8:12] in load-balanced order (labels alike); epoch 0 step 0"),
           std::string("input_ids i32[8@(data,fsdp), 16@context] on mesh"),
           std::string("tokens 4:8, 8:12"),
           std::string("The sequence is in load-balanced order: block r holds chunks r and 3-r of the row's 4")})
    EXPECT_NE(log.find(line), std::string::npos) << line << "\n" << log;
}

TEST_F(DataPipelineTest, ConfigErrorsNameTheKey) {
  const mesh::Mesh mesh = mesh::Mesh::create(axis_sizes(1, 1, 1, 1), axis_sizes(1, 1, 1, 1), 1, 1);
  auto error_of = [&](const std::vector<std::string>& overrides) -> std::string {
    try {
      DataPipeline(data_config(dir_, overrides), mesh, 0, nullptr);
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of({"dataset.path=nowhere"}).find("dataset.path=nowhere"), std::string::npos);
  EXPECT_NE(error_of({"data.input_sharding=(data,fsdp"}).find("data.input_sharding=\"(data,fsdp\""),
            std::string::npos);
  EXPECT_NE(error_of({"data.prefetch_steps=0"}).find("data.prefetch_steps must be at least 1"), std::string::npos);
  EXPECT_NE(error_of({"global_batch_size=512"}).find("fewer than one global batch (global_batch_size=512)"),
            std::string::npos);
}

}  // namespace
}  // namespace meshtrain::data
