// trainer.cpp — Trainer (a host's set-up and close), DeviceTrainer (a device's model, optimizer and steps),
// train_host.
#include "meshtrain/train/trainer.hpp"

#include "meshtrain/checkpoint/checkpoint_dirs.hpp"
#include "meshtrain/common/build_id.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/common/heap.hpp"
#include "meshtrain/common/host_memory.hpp"
#include "meshtrain/common/log.hpp"
#include "meshtrain/model/compute_matmul.hpp"
#include "meshtrain/model/llama.hpp"
#include "meshtrain/model/moe.hpp"
#include "meshtrain/model/parameter_init.hpp"
#include "meshtrain/plots/metrics_svg.hpp"
#include "meshtrain/runtime/block_cache_allocator.hpp"
#include "meshtrain/runtime/preemption.hpp"
#include "meshtrain/train/grad_clip.hpp"
#include "meshtrain/train/lr_schedule.hpp"
#include "meshtrain/train/mesh_checkpoint.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <signal.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace meshtrain::train {
namespace {

using Clock = std::chrono::steady_clock;
using Fault = settings::FaultInjection::Kind;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Payload bytes per collective kind so far on this device, under metrics.jsonl's names.
std::map<std::string, int64_t> collective_bytes(const runtime::CollectiveCounters& counters) {
  using runtime::Collective;
  return {{"allgather", counters.bytes(Collective::allgather)},
          {"reduce_scatter", counters.bytes(Collective::reduce_scatter)},
          {"allreduce", counters.bytes(Collective::allreduce)},
          {"alltoall", counters.bytes(Collective::all_to_all)},
          {"broadcast", counters.bytes(Collective::broadcast)},
          {"kv_exchange", counters.bytes(Collective::kv_exchange)},
          {"stage_transfer", counters.bytes(Collective::stage_transfer)}};
}

// The batch's document numbers as the model takes them (int64), undefined without data.document_mask.
at::Tensor documents_of(const data::DeviceBatch& batch) {
  return batch.document_ids ? batch.document_ids->local().to(at::kLong) : at::Tensor();
}

// Blocks this thread for good (debug.fault=hang): the watchdog's step timeout must find it.
[[noreturn]] void hang_forever() {
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// The host's peak resident memory against the plan, and what the block cache held (runtime/block_cache_allocator.hpp).
void log_memory_used(int host, const MemoryPlan& plan) {
  const runtime::BlockCacheStats cache = runtime::block_cache_stats();
  log::info("Memory used on host {}: peak resident {} (planned {}); tensors of 256 KiB and more: peak live {}, peak "
            "mapped {} ({} reused, {} mapped, {} resized and {} unmapped to stay under the cap)",
            host, gigabytes(peak_resident_bytes()), gigabytes(plan.host_total()),
            gigabytes(static_cast<int64_t>(cache.peak_live_bytes)),
            gigabytes(static_cast<int64_t>(cache.peak_mapped_bytes)), cache.reused, cache.mapped, cache.resized,
            cache.unmapped);
}

}  // namespace

Trainer::Trainer(const settings::Settings& settings, const mesh::Mesh& mesh, int host, int threads_per_device)
    : settings_(settings), mesh_(mesh), host_(host), threads_per_device_(threads_per_device), schedule_(settings) {
  if (settings_.checkpoint.resume) {
    resume_dir_ = checkpoint::newest_complete_checkpoint(settings_.checkpoints_dir());
    if (resume_dir_) {
      checkpoint::verify_checkpoint_files(*resume_dir_);
      resume_state_ = checkpoint::read_training_state(*resume_dir_);
      const std::vector<std::string> changes = checkpoint::config_changes(*resume_state_, settings_.trajectory());
      MT_USER_CHECK(changes.empty(),
                    "{} was trained with another configuration ({}); resuming would not continue that run. Use "
                    "another output_dir, or checkpoint.resume=false to start over",
                    resume_dir_->string(), fmt::join(changes, "; "));
      start_step_ = resume_state_->step;
    }
  }
  pipeline_ = std::make_unique<data::DataPipeline>(settings_, mesh, host,
                                                   resume_state_ ? &resume_state_->data_state : nullptr);
  MT_USER_CHECK(pipeline_->rows_per_device() % settings_.gradient_accumulation_steps == 0,
                "gradient_accumulation_steps={} does not divide the {} rows each device holds (global_batch_size {} "
                "over the mesh)", settings_.gradient_accumulation_steps, pipeline_->rows_per_device(),
                settings_.global_batch_size);
  // A pipeline's layout errors before any device starts; its lines are logged by start().
  pipeline_lines_ =
      parallel::describe_pipeline(settings_, mesh, pipeline_->rows_per_device() / settings_.gradient_accumulation_steps);
  if (settings_.eval.enabled()) {
    eval_pipeline_ = std::make_unique<data::DataPipeline>(settings_, mesh, host, nullptr,
                                                          data::DataPipeline::Purpose::evaluation);
    MT_USER_CHECK(eval_pipeline_->tokenizer_fingerprint() == pipeline_->tokenizer_fingerprint(),
                  "eval.dataset={} was tokenized with {}, the training data with {}: its eval loss would not compare; "
                  "prepare it with the training data's tokenizer", settings_.eval.dataset,
                  eval_pipeline_->tokenizer_fingerprint(), pipeline_->tokenizer_fingerprint());
  }
  const config::LlamaConfig& model_config = settings_.model;
  MT_USER_CHECK(model_config.vocab_size >= pipeline_->vocab_size(),
                "the model's vocab_size ({}) is smaller than the vocabulary of the dataset's tokenizer ({}, {}): pick "
                "a model and dataset that fit (model=llama-tiny with dataset=moby-dick-byte), or widen the model "
                "(model.vocab_size=50304 for dataset=moby-dick-gpt2)", model_config.vocab_size,
                pipeline_->vocab_size(), pipeline_->tokenizer_fingerprint());
  runtime::set_block_cache_slack(settings_.memory.cache_slack);
  memory_plan_ = plan_memory(settings_, memory_layout(settings_, mesh, pipeline_->spec()));
  log::info("Memory plan: {}", memory_plan_.describe());
  if (settings_.memory.check) check_memory_fits(settings_, memory_plan_, available_memory());
  if (host_ == 0)  // host 0 decides the MFU denominator for every host
    mfu_peak_ = decide_peak_flops(settings_.metrics.peak_gflops, model::torch_dtype(settings_.compute_dtype),
                                  threads_per_device_)
                    .to_json();
}

runtime::JobFacts Trainer::job_facts() const {
  runtime::JobFacts facts;
  facts.config = settings_.host_shared();
  facts.build = build_id();
  facts.mfu_peak = mfu_peak_;
  facts.dataset = pipeline_->fingerprint();
  const data::DataCursor cursor = pipeline_->start_cursor();
  facts.resume = resume_state_ ? fmt::format("step {} (data epoch {} step {})", start_step_, cursor.epoch, cursor.step)
                               : "none (a new run)";
  // Every device writes its own checkpoint files and resumes from all of them: the hosts need one storage.
  if (mesh_.hosts() > 1) facts.shared_dir = fs::absolute(settings_.output_dir).string();
  return facts;
}

bool Trainer::start(const runtime::JobFacts& agreed) {
  if (start_step_ >= settings_.max_steps) {
    log::info("Nothing to train: {} is at step {} and max_steps={} (use another output_dir, or "
              "checkpoint.resume=false to start over)", resume_dir_->string(), start_step_, settings_.max_steps);
    return false;
  }
  if (resume_dir_)
    log::info("Resuming from {} (step {}, data epoch {} step {})", resume_dir_->string(), start_step_,
              pipeline_->start_cursor().epoch, pipeline_->start_cursor().step);

  const PeakFlops peak = PeakFlops::from_json(agreed.mfu_peak, "host 0's MFU peak");
  log::info("{}", peak.describe());
  metrics_ = std::make_unique<MetricsLogger>(settings_, host_ == 0, peak, first_step());
  const config::LlamaConfig& model_config = settings_.model;
  const int64_t global_tokens = settings_.tokens_per_step();
  log::info("Training a {} of {} layers x {} hidden ({} parameters{}), steps {}..{}: global batch {} x {} = {} tokens "
            "per step, {} micro-batch{} per step, {} on {} devices", model_config.is_moe() ? "Mixtral" : "Llama",
            model_config.num_hidden_layers, model_config.hidden_size, model_config.parameter_count(),
            model_config.is_moe() ? fmt::format(", {} active: {} experts per layer, top-{}",
                                                model_config.active_parameter_count(), model_config.num_local_experts,
                                                model_config.num_experts_per_tok)
                                  : "",
            first_step(), settings_.max_steps, settings_.global_batch_size, settings_.block_size, global_tokens,
            settings_.gradient_accumulation_steps, settings_.gradient_accumulation_steps == 1 ? "" : "es",
            settings_.compute_dtype == settings::ComputeDtype::bfloat16 ? "bf16 matmuls" : "fp32", mesh_.num_devices());

  for (const std::string& line : pipeline_lines_) log::info("{}", line);

  // Where the parameters' values come from; each device asks for its own pieces only (sharded initialization).
  // The resume point's files were verified when it was found.
  if (resume_dir_)
    checkpoint_weights_.emplace(model::CheckpointTensors::weights(*resume_dir_, model_config, checkpoint::Verify::no));
  else if (!settings_.checkpoint.init_from.empty()) {
    const Clock::time_point verify_start = Clock::now();
    checkpoint_weights_.emplace(
        model::CheckpointTensors::weights(settings_.checkpoint.init_from, model_config, checkpoint::Verify::against_marker));
    log::info("Initial weights from {}: its files checked against the completion marker in {:.2f} s",
              settings_.checkpoint.init_from, seconds_since(verify_start));
  }
  initial_values_ = checkpoint_weights_ ? checkpoint_weights_->source()
                                        : model::initial_value_source(model_config, settings_.seed);
  return true;
}

void Trainer::finish() {
  if (const int64_t step = preempted_at_step(); step > 0)
    log::info("Host {}: preempted at step {}; saved {}", host_, step,
              checkpoint::checkpoint_dir_for_step(settings_.checkpoints_dir(), step).string());
  else
    log::info("Training finished on host {} at step {}", host_, settings_.max_steps);
  log_memory_used(host_, memory_plan_);
  if (host_ == 0) {
    log::info("Plot of the run: {} (`meshtrain plot {}` redraws it)",
              plots::plot_metrics(settings_.output_dir).string(), settings_.output_dir.string());
    if (settings_.metrics.tensorboard)
      log::info("TensorBoard: tensorboard --logdir {}", settings_.output_dir.string());
  }
}

DeviceTrainer::DeviceTrainer(Trainer& run, runtime::DeviceContext& ctx)
    : run_(run), settings_(run.settings_), ctx_(ctx), reporter_(ctx.info().local == 0) {
  MT_CHECK(run.metrics_, "Trainer::start() must come before a DeviceTrainer");
  const Clock::time_point build_start = Clock::now();
  {
    // Built without parameter storage: ParallelModel gives each parameter only this device's pieces.
    const model::ParametersWithoutStorage without_storage;
    auto model = std::make_shared<model::LlamaForCausalLM>(settings_.model);
    model->set_compute_dtype(model::torch_dtype(settings_.compute_dtype));
    model_.emplace(model, ctx, parallel::ParallelOptions::from(settings_), run.initial_values_);
  }
  optimizer_.emplace(settings_.optimizer, model_->parameter_shards());
  if (run.resume_dir_) load_optimizer_state(*run.resume_dir_, *model_, *optimizer_);
  if (ctx.device() == 0) {
    log::info("Device 0's parameters ({}) and optimizer state ready in {:.2f} s",
              run.checkpoint_weights_ ? "read from the checkpoint" : "initialized", seconds_since(build_start));
    log::info("Memory: {}", model_->memory_summary());
  }
  // A step's objective averages the load-balancing loss over its micro-batches.
  if (model::RouterStats* router_stats = model_->model().router_stats().get())
    router_stats->set_objective_weight(1.0 / static_cast<double>(settings_.gradient_accumulation_steps));
  ctx.report_progress(run.start_step_);
}

void DeviceTrainer::train() {
  for (int64_t step = run_.first_step(); step <= settings_.max_steps; ++step) {
    const StepMetrics metrics = train_step(step);
    if (reporter_) run_.metrics_->log(metrics);
    ctx_.report_progress(step);
    if (run_.eval_pipeline_ && (step % settings_.eval.every_steps == 0 || step == settings_.max_steps)) {
      const EvalMetrics eval = evaluate(step);
      if (reporter_) run_.metrics_->log_eval(eval);
      ctx_.report_progress(step);
    }
    // A stop signal on any host (runtime/preemption.hpp): every device saves this step and stops after it.
    const bool preempted = runtime::agree_on_preemption(ctx_.world());
    if ((settings_.checkpoint.save_steps > 0 && step % settings_.checkpoint.save_steps == 0) || step == settings_.max_steps || preempted) {
      save(step, run_.pipeline_->cursor_after(last_cursor_));
      ctx_.report_progress(step);
    }
    if (preempted) {
      run_.preempted_at_step_.store(step);
      break;
    }
  }
  if (reporter_) {
    run_.metrics_->finish();
    log::info("device {} (host {}): collectives issued: {}", ctx_.device(), ctx_.host(), ctx_.counters().summary());
  }
}

StepMetrics DeviceTrainer::train_step(int64_t step) {
  if (settings_.debug.fault.fires(Fault::throw_error, step, ctx_.device()))
    throw Error(fmt::format("fault injected at step {} (debug.fault=throw)", step));
  if (settings_.debug.fault.fires(Fault::hang, step, ctx_.device())) hang_forever();
  if (settings_.debug.fault.fires(Fault::kill, step, ctx_.device())) ::kill(::getpid(), SIGKILL);
  const Clock::time_point step_start = Clock::now();
  const runtime::CollectiveCounters& counters = ctx_.counters();
  const double comm_before = counters.total_seconds();
  const double alltoall_before = counters.seconds(runtime::Collective::all_to_all);
  const double kv_exchange_before = counters.seconds(runtime::Collective::kv_exchange);
  const std::map<std::string, int64_t> bytes_before = collective_bytes(counters);
  const int64_t global_tokens = settings_.tokens_per_step();
  const int64_t micro_batches = settings_.gradient_accumulation_steps;

  const data::DeviceBatch batch = run_.pipeline_->next(ctx_);
  last_cursor_ = batch.cursor;
  const double replicas = static_cast<double>(run_.pipeline_->row_replicas());
  const std::vector<at::Tensor> input_chunks = batch.input_ids.local().to(at::kLong).chunk(micro_batches, 0);
  const std::vector<at::Tensor> label_chunks = batch.labels.local().to(at::kLong).chunk(micro_batches, 0);
  const at::Tensor documents_BT = documents_of(batch);
  const std::vector<at::Tensor> document_chunks =
      documents_BT.defined() ? documents_BT.chunk(micro_batches, 0) : std::vector<at::Tensor>(micro_batches);
  model::RouterStats* router_stats = model_->model().router_stats().get();
  std::optional<StepMetrics::Routing> routing;
  if (router_stats) {
    routing.emplace();
    routing->expert_load.assign(settings_.model.num_local_experts, 0.0);
  }
  double local_loss_sum = 0;
  for (int64_t micro = 0; micro < micro_batches; ++micro) {
    local_loss_sum += model_->forward_backward(input_chunks[micro], label_chunks[micro], document_chunks[micro],
                                               1.0 / (static_cast<double>(global_tokens) * replicas));
    if (routing) {  // the global batch's routing (replicated rows counted once)
      routing->aux_loss += router_stats->aux_loss() / static_cast<double>(micro_batches);
      routing->dropped_fraction += router_stats->dropped_fraction() / static_cast<double>(micro_batches);
      const double* routed_E = router_stats->routed_slots().data_ptr<double>();
      for (size_t e = 0; e < routing->expert_load.size(); ++e) routing->expert_load[e] += routed_E[e] / replicas;
    }
    // The micro-batch's small buffers (common/heap.hpp says why); one trim serves the whole process.
    if (reporter_) release_freed_heap_memory();
  }
  model_->synchronize_gradients();
  const double grad_norm = model_->gradient_norm();
  std::vector<at::Tensor> grads = model_->gradient_shards();
  scale_(grads, clip_coefficient(grad_norm, settings_.max_grad_norm));
  const double lr = run_.schedule_.at(step);
  optimizer_->step(grads, lr);
  model_->zero_gradients();
  if (reporter_) release_freed_heap_memory();
  at::Tensor loss = at::tensor({local_loss_sum}, at::kDouble);
  model_->loss_comm().allreduce_sum(loss);
  std::vector<double> stage_waits = model_->take_stage_wait_seconds();

  StepMetrics metrics;
  metrics.step = step;
  metrics.epoch = batch.cursor.epoch;
  metrics.loss = loss.item<double>() / replicas / static_cast<double>(global_tokens);
  metrics.grad_norm = grad_norm;
  metrics.learning_rate = lr;
  metrics.step_seconds = seconds_since(step_start);
  metrics.data_wait_seconds = batch.wait_seconds;
  metrics.comm_seconds = counters.total_seconds() - comm_before;
  metrics.compute_seconds = std::max(0.0, metrics.step_seconds - metrics.data_wait_seconds - metrics.comm_seconds);
  metrics.tokens = global_tokens;
  metrics.num_devices = ctx_.mesh().num_devices();
  metrics.flops_per_token = static_cast<double>(settings_.model.training_flops_per_token(settings_.block_size));
  if (routing) routing->alltoall_seconds = counters.seconds(runtime::Collective::all_to_all) - alltoall_before;
  metrics.routing = routing;
  if (!stage_waits.empty()) metrics.pipeline_bubble_seconds = std::move(stage_waits);
  if (ctx_.mesh().size(mesh::Axis::context) > 1)
    metrics.kv_exchange_seconds = counters.seconds(runtime::Collective::kv_exchange) - kv_exchange_before;
  metrics.comm_bytes = collective_bytes(counters);
  for (auto& [kind, bytes] : metrics.comm_bytes) bytes -= bytes_before.at(kind);
  return metrics;
}

EvalMetrics DeviceTrainer::evaluate(int64_t step) {
  MT_CHECK(run_.eval_pipeline_, "evaluate() in a run without evaluation (eval.every_steps=0)");
  data::DataPipeline& eval_pipeline = *run_.eval_pipeline_;
  const Clock::time_point start = Clock::now();
  const torch::NoGradGuard no_grad;
  double local_loss_sum = 0;
  for (int64_t b = 0; b < eval_pipeline.batches_per_epoch(); ++b) {
    const data::DeviceBatch batch = eval_pipeline.next(ctx_);
    local_loss_sum += model_->evaluation_loss_sum(batch.input_ids.local().to(at::kLong),
                                                  batch.labels.local().to(at::kLong), documents_of(batch));
  }
  if (reporter_) release_freed_heap_memory();
  at::Tensor loss = at::tensor({local_loss_sum}, at::kDouble);
  model_->loss_comm().allreduce_sum(loss);
  model_->take_stage_wait_seconds();  // the evaluation's waits are not a training step's bubble
  EvalMetrics metrics;
  metrics.step = step;
  metrics.tokens = eval_pipeline.batches_per_epoch() * settings_.tokens_per_step();
  metrics.loss = loss.item<double>() / static_cast<double>(eval_pipeline.row_replicas()) /
                 static_cast<double>(metrics.tokens);
  metrics.seconds = seconds_since(start);
  return metrics;
}

void DeviceTrainer::save(int64_t step, const data::DataCursor& next) {
  const checkpoint::TrainingState state =
      checkpoint::TrainingState::at_step(settings_.trajectory(), settings_.seed, step,
                                         step * settings_.tokens_per_step(),
                                         run_.pipeline_->state(next));
  const bool die_in_save = settings_.debug.fault.fires(Fault::kill_in_save, step, ctx_.device());
  save_mesh_checkpoint(checkpoint::checkpoint_dir_for_step(settings_.checkpoints_dir(), step), ctx_, *model_, *optimizer_,
                       state, [&] {
                         if (die_in_save) ::kill(::getpid(), SIGKILL);
                       });
  if (ctx_.device() == 0) checkpoint::remove_old_checkpoints(settings_.checkpoints_dir(), settings_.checkpoint.keep);
}

void train_host(const settings::Settings& settings, const mesh::Mesh& mesh, int host, runtime::HostRuntime& runtime) {
  Trainer trainer(settings, mesh, host, runtime.threads_per_device());
  if (!trainer.start(runtime.agree_on_job(trainer.job_facts()))) return;
  runtime.run_on_devices([&](runtime::DeviceContext& ctx) { DeviceTrainer(trainer, ctx).train(); });
  trainer.finish();
}

}  // namespace meshtrain::train
