// trainer.cpp — train_host: resume, the data pipeline, and the SPMD training step on every local device.
#include "meshtrain/train/trainer.hpp"

#include "meshtrain/checkpoint/checkpoint_dirs.hpp"
#include "meshtrain/checkpoint/training_state.hpp"
#include "meshtrain/common/build_id.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/common/heap.hpp"
#include "meshtrain/common/host_memory.hpp"
#include "meshtrain/common/json_read.hpp"
#include "meshtrain/common/log.hpp"
#include "meshtrain/data/pipeline.hpp"
#include "meshtrain/model/hf_checkpoint.hpp"
#include "meshtrain/model/llama.hpp"
#include "meshtrain/model/moe.hpp"
#include "meshtrain/model/parameter_init.hpp"
#include "meshtrain/parallel/parallel_model.hpp"
#include "meshtrain/plots/metrics_svg.hpp"
#include "meshtrain/runtime/block_cache_allocator.hpp"
#include "meshtrain/runtime/preemption.hpp"
#include "meshtrain/train/adamw.hpp"
#include "meshtrain/train/grad_clip.hpp"
#include "meshtrain/train/lr_schedule.hpp"
#include "meshtrain/train/memory_plan.hpp"
#include "meshtrain/train/mesh_checkpoint.hpp"
#include "meshtrain/train/metrics.hpp"
#include "meshtrain/train/train_settings.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include <signal.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace meshtrain::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

struct ResumePoint {
  fs::path dir;
  checkpoint::TrainingState state;
};

std::optional<ResumePoint> find_resume_point(const TrainSettings& settings) {
  if (!settings.resume) return std::nullopt;
  const std::optional<fs::path> dir = checkpoint::newest_complete_checkpoint(settings.checkpoints);
  if (!dir) return std::nullopt;
  checkpoint::verify_checkpoint_files(*dir);
  ResumePoint point{*dir, checkpoint::read_training_state(*dir)};
  const std::vector<std::string> changes = checkpoint::config_changes(point.state, settings.trajectory);
  MT_USER_CHECK(changes.empty(),
                "{} was trained with another configuration ({}); resuming would not continue that run. Use another "
                "output_dir, or checkpoint.resume=false to start over",
                dir->string(), fmt::join(changes, "; "));
  return point;
}

// What this host would run, for the hosts to compare before any collective (runtime/job_agreement.hpp).
runtime::JobFacts job_facts(const config::Config& config, const mesh::Mesh& mesh, const TrainSettings& settings,
                            const data::DataPipeline& pipeline, const std::optional<ResumePoint>& resume,
                            const data::DataCursor& start_cursor) {
  runtime::JobFacts facts;
  facts.config = runtime::shared_config(config.leaf_values());
  facts.build = build_id();
  facts.dataset = pipeline.fingerprint();
  facts.resume = resume ? fmt::format("step {} (data epoch {} step {})", resume->state.step, start_cursor.epoch,
                                      start_cursor.step)
                        : "none (a new run)";
  // Every device writes its own checkpoint files and resumes from all of them: the hosts need one storage.
  if (mesh.hosts() > 1) facts.shared_dir = fs::absolute(settings.output_dir).string();
  return facts;
}

// Payload bytes per collective kind so far on this device, under metrics.jsonl's names.
std::map<std::string, int64_t> collective_bytes(const runtime::CollectiveCounters& counters) {
  using runtime::Collective;
  return {{"allgather", counters.bytes(Collective::allgather)},
          {"reduce_scatter", counters.bytes(Collective::reduce_scatter)},
          {"allreduce", counters.bytes(Collective::allreduce)},
          {"alltoall", counters.bytes(Collective::all_to_all)},
          {"broadcast", counters.bytes(Collective::broadcast)}};
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

void train_host(const config::Config& config, const mesh::Mesh& mesh, int host, runtime::HostRuntime& runtime) {
  // Everything the device threads read is resolved here, on the main thread (config.hpp says why).
  const TrainSettings settings = TrainSettings::from_config(config);
  const config::LlamaConfig& model_config = settings.model;
  using Fault = FaultInjection::Kind;

  const std::optional<ResumePoint> resume = find_resume_point(settings);
  const int64_t start_step = resume ? resume->state.step : 0;
  data::DataCursor start_cursor;
  if (resume) {
    const nlohmann::json& saved = resume->state.data_state;
    MT_USER_CHECK(saved.is_object() && saved.contains("epoch") && saved["epoch"].is_number_integer() &&
                      saved.contains("step") && saved["step"].is_number_integer(),
                  "{}: data_state must hold the integer fields epoch and step, got {}",
                  (resume->dir / checkpoint::kTrainingStateFile).string(), json_excerpt(saved));
    start_cursor = {saved["epoch"].get<int64_t>(), saved["step"].get<int64_t>()};
  }
  data::DataPipeline pipeline(config, mesh, host, start_cursor);
  if (resume) MT_CHECK(pipeline.check_state(resume->state.data_state) == start_cursor, "the resumed data cursor moved");
  std::optional<data::DataPipeline> eval_pipeline;
  if (settings.eval_every_steps > 0) {
    eval_pipeline.emplace(config, mesh, host, data::DataCursor{}, data::DataPipeline::Purpose::evaluation);
    MT_USER_CHECK(eval_pipeline->tokenizer_fingerprint() == pipeline.tokenizer_fingerprint(),
                  "eval.dataset={} was tokenized with {}, the training data with {}: its eval loss would not compare; "
                  "prepare it with the training data's tokenizer", config.get_string("eval.dataset"),
                  eval_pipeline->tokenizer_fingerprint(), pipeline.tokenizer_fingerprint());
  }
  MT_USER_CHECK(model_config.vocab_size >= pipeline.vocab_size(),
                "the model's vocab_size ({}) is smaller than the vocabulary of the dataset's tokenizer ({}, {}): pick "
                "a model and dataset that fit (model=llama-tiny with dataset=moby-dick-byte), or widen the model "
                "(model.vocab_size=50304 for dataset=moby-dick-gpt2)", model_config.vocab_size, pipeline.vocab_size(),
                pipeline.tokenizer_fingerprint());
  const double cache_slack = config.get_float("memory.cache_slack");
  MT_USER_CHECK(cache_slack >= 0, "memory.cache_slack={}: expected a fraction of the peak of live tensor bytes, >= 0 "
                "(0.5 by default; less trades step time for a lower peak: configs/defaults.yaml)", cache_slack);
  runtime::set_block_cache_slack(cache_slack);
  const MemoryPlan memory_plan = plan_memory(settings, memory_layout(config, settings, mesh));
  log::info("Memory plan: {}", memory_plan.describe());
  if (config.get_bool("memory.check")) check_memory_fits(settings, memory_plan, available_memory());
  runtime.agree_on_job(job_facts(config, mesh, settings, pipeline, resume, start_cursor));
  if (start_step >= settings.max_steps) {
    log::info("Nothing to train: {} is at step {} and max_steps={} (use another output_dir, or "
              "checkpoint.resume=false to start over)", resume->dir.string(), start_step, settings.max_steps);
    return;
  }
  if (resume)
    log::info("Resuming from {} (step {}, data epoch {} step {})", resume->dir.string(), start_step,
              start_cursor.epoch, start_cursor.step);

  MetricsLogger metrics(config, host == 0,
                        peak_flops_per_device(config, settings.compute_dtype, runtime.threads_per_device()),
                        start_step + 1);
  const int64_t global_tokens = settings.global_batch_size * settings.block_size;
  log::info("Training a {} of {} layers x {} hidden ({} parameters{}), steps {}..{}: global batch {} x {} = {} tokens "
            "per step, {} micro-batch{} per step, {} on {} devices", model_config.is_moe() ? "Mixtral" : "Llama",
            model_config.num_hidden_layers, model_config.hidden_size, model_config.parameter_count(),
            model_config.is_moe() ? fmt::format(", {} active: {} experts per layer, top-{}",
                                                model_config.active_parameter_count(), model_config.num_local_experts,
                                                model_config.num_experts_per_tok)
                                  : "",
            start_step + 1, settings.max_steps,
            settings.global_batch_size, settings.block_size, global_tokens, settings.micro_batches,
            settings.micro_batches == 1 ? "" : "es",
            settings.compute_dtype == torch::kBFloat16 ? "bf16 matmuls" : "fp32", mesh.num_devices());

  // Where the parameters' values come from; each device asks for its own pieces only (sharded initialization).
  // The resume point's files were verified by find_resume_point.
  std::optional<model::CheckpointTensors> checkpoint_weights;
  if (resume)
    checkpoint_weights.emplace(
        model::CheckpointTensors::weights(resume->dir, model_config, checkpoint::Verify::no));
  else if (!settings.init_from.empty())
    checkpoint_weights.emplace(model::CheckpointTensors::weights(settings.init_from, model_config,
                                                                 checkpoint::Verify::against_marker));
  const model::SliceSource initial_values =
      checkpoint_weights ? checkpoint_weights->source() : model::initial_value_source(model_config, settings.seed);

  // Shared by the device threads: `settings` (immutable), `pipeline` and `eval_pipeline` (their next() is
  // thread-safe), `metrics` (used by the reporter thread only), `resume` (read only), `checkpoint_weights` (const
  // reads, each a pread).
  std::atomic<int64_t> preempted_at_step{0};  // the step every device stopped after, when a stop signal came
  runtime.run_on_devices([&](runtime::DeviceContext& ctx) {
    const bool reporter = ctx.info().local == 0;
    // Built without parameter storage: ParallelModel gives each parameter only this device's pieces.
    std::optional<parallel::ParallelModel> built;
    {
      const model::ParametersWithoutStorage without_storage;
      auto model = std::make_shared<model::LlamaForCausalLM>(model_config);
      model->set_compute_dtype(settings.compute_dtype);
      built.emplace(model, ctx, settings.parallel, initial_values);
    }
    parallel::ParallelModel& parallel_model = *built;
    AdamW optimizer(settings.adamw, parallel_model.parameter_shards());
    if (resume) load_optimizer_state(resume->dir, parallel_model, optimizer);
    if (ctx.device() == 0) log::info("Memory: {}", parallel_model.memory_summary());
    runtime::Comm& batch_comm = parallel_model.batch_comm();
    model::RouterStats* router_stats = parallel_model.model().router_stats().get();
    // A step's objective averages the load-balancing loss over its micro-batches.
    if (router_stats) router_stats->set_objective_weight(1.0 / static_cast<double>(settings.micro_batches));
    ctx.report_progress(start_step);

    // The mean loss over one round of held-out batches with the weights after `step`: forward only, on the training
    // mesh and read plan; the sums all-reduced like the training loss's.
    auto evaluate = [&](int64_t step) {
      const Clock::time_point start = Clock::now();
      const torch::NoGradGuard no_grad;
      double local_loss_sum = 0;
      const double replicas = static_cast<double>(eval_pipeline->row_replicas());
      for (int64_t b = 0; b < eval_pipeline->batches_per_epoch(); ++b) {
        const data::DeviceBatch batch = eval_pipeline->next(ctx);
        local_loss_sum += parallel_model
                              .loss_sum(batch.input_ids.local().to(at::kLong), batch.labels.local().to(at::kLong))
                              .item<double>();
      }
      if (reporter) release_freed_heap_memory();
      at::Tensor loss = at::tensor({local_loss_sum}, at::kDouble);
      batch_comm.allreduce_sum(loss);
      EvalMetrics m;
      m.step = step;
      m.tokens = eval_pipeline->batches_per_epoch() * global_tokens;
      m.loss = loss.item<double>() / replicas / static_cast<double>(m.tokens);
      m.seconds = seconds_since(start);
      if (reporter) metrics.log_eval(m);
      ctx.report_progress(step);
    };

    for (int64_t step = start_step + 1; step <= settings.max_steps; ++step) {
      if (settings.fault.fires(Fault::throw_error, step, ctx.device()))
        throw Error(fmt::format("fault injected at step {} (debug.fault=throw)", step));
      if (settings.fault.fires(Fault::hang, step, ctx.device())) hang_forever();
      if (settings.fault.fires(Fault::kill, step, ctx.device())) ::kill(::getpid(), SIGKILL);
      const Clock::time_point step_start = Clock::now();
      const double comm_before = ctx.counters().total_seconds();
      const double alltoall_before = ctx.counters().seconds(runtime::Collective::all_to_all);
      const std::map<std::string, int64_t> bytes_before = collective_bytes(ctx.counters());
      data::DeviceBatch batch = pipeline.next(ctx);
      const double replicas = static_cast<double>(pipeline.row_replicas());
      const at::Tensor inputs_BT = batch.input_ids.local().to(at::kLong);
      const at::Tensor labels_BT = batch.labels.local().to(at::kLong);
      MT_USER_CHECK(inputs_BT.size(0) % settings.micro_batches == 0,
                    "gradient_accumulation_steps={} does not divide the {} rows each device holds (global_batch_size "
                    "{} over the mesh)", settings.micro_batches, inputs_BT.size(0), settings.global_batch_size);
      double local_loss_sum = 0;
      std::optional<StepMetrics::Routing> routing;
      if (router_stats) routing.emplace().expert_load.assign(model_config.num_local_experts, 0.0);
      const std::vector<at::Tensor> input_chunks = inputs_BT.chunk(settings.micro_batches, 0);
      const std::vector<at::Tensor> label_chunks = labels_BT.chunk(settings.micro_batches, 0);
      for (int64_t m = 0; m < settings.micro_batches; ++m) {
        const at::Tensor loss_sum = parallel_model.loss_sum(input_chunks[m], label_chunks[m]);
        if (routing) {  // the global batch's routing (replicated rows counted once)
          routing->aux_loss += router_stats->aux_loss() / static_cast<double>(settings.micro_batches);
          routing->dropped_fraction += router_stats->dropped_fraction() / static_cast<double>(settings.micro_batches);
          const double* routed_E = router_stats->routed_slots().data_ptr<double>();
          for (size_t e = 0; e < routing->expert_load.size(); ++e) routing->expert_load[e] += routed_E[e] / replicas;
        }
        (loss_sum / (static_cast<double>(global_tokens) * replicas)).backward();
        parallel_model.finish_backward();
        local_loss_sum += loss_sum.item<double>();
        // The micro-batch's small buffers (common/heap.hpp says why); one trim serves the whole process.
        if (reporter) release_freed_heap_memory();
      }
      parallel_model.synchronize_gradients();
      const double grad_norm = parallel_model.gradient_norm();
      std::vector<at::Tensor> grads = parallel_model.gradient_shards();
      scale_(grads, clip_coefficient(grad_norm, settings.max_grad_norm));
      const double lr = settings.schedule.at(step);
      optimizer.step(grads, lr);
      parallel_model.zero_gradients();
      if (reporter) release_freed_heap_memory();
      at::Tensor loss = at::tensor({local_loss_sum}, at::kDouble);
      batch_comm.allreduce_sum(loss);

      StepMetrics m;
      m.step = step;
      m.epoch = batch.cursor.epoch;
      m.loss = loss.item<double>() / replicas / static_cast<double>(global_tokens);
      m.grad_norm = grad_norm;
      m.learning_rate = lr;
      m.step_seconds = seconds_since(step_start);
      m.data_wait_seconds = batch.wait_seconds;
      m.comm_seconds = ctx.counters().total_seconds() - comm_before;
      m.compute_seconds = std::max(0.0, m.step_seconds - m.data_wait_seconds - m.comm_seconds);
      m.tokens = global_tokens;
      m.num_devices = ctx.mesh().num_devices();
      m.flops_per_token = static_cast<double>(model_config.training_flops_per_token(settings.block_size));
      if (routing)
        routing->alltoall_seconds = ctx.counters().seconds(runtime::Collective::all_to_all) - alltoall_before;
      m.routing = routing;
      m.comm_bytes = collective_bytes(ctx.counters());
      for (auto& [kind, bytes] : m.comm_bytes) bytes -= bytes_before.at(kind);
      if (reporter) metrics.log(m);
      ctx.report_progress(step);
      if (eval_pipeline && (step % settings.eval_every_steps == 0 || step == settings.max_steps)) evaluate(step);

      // A stop signal on any host (runtime/preemption.hpp): every device saves this step and stops after it.
      const bool preempted = runtime::agree_on_preemption(ctx.world());
      if ((settings.save_steps > 0 && step % settings.save_steps == 0) || step == settings.max_steps || preempted) {
        data::DataCursor next = batch.cursor;
        if (++next.step == pipeline.batches_per_epoch()) next = {next.epoch + 1, 0};
        const checkpoint::TrainingState state = checkpoint::TrainingState::at_step(settings.trajectory, settings.seed, step,
                                                           step * global_tokens, pipeline.state(next));
        const bool die_in_save = settings.fault.fires(Fault::kill_in_save, step, ctx.device());
        save_mesh_checkpoint(checkpoint::checkpoint_dir_for_step(settings.checkpoints, step), ctx, parallel_model, optimizer,
                             state, [&] {
                               if (die_in_save) ::kill(::getpid(), SIGKILL);
                             });
        if (ctx.device() == 0) checkpoint::remove_old_checkpoints(settings.checkpoints, settings.keep);
        ctx.report_progress(step);
      }
      if (preempted) {
        preempted_at_step.store(step);
        break;
      }
    }
    if (reporter) {
      metrics.finish();
      log::info("device {} (host {}): collectives issued: {}", ctx.device(), ctx.host(), ctx.counters().summary());
    }
  });
  if (const int64_t step = preempted_at_step.load(); step > 0)
    log::info("Host {}: preempted at step {}; saved {}", host, step,
              checkpoint::checkpoint_dir_for_step(settings.checkpoints, step).string());
  else
    log::info("Training finished on host {} at step {}", host, settings.max_steps);
  log_memory_used(host, memory_plan);
  if (host == 0) {
    log::info("Plot of the run: {} (`meshtrain plot {}` redraws it)", plots::plot_metrics(settings.output_dir).string(),
              settings.output_dir.string());
    if (config.get_bool("metrics.tensorboard"))
      log::info("TensorBoard: tensorboard --logdir {}", settings.output_dir.string());
  }
}

}  // namespace meshtrain::train
