// job_options.hpp — what every verb that runs a job shares: host flags, config overrides, the mesh log lines.
#pragma once

#include "meshtrain/config/config.hpp"
#include "meshtrain/mesh/mesh.hpp"
#include "meshtrain/runtime/host_identity.hpp"

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace meshtrain::cli {

struct JobOptions {
  runtime::HostFlags host_flags;
  std::vector<std::string> overrides;  // key=value ...
  std::string config_dir;              // empty: config::default_config_dir()
};

// Adds --devices-per-host, --nnodes, --node-rank, --master-addr, --master-port, --config-dir and the overrides.
void add_job_options(CLI::App& app, JobOptions& options);

struct Job {
  config::Config config;
  runtime::HostIdentity identity;
  mesh::Mesh mesh;
};

// Loads the config (applying log_level), resolves this host's identity and builds the mesh.
Job load_job(const JobOptions& options);

// The torchprime-style mesh lines ("Logical mesh shape: ...", "Logical mesh device assignments: ...") and a table of
// every device's host, local index, slice and mesh coordinates.
void log_mesh(const mesh::Mesh& mesh);

// Logs the resolved config and saves it as <output_dir>/<run_name>/config.yaml (host 0 only).
void log_and_save_config(const config::Config& config, int host);

}  // namespace meshtrain::cli
