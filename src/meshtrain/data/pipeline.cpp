// pipeline.cpp — the pipeline's construction from the settings, the device loader, the instrumentation lines and the
// data state for checkpoints.
//
// Legend: R = host-local rows, S = host-local tokens of a row (ReadPlan::local_tokens()).
#include "meshtrain/data/pipeline.hpp"

#include "meshtrain/common/checksum.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/common/json_read.hpp"
#include "meshtrain/common/log.hpp"
#include "meshtrain/common/mix.hpp"
#include "meshtrain/mesh/mesh_roles.hpp"
#include "meshtrain/sharding/visualize.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

namespace meshtrain::data {
namespace {

// "17, 3, 99, 42" (the first `max` ids, then ", ...").
std::string ids_string(const std::vector<int64_t>& ids, size_t max = 8) {
  std::string text;
  for (size_t i = 0; i < ids.size() && i < max; ++i) text += (i == 0 ? "" : ", ") + std::to_string(ids[i]);
  return ids.size() > max ? text + ", ..." : text;
}

// The dataset a pipeline reads: eval.dataset for an evaluation that has one, else dataset.path. Each shard's bytes are
// checksummed when the loader first reads from it, not all of them before step 1.
std::shared_ptr<const TokenDataset> open_dataset(const settings::Settings& settings, DataPipeline::Purpose purpose) {
  const bool own_eval_data = purpose == DataPipeline::Purpose::evaluation && !settings.eval.from_holdout();
  const std::string& path = own_eval_data ? settings.eval.dataset : settings.data.dataset_path;
  return std::make_shared<const TokenDataset>(TokenDataset::resolve(path), settings.block_size,
                                              token_shards::PayloadCheck::on_first_read);
}

// How many samples at the end of dataset.path evaluation holds out: ceil(eval.holdout_fraction * num_samples) while
// evaluation is on without an eval.dataset, else none.
int64_t held_out_samples(const settings::EvalSettings& eval, int64_t num_samples) {
  if (!eval.enabled() || !eval.from_holdout()) return 0;
  return static_cast<int64_t>(std::ceil(eval.holdout_fraction * static_cast<double>(num_samples) - 1e-9));
}

}  // namespace

GlobalSampler sampler_for(const settings::Settings& settings, const TokenDataset& dataset,
                          DataPipeline::Purpose purpose) {
  const settings::EvalSettings& eval = settings.eval;
  const int64_t global_batch_size = settings.global_batch_size, n = dataset.num_samples();
  if (purpose == DataPipeline::Purpose::training) {
    const int64_t held_out = held_out_samples(eval, n);
    MT_USER_CHECK(held_out == 0 || n - held_out >= global_batch_size,
                  "eval.holdout_fraction={} holds out {} of the {} samples of {}, leaving fewer than one global batch "
                  "(global_batch_size={}) to train on", eval.holdout_fraction, held_out, n,
                  dataset.path().string(), global_batch_size);
    return GlobalSampler(settings.seed, SampleRange{0, n - held_out}, global_batch_size);
  }
  MT_USER_CHECK(eval.enabled(), "an evaluation pipeline needs eval.every_steps > 0");
  const int64_t held_out = eval.from_holdout() ? held_out_samples(eval, n) : n;
  MT_USER_CHECK(held_out >= eval.batches * global_batch_size,
                "eval.batches={} needs {} x {} (global_batch_size) = {} held-out samples, but {} holds out {}{}: lower "
                "eval.batches{}", eval.batches, eval.batches, global_batch_size, eval.batches * global_batch_size,
                dataset.path().string(), held_out,
                eval.from_holdout() ? fmt::format(" (eval.holdout_fraction={} of {})", eval.holdout_fraction, n)
                                    : " (eval.dataset: all of its samples)",
                eval.from_holdout() ? " or raise eval.holdout_fraction" : "");
  // Its own key, so that its order does not follow the training order.
  return GlobalSampler(splitmix64(settings.seed ^ 0x6576616c), SampleRange{n - held_out, held_out}, global_batch_size,
                       /*fixed_order=*/true, eval.batches);
}

DataPipeline::DataPipeline(const settings::Settings& settings, const mesh::Mesh& mesh, int host,
                           const nlohmann::json* saved_state, Purpose purpose)
    : mesh_(mesh),
      host_(host),
      global_batch_size_(settings.global_batch_size),
      block_size_(settings.block_size),
      seed_(settings.seed),
      spec_(input_sharding(settings.data.input_sharding, mesh)),
      debug_shapes_(purpose == Purpose::training && settings.debug.data_shapes),
      debug_steps_(settings.debug.data_shape_steps),
      dataset_(open_dataset(settings, purpose)),
      sampler_(sampler_for(settings, *dataset_, purpose)),
      plan_(ReadPlan::make(mesh, global_batch_size_, block_size_, spec_, host)),
      row_replicas_(mesh::MeshRoles(mesh).row_replicas(spec_.dims.at(0))),
      taken_(plan_.devices.size(), 0) {
  if (saved_state) start_ = check_state(*saved_state);
  HostLoaderOptions options;
  options.prefetch_steps = settings.data.prefetch_steps;
  options.threads = settings.data.loader_threads;
  options.consumers = static_cast<int>(plan_.devices.size());
  options.documents = settings.data.document_mask;
  if (purpose == Purpose::evaluation) {
    MT_CHECK(!saved_state, "an evaluation pipeline starts at its first batch");
    log::info("Eval data {}: samples {}..{} of {} ({}), {} global batches of {} x {} per evaluation, read with the "
              "training read plan", dataset_->path().string(), samples().first, samples().first + samples().count - 1,
              dataset_->num_samples(),
              settings.eval.from_holdout() ? "held out from training: eval.holdout_fraction" : "eval.dataset",
              sampler_.batches_per_epoch(), global_batch_size_, block_size_);
    options.threads = 1;
  } else {
    log_training_plan(settings.eval, start_);
  }
  loader_ = std::make_unique<HostLoader>(dataset_, sampler_, plan_.rows, plan_.pieces, start_, options);
}

void DataPipeline::log_training_plan(const settings::EvalSettings& eval, DataCursor start) const {
  const token_shards::ShardIndex& index = dataset_->index();
  log::info("Dataset {}: {} tokens in {} shard(s), tokenizer {}; {} samples of {}+1 tokens, {} global batches of {} "
            "per epoch", dataset_->path().string(), index.total_tokens, index.shards.size(),
            index.tokenizer.fingerprint, dataset_->num_samples(), block_size_, sampler_.batches_per_epoch(),
            global_batch_size_);
  log::info("Minibatch dataloading: {}", plan_.minibatch ? "True" : "False");
  if (plan_.sequence_split()) {
    const std::string type = sharding::type_string(at::kInt, {global_batch_size_, block_size_}, spec_);
    log::info("Data read plan (input_ids/labels {}, rows over {}, tokens over {} in load-balanced order: context rank "
              "r holds chunks r and {}-r of {}): {}", type, mesh::axes_label(spec_.dims[0]),
              mesh::axes_label(spec_.dims[1]), 2 * plan_.context - 1, 2 * plan_.context,
              plan_.summary(global_batch_size_));
  } else {
    log::info("Data read plan (input_ids/labels i32[{}, {}], rows over {}): {}", global_batch_size_, block_size_,
              mesh::axes_label(spec_.dims[0]), plan_.summary(global_batch_size_));
  }
  if (samples().count < dataset_->num_samples())
    log::info("Training on samples 0..{}; the last {} are held out for evaluation (eval.holdout_fraction={})",
              samples().count - 1, dataset_->num_samples() - samples().count, eval.holdout_fraction);
  log::info("Data starts at epoch {} step {}", start.epoch, start.step);
}

DataPipeline::~DataPipeline() = default;

DeviceBatch DataPipeline::next(runtime::DeviceContext& ctx) {
  MT_CHECK(ctx.host() == host_, "device {} of host {} asked host {}'s data pipeline for a batch", ctx.device(),
           ctx.host(), host_);
  const int64_t n = taken_[ctx.info().local]++;
  const HostLoader::Taken taken = loader_->take(n);
  const HostBatch& batch = *taken.batch;
  const bool instrument = debug_shapes_ && n < debug_steps_;
  if (instrument && taken.first) log_host_stage(batch);

  const int64_t calls_before = ctx.counters().total_calls();
  const sharding::Shape shape = {global_batch_size_, block_size_};
  // The device's tile and its place in the host's batch, from the read plan (computed once).
  const DeviceTile& tile = plan_.devices[ctx.info().local];
  MT_CHECK(tile.device == ctx.device(), "the read plan's device {} is not device {}", tile.device, ctx.device());
  const sharding::ShardBounds block = tile.bounds();
  const sharding::Shape offset_in_host_local = tile.local_offset();
  DeviceBatch out{sharding::GlobalTensor::from_host_local_block(mesh_, ctx.device(), shape, spec_, batch.inputs_RS,
                                                                block, offset_in_host_local),
                  sharding::GlobalTensor::from_host_local_block(mesh_, ctx.device(), shape, spec_, batch.labels_RS,
                                                                block, offset_in_host_local),
                  batch.cursor, taken.wait_seconds, std::nullopt};
  if (batch.documents_RS.defined())
    out.document_ids = sharding::GlobalTensor::from_host_local_block(mesh_, ctx.device(), shape, spec_,
                                                                     batch.documents_RS, block, offset_in_host_local);
  if (instrument) {
    const std::string placement = out.input_ids.placement_string();  // "device 3 (host 0, fsdp=3) holds [...]"
    const std::string tokens =
        plan_.sequence_split()
            ? fmt::format(" x tokens [{}] in load-balanced order", sharding::ranges_string(tile.sequence.chunks))
            : "";
    log::info("[device_loader] input_ids {}; {} holds rows {}{} (labels{} alike); epoch {} step {}, waited {:.3f} "
              "ms, {} collectives", out.input_ids.type_string(), placement.substr(0, placement.find(" holds ")),
              sharding::range_string(tile.begin, tile.count), tokens, out.document_ids ? ", document_ids" : "",
              batch.cursor.epoch, batch.cursor.step, taken.wait_seconds * 1e3,
              ctx.counters().total_calls() - calls_before);
    if (n == 0) sharding::print_input_batch(ctx, out.input_ids);
  }
  return out;
}

void DataPipeline::log_host_stage(const HostBatch& batch) const {
  const sharding::Shape local_shape = {static_cast<int64_t>(plan_.rows.size()), plan_.local_tokens()};
  const std::string type = sharding::type_string(at::kInt, local_shape, sharding::PartitionSpec::replicated(2));
  const std::string tokens =
      plan_.sequence_split()
          ? fmt::format(" x tokens [{}] in load-balanced order", sharding::ranges_string(plan_.token_ranges()))
          : "";
  log::info("[host_loader] host {}: input_ids {} rows {} (samples {}){}, labels{} alike; epoch {} step {}, read in "
            "{:.3f} ms", host_, type, rows_string(plan_.rows), ids_string(batch.sample_ids), tokens,
            batch.documents_RS.defined() ? ", document_ids" : "", batch.cursor.epoch,
            batch.cursor.step, batch.read_seconds * 1e3);
}

int64_t DataPipeline::vocab_size() const { return dataset_->index().tokenizer.vocab_size; }
std::string DataPipeline::tokenizer_fingerprint() const { return dataset_->index().tokenizer.fingerprint; }
int64_t DataPipeline::num_samples() const { return dataset_->num_samples(); }
int64_t DataPipeline::batches_per_epoch() const { return sampler_.batches_per_epoch(); }

std::string DataPipeline::fingerprint() const {
  const std::string text = identity().dump();
  return fmt::format("{:08x}", crc32c(text.data(), text.size()));
}

nlohmann::json DataPipeline::identity() const {
  const token_shards::ShardIndex& index = dataset_->index();
  nlohmann::json shards = nlohmann::json::array();
  for (const token_shards::ShardEntry& shard : index.shards)  // the CRC as index.json writes it
    shards.push_back({{"file", shard.file}, {"tokens", shard.tokens}, {"crc32c", fmt::format("{:08x}", shard.crc32c)}});
  return {{"tokenizer_fingerprint", index.tokenizer.fingerprint},
          {"total_tokens", index.total_tokens},
          {"shards", shards},
          {"block_size", block_size_},
          {"global_batch_size", global_batch_size_},
          {"seed", seed_},
          {"samples", {samples().first, samples().count}}};
}

nlohmann::json DataPipeline::state(const DataCursor& next) const {
  nlohmann::json state = identity();
  state["epoch"] = next.epoch;
  state["step"] = next.step;
  state["dataset_path"] = dataset_->path().string();  // for the reader; not compared (a dataset may move)
  state["tokenizer"] = dataset_->index().tokenizer.name;  // for `meshtrain generate` and `score`; not compared
  return state;
}

DataCursor DataPipeline::cursor_after(const DataCursor& taken) const {
  if (taken.step + 1 == batches_per_epoch()) return {taken.epoch + 1, 0};
  return {taken.epoch, taken.step + 1};
}

DataCursor DataPipeline::check_state(const nlohmann::json& saved) const {
  MT_USER_CHECK(saved.is_object(), "the saved data state is not a JSON object: {}", json_excerpt(saved));
  std::vector<std::string> problems;
  const nlohmann::json current = identity();
  for (const auto& [field, now] : current.items()) {
    if (!saved.contains(field))
      problems.push_back(fmt::format("{} is missing", field));
    else if (saved.at(field) != now)
      problems.push_back(fmt::format("{}: saved {}, now {}", field, json_excerpt(saved.at(field)), now.dump()));
  }
  for (const char* field : {"epoch", "step"})
    if (!saved.contains(field) || !saved.at(field).is_number_integer())
      problems.push_back(fmt::format("{} is missing or not an integer", field));
  MT_USER_CHECK(problems.empty(),
                "the saved data state does not match this run's data (dataset.path={}), refusing to resume with other "
                "batches: {}", dataset_->path().string(), fmt::join(problems, "; "));
  const DataCursor cursor{saved.at("epoch").get<int64_t>(), saved.at("step").get<int64_t>()};
  MT_USER_CHECK(cursor.epoch >= 0 && cursor.step >= 0 && cursor.step < batches_per_epoch(),
                "the saved data cursor (epoch {}, step {}) is outside the {} batches of an epoch", cursor.epoch,
                cursor.step, batches_per_epoch());
  return cursor;
}

}  // namespace meshtrain::data
