// settings.cpp — Settings::from_config: every config key, read by name, declared with its attributes and checked, in
// the order of configs/defaults.yaml.
#include "meshtrain/settings/settings.hpp"

#include "meshtrain/common/error.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace meshtrain::settings {

// What a key means beyond its value (KeyAttributes). How a run lays itself out over devices (the mesh, the input
// sharding, parallel.*, memory, how bf16 matmuls run) does not change what it computes: a run may resume on another
// mesh or CPU. What evaluation changes in the training data (the held-out split) is in the data state.
namespace {
constexpr KeyAttributes kResult{/*changes_results=*/true, /*may_differ_between_hosts=*/false};
constexpr KeyAttributes kLayout{/*changes_results=*/false, /*may_differ_between_hosts=*/false};
constexpr KeyAttributes kHostLocal{/*changes_results=*/false, /*may_differ_between_hosts=*/true};
// Each host names its copy of the data; the data's identity (files, counts, checksums) is compared instead.
constexpr KeyAttributes kHostLocalResult{/*changes_results=*/true, /*may_differ_between_hosts=*/true};
}  // namespace

// Reads keys of one Config into one Settings, declaring each key it reads.
class KeyReader {
 public:
  KeyReader(const config::Config& config, Settings& settings)
      : config_(config), settings_(settings), leaf_values_(config.leaf_values()) {}

  int64_t integer(const std::string& key, KeyAttributes attributes) {
    declare(key, attributes);
    return config_.get_int(key);
  }
  int integer32(const std::string& key, KeyAttributes attributes) {
    const int64_t value = integer(key, attributes);
    MT_USER_CHECK(value >= INT32_MIN && value <= INT32_MAX, "{}={}: out of range", key, value);
    return static_cast<int>(value);
  }
  double real(const std::string& key, KeyAttributes attributes) {
    declare(key, attributes);
    const double value = config_.get_float(key);
    MT_USER_CHECK(std::isfinite(value), "{}={}: expected a finite number", key, value);
    return value;
  }
  bool boolean(const std::string& key, KeyAttributes attributes) {
    declare(key, attributes);
    return config_.get_bool(key);
  }
  std::string text(const std::string& key, KeyAttributes attributes) {  // null reads as ""
    declare(key, attributes);
    return config_.get_string(key);
  }
  // A key a config group may leave out or set to null (a model's optional fields): false then.
  bool present(const std::string& key, KeyAttributes attributes) {
    if (!config_.has(key)) return false;
    declare(key, attributes);
    return !config_.node(key).IsNull();
  }
  // One of `names` (each with its value); UserError naming the key and the choices otherwise.
  template <typename T>
  T choice(const std::string& key, KeyAttributes attributes, std::initializer_list<std::pair<const char*, T>> names) {
    const std::string value = text(key, attributes);
    for (const auto& [name, result] : names)
      if (value == name) return result;
    std::string expected;
    size_t i = 0;
    for (const auto& entry : names) {
      expected += ++i == 1 ? "" : i == names.size() ? " or " : ", ";
      expected += entry.first;
    }
    throw UserError(fmt::format("{}={}: expected {}", key, value, expected));
  }
  // Declares a key that sets no value (a config group's name).
  void declare(const std::string& key, KeyAttributes attributes) {
    auto leaf = leaf_values_.find(key);
    if (leaf != leaf_values_.end()) settings_.keys_[key] = {leaf->second, attributes};
  }

  // After every read: a key nobody declared is one meshtrain does not read (a config group's extra key).
  void check_every_key_declared() const {
    for (const auto& [key, value] : leaf_values_)
      MT_USER_CHECK(settings_.keys_.count(key) > 0,
                    "config key {} is not one meshtrain reads: remove it from its config file", key);
  }

 private:
  const config::Config& config_;
  Settings& settings_;
  const std::map<std::string, std::string> leaf_values_;
};

namespace {

config::LlamaConfig read_model(KeyReader& r) {
  config::LlamaConfig c;
  c.vocab_size = r.integer("model.vocab_size", kResult);
  c.hidden_size = r.integer("model.hidden_size", kResult);
  c.intermediate_size = r.integer("model.intermediate_size", kResult);
  c.num_hidden_layers = r.integer("model.num_hidden_layers", kResult);
  c.num_attention_heads = r.integer("model.num_attention_heads", kResult);
  c.num_key_value_heads = r.present("model.num_key_value_heads", kResult)
                              ? r.integer("model.num_key_value_heads", kResult)
                              : c.num_attention_heads;
  c.head_dim = r.present("model.head_dim", kResult) ? r.integer("model.head_dim", kResult) : 0;
  if (r.present("model.max_position_embeddings", kResult))
    c.max_position_embeddings = r.integer("model.max_position_embeddings", kResult);
  if (r.present("model.rms_norm_eps", kResult)) c.rms_norm_eps = r.real("model.rms_norm_eps", kResult);
  if (r.present("model.rope_theta", kResult)) c.rope_theta = r.real("model.rope_theta", kResult);
  if (r.present("model.tie_word_embeddings", kResult))
    c.tie_word_embeddings = r.boolean("model.tie_word_embeddings", kResult);
  if (r.present("model.initializer_range", kResult))
    c.initializer_range = r.real("model.initializer_range", kResult);
  if (r.present("model.bos_token_id", kResult)) c.bos_token_id = r.integer("model.bos_token_id", kResult);
  if (r.present("model.eos_token_id", kResult)) c.eos_token_id = r.integer("model.eos_token_id", kResult);
  if (r.present("model.rope_scaling", kResult)) {
    const std::string type = r.text("model.rope_scaling.rope_type", kResult);
    MT_USER_CHECK(type == "llama3", "model.rope_scaling.rope_type is '{}'; only 'llama3' is supported", type);
    config::Llama3RopeScaling s;
    s.factor = r.real("model.rope_scaling.factor", kResult);
    s.low_freq_factor = r.real("model.rope_scaling.low_freq_factor", kResult);
    s.high_freq_factor = r.real("model.rope_scaling.high_freq_factor", kResult);
    s.original_max_position_embeddings = r.integer("model.rope_scaling.original_max_position_embeddings", kResult);
    c.rope_scaling = s;
  }
  if (r.present("model.num_local_experts", kResult))
    c.num_local_experts = r.integer("model.num_local_experts", kResult);
  if (r.present("model.num_experts_per_tok", kResult))
    c.num_experts_per_tok = r.integer("model.num_experts_per_tok", kResult);
  if (r.present("model.router_aux_loss_coef", kResult))
    c.router_aux_loss_coef = r.real("model.router_aux_loss_coef", kResult);
  if (c.head_dim == 0 && c.num_attention_heads > 0) c.head_dim = c.hidden_size / c.num_attention_heads;
  c.validate("config key model");
  return c;
}

OptimizerSettings read_optimizer(KeyReader& r) {
  const std::string type = r.text("optimizer.type", kResult);
  MT_USER_CHECK(type == "adamw", "config key 'optimizer.type' must be 'adamw' (the only optimizer), got '{}'", type);
  OptimizerSettings o;
  o.learning_rate = r.real("optimizer.learning_rate", kResult);
  o.weight_decay = r.real("optimizer.weight_decay", kResult);
  o.beta1 = r.real("optimizer.beta1", kResult);
  o.beta2 = r.real("optimizer.beta2", kResult);
  o.epsilon = r.real("optimizer.epsilon", kResult);
  MT_USER_CHECK(o.learning_rate >= 0, "config key 'optimizer.learning_rate' must be >= 0, got {}", o.learning_rate);
  MT_USER_CHECK(o.beta1 >= 0 && o.beta1 < 1, "config key 'optimizer.beta1' must be in [0, 1), got {}", o.beta1);
  MT_USER_CHECK(o.beta2 >= 0 && o.beta2 < 1, "config key 'optimizer.beta2' must be in [0, 1), got {}", o.beta2);
  MT_USER_CHECK(o.epsilon > 0, "config key 'optimizer.epsilon' must be > 0, got {}", o.epsilon);
  MT_USER_CHECK(o.weight_decay >= 0, "config key 'optimizer.weight_decay' must be >= 0, got {}", o.weight_decay);
  return o;
}

LrSchedulerSettings read_lr_scheduler(KeyReader& r) {
  LrSchedulerSettings s;
  s.decay = r.choice<LrDecay>("lr_scheduler.type", kResult,
                              {{"cosine", LrDecay::cosine}, {"linear", LrDecay::linear}, {"constant", LrDecay::constant}});
  s.warmup_steps = r.integer("lr_scheduler.warmup_steps", kResult);
  s.min_lr_ratio = r.real("lr_scheduler.min_lr_ratio", kResult);
  MT_USER_CHECK(s.warmup_steps >= 0, "config key 'lr_scheduler.warmup_steps' must be >= 0, got {}", s.warmup_steps);
  MT_USER_CHECK(s.min_lr_ratio >= 0 && s.min_lr_ratio <= 1,
                "config key 'lr_scheduler.min_lr_ratio' must be in [0, 1], got {}", s.min_lr_ratio);
  return s;
}

DataSettings read_data(KeyReader& r) {
  DataSettings d;
  d.dataset_path = r.text("dataset.path", kHostLocalResult);
  d.prefetch_steps = r.integer32("data.prefetch_steps", kHostLocal);
  d.loader_threads = r.integer32("data.loader_threads", kHostLocal);
  d.input_sharding = r.text("data.input_sharding", kLayout);
  d.document_mask = r.boolean("data.document_mask", kResult);
  return d;
}

EvalSettings read_eval(KeyReader& r) {
  EvalSettings e;
  e.every_steps = r.integer("eval.every_steps", kLayout);
  e.batches = r.integer("eval.batches", kLayout);
  e.holdout_fraction = r.real("eval.holdout_fraction", kLayout);
  e.dataset = r.text("eval.dataset", kLayout);
  MT_USER_CHECK(e.every_steps >= 0, "eval.every_steps={}: expected 0 (no evaluation) or more", e.every_steps);
  if (e.enabled()) {
    MT_USER_CHECK(e.batches >= 1, "eval.batches must be >= 1, got {}", e.batches);
    if (e.from_holdout())
      MT_USER_CHECK(e.holdout_fraction > 0 && e.holdout_fraction < 1,
                    "eval.holdout_fraction must be in (0, 1), got {}", e.holdout_fraction);
  }
  return e;
}

CheckpointSettings read_checkpoint(KeyReader& r) {
  CheckpointSettings c;
  c.save_steps = r.integer("checkpoint.save_steps", kLayout);
  c.keep = r.integer("checkpoint.keep", kLayout);
  c.resume = r.boolean("checkpoint.resume", kLayout);
  c.init_from = r.text("checkpoint.init_from", kLayout);
  return c;
}

// "none" | "full" | "every_<k>" (k >= 1) as the layers between checkpointed ones (0: none).
PipelineSettings read_pipeline(KeyReader& r) {
  PipelineSettings p;
  p.schedule = r.choice<PipelineSchedule>("pipeline.schedule", kLayout,
                                          {{"1f1b", PipelineSchedule::one_f_one_b}, {"gpipe", PipelineSchedule::gpipe}});
  p.microbatches = r.integer("pipeline.microbatches", kLayout);
  MT_USER_CHECK(p.microbatches >= 0, "pipeline.microbatches={}: expected 0 (one per row) or a positive count",
                p.microbatches);
  p.virtual_stages = r.integer32("pipeline.virtual_stages", kLayout);
  MT_USER_CHECK(p.virtual_stages >= 1, "pipeline.virtual_stages={}: expected at least 1 (1: one stage per rank)",
                p.virtual_stages);
  // "4,4,3,3": the layers of each stage in order (a list of one number per stage).
  const std::string layers = r.text("pipeline.layers_per_stage", kLayout);
  size_t begin = 0;
  while (begin < layers.size()) {
    const size_t end = std::min(layers.find(',', begin), layers.size());
    const std::string item = layers.substr(begin, end - begin);
    char* parsed_end = nullptr;
    const long long count = std::strtoll(item.c_str(), &parsed_end, 10);
    MT_USER_CHECK(!item.empty() && *parsed_end == '\0' && count >= 1,
                  "pipeline.layers_per_stage={}: expected the layer count of each stage separated by commas, each at "
                  "least 1 (e.g. \"3,3,2\"), or null to balance the stages by compute", layers);
    p.layers_per_stage.push_back(count);
    begin = end + 1;
  }
  return p;
}

int read_checkpoint_every(KeyReader& r) {
  const std::string value = r.text("activation_checkpointing", kLayout);
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

FaultInjection read_fault(KeyReader& r) {
  using Kind = FaultInjection::Kind;
  FaultInjection fault;
  fault.kind = r.choice<Kind>("debug.fault", kLayout,
                              {{"none", Kind::none},
                               {"throw", Kind::throw_error},
                               {"hang", Kind::hang},
                               {"kill", Kind::kill},
                               {"kill_in_save", Kind::kill_in_save}});
  fault.step = r.integer("debug.fault_step", kLayout);
  fault.device = r.integer32("debug.fault_device", kLayout);
  return fault;
}

mesh::AxisSizes read_axis_sizes(KeyReader& r, const std::string& prefix) {
  mesh::AxisSizes sizes;
  for (mesh::Axis a : mesh::kAllAxes) sizes[a] = r.integer32(prefix + "." + std::string(mesh::axis_name(a)), kLayout);
  return sizes;
}

RuntimeSettings read_runtime(KeyReader& r) {
  RuntimeSettings o;
  o.threads_per_device = r.integer32("runtime.threads_per_device", kHostLocal);
  o.failure_timeout_s = r.real("runtime.failure_timeout_s", kLayout);
  o.heartbeat_interval_s = r.real("runtime.heartbeat_interval_s", kLayout);
  o.rendezvous_timeout_s = r.real("runtime.rendezvous_timeout_s", kLayout);
  o.collective_timeout_s = r.real("runtime.collective_timeout_s", kLayout);
  o.step_timeout_s = r.real("runtime.step_timeout_s", kLayout);
  MT_USER_CHECK(o.threads_per_device >= 0, "runtime.threads_per_device must be >= 0 (0 = auto), got {}",
                o.threads_per_device);
  MT_USER_CHECK(o.heartbeat_interval_s > 0, "runtime.heartbeat_interval_s must be > 0, got {}", o.heartbeat_interval_s);
  MT_USER_CHECK(o.failure_timeout_s > 2 * o.heartbeat_interval_s,
                "runtime.failure_timeout_s ({}) must exceed twice runtime.heartbeat_interval_s ({})",
                o.failure_timeout_s, o.heartbeat_interval_s);
  MT_USER_CHECK(o.rendezvous_timeout_s > 0, "runtime.rendezvous_timeout_s must be > 0, got {}", o.rendezvous_timeout_s);
  MT_USER_CHECK(o.collective_timeout_s > 0, "runtime.collective_timeout_s must be > 0, got {}", o.collective_timeout_s);
  MT_USER_CHECK(o.step_timeout_s >= 0, "runtime.step_timeout_s must be >= 0 (0 = no hang detection), got {}",
                o.step_timeout_s);
  return o;
}

}  // namespace

std::optional<Bf16Matmul> bf16_matmul_from_name(const std::string& name) {
  for (Bf16Matmul path : {Bf16Matmul::automatic, Bf16Matmul::native, Bf16Matmul::fp32_gemm})
    if (name == bf16_matmul_name(path)) return path;
  return std::nullopt;
}

const char* bf16_matmul_name(Bf16Matmul path) {
  switch (path) {
    case Bf16Matmul::automatic: return "auto";
    case Bf16Matmul::native: return "native";
    case Bf16Matmul::fp32_gemm: return "fp32_gemm";
  }
  return "?";
}

Settings Settings::from_config(const config::Config& config) {
  Settings s;
  KeyReader r(config, s);
  // The option each config group took (Config::load sets <group>.name); the groups' keys are read below.
  r.declare("model.name", kResult);
  r.declare("dataset.name", kResult);
  s.seed = static_cast<uint64_t>(r.integer("seed", kResult));
  s.metrics.logging_steps = r.integer("logging_steps", kLayout);
  s.output_dir = r.text("output_dir", kHostLocal);
  s.log_level = log::parse_level(r.text("log_level", kHostLocal));

  s.global_batch_size = r.integer("global_batch_size", kResult);
  s.block_size = r.integer("block_size", kResult);
  s.max_steps = r.integer("max_steps", kResult);
  s.gradient_accumulation_steps = r.integer("gradient_accumulation_steps", kResult);
  s.max_grad_norm = r.real("max_grad_norm", kResult);
  s.compute_dtype =
      r.choice<ComputeDtype>("compute_dtype", kResult,
                             {{"float32", ComputeDtype::float32}, {"bfloat16", ComputeDtype::bfloat16}});
  // The same numerics up to summation order either way, so a run may resume on another CPU.
  const std::string bf16_matmul = r.text("bf16_matmul", kLayout);
  const std::optional<Bf16Matmul> path = bf16_matmul_from_name(bf16_matmul);
  MT_USER_CHECK(path, "bf16_matmul={}: expected auto (the CPU's flags and a probe decide), native (libtorch's bf16 "
                "GEMM) or fp32_gemm (an fp32 GEMM of the bf16 values)", bf16_matmul);
  s.bf16_matmul = *path;

  s.model = read_model(r);
  s.optimizer = read_optimizer(r);
  s.lr_scheduler = read_lr_scheduler(r);
  s.data = read_data(r);
  s.eval = read_eval(r);
  s.checkpoint = read_checkpoint(r);
  s.parallel.reshard_after_forward = r.boolean("parallel.reshard_after_forward", kLayout);
  s.parallel.capacity_factor = r.real("moe.capacity_factor", kResult);
  s.parallel.checkpoint_every = read_checkpoint_every(r);
  s.pipeline = read_pipeline(r);
  s.memory.check = r.boolean("memory.check", kLayout);
  s.memory.cache_slack = r.real("memory.cache_slack", kLayout);
  s.metrics.peak_gflops = r.real("metrics.peak_gflops", kLayout);
  s.metrics.tensorboard = r.boolean("metrics.tensorboard", kLayout);
  s.debug.data_shapes = r.boolean("debug.data_shapes", kLayout);
  s.debug.data_shape_steps = r.integer("debug.data_shape_steps", kLayout);
  s.debug.fault = read_fault(r);
  s.mesh.ici = read_axis_sizes(r, "ici_mesh");
  s.mesh.dcn = read_axis_sizes(r, "dcn_mesh");
  s.runtime = read_runtime(r);
  r.check_every_key_declared();
  s.resolved_yaml_ = config.to_yaml();

  MT_USER_CHECK(s.metrics.logging_steps >= 1, "config key 'logging_steps' must be >= 1, got {}",
                s.metrics.logging_steps);
  MT_USER_CHECK(s.global_batch_size >= 1, "global_batch_size={}: expected at least 1", s.global_batch_size);
  MT_USER_CHECK(s.block_size >= 1, "block_size={}: expected at least 1", s.block_size);
  MT_USER_CHECK(s.max_steps >= 1, "max_steps={}: expected at least 1", s.max_steps);
  MT_USER_CHECK(s.gradient_accumulation_steps >= 1, "gradient_accumulation_steps={}: expected at least 1",
                s.gradient_accumulation_steps);
  MT_USER_CHECK(s.block_size <= s.model.max_position_embeddings,
                "block_size={} is longer than the model's max_position_embeddings ({})", s.block_size,
                s.model.max_position_embeddings);
  MT_USER_CHECK(s.parallel.capacity_factor >= 0, "moe.capacity_factor must be 0 (dropless) or positive, got {}",
                s.parallel.capacity_factor);
  MT_USER_CHECK(s.memory.cache_slack >= 0, "memory.cache_slack={}: expected a fraction of the peak of live tensor "
                "bytes, >= 0 (0.5 by default; less trades step time for a lower peak: configs/defaults.yaml)",
                s.memory.cache_slack);
  MT_USER_CHECK(s.metrics.peak_gflops >= 0, "config key 'metrics.peak_gflops' must be >= 0 (0: measure), got {}",
                s.metrics.peak_gflops);
  return s;
}

std::map<std::string, std::string> Settings::trajectory() const {
  std::map<std::string, std::string> out;
  for (const auto& [key, declared] : keys_)
    if (declared.attributes.changes_results) out[key] = declared.value_text;
  return out;
}

std::map<std::string, std::string> Settings::host_shared() const {
  std::map<std::string, std::string> out;
  for (const auto& [key, declared] : keys_)
    if (!declared.attributes.may_differ_between_hosts) out[key] = declared.value_text;
  return out;
}

KeyAttributes Settings::attributes(const std::string& key) const {
  auto found = keys_.find(key);
  MT_CHECK(found != keys_.end(), "no config key {} was declared", key);
  return found->second.attributes;
}

}  // namespace meshtrain::settings
