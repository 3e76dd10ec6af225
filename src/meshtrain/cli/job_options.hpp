// job_options.hpp — what every verb that runs a job shares: host flags, config overrides, the mesh log lines.
#pragma once

#include "meshtrain/mesh/mesh.hpp"
#include "meshtrain/runtime/host_identity.hpp"
#include "meshtrain/runtime/host_runtime.hpp"
#include "meshtrain/settings/settings.hpp"

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace meshtrain::cli {

struct JobOptions {
  runtime::HostFlags host_flags;
  std::vector<std::string> overrides;  // key=value ...
  std::string config_dir;              // empty: config::default_config_dir()
};

// Adds --devices-per-host, --nnodes, --node-rank, --master-addr, --master-port, --iface, --secret-file, --config-dir
// and the overrides.
void add_job_options(CLI::App& app, JobOptions& options);

struct Job {
  settings::Settings settings;
  runtime::HostIdentity identity;
  mesh::Mesh mesh;
};

// Resolves this host's identity, loads the config into settings (applying log_level), builds the mesh, and logs and
// saves the resolved config. A failure once the identity is known is published to the job's coordinator
// first (runtime::publish_startup_failure), so the other hosts end with this host's reason instead of waiting for it.
Job load_job(const JobOptions& options);

// Runs the main-thread part of a job on `runtime`: a failure there (a missing dataset, a refused resume) ends the job
// on every host with its reason, exit code 2 for a usage error and 1 otherwise, instead of leaving the others waiting.
void run_job(runtime::HostRuntime& runtime, int host, const std::function<void()>& body);

// The torchprime-style mesh lines ("Logical mesh shape: ...", "Logical mesh device assignments: ...") and a table of
// every device's host, local index, slice and mesh coordinates.
void log_mesh(const mesh::Mesh& mesh);

// Logs the resolved config and saves it as <output_dir>/config.yaml (host 0 only).
void log_and_save_config(const settings::Settings& settings, int host);

}  // namespace meshtrain::cli
