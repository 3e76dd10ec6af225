// secret.hpp — the job secret that admits a connection to the control plane, and the HMAC that proves it.
//
// A job's hosts share one secret; a connection proves it knows the secret by answering a fresh challenge with an
// HMAC-SHA256 (control/protocol.hpp), so the secret itself never crosses the wire. Where it comes from, in order:
// `--secret-file PATH` (the file must not be readable by group or others), MESHTRAIN_JOB_SECRET, MESHTRAIN_SECRET_FILE;
// `meshtrain run --hosts N` makes a fresh one for its hosts. A job whose coordinator is not on loopback refuses to
// start without one (resolve_job_secret).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace meshtrain::control {

using Digest = std::array<uint8_t, 32>;

// HMAC-SHA256(key, message).
Digest hmac_sha256(const std::string& key, const std::string& message);
// Equal digests, compared in constant time.
bool same_digest(const Digest& a, const Digest& b);
// `count` bytes from the kernel's random source.
std::string random_bytes(size_t count);
// A fresh secret: 32 random bytes as 64 hex digits.
std::string make_secret();

// The secret in a file: its first line, surrounding whitespace removed. UserError naming the file if it cannot be
// read, is readable by group or others (mode & 077), is empty, or is over 4 KiB.
std::string read_secret_file(const std::string& path);

// What a refused job prints so that a user can make a secret and hand it to every host.
std::string how_to_make_a_secret();

struct SecretSources {
  std::optional<std::string> secret_file;  // --secret-file
  // Reads an environment variable (MESHTRAIN_JOB_SECRET, MESHTRAIN_SECRET_FILE).
  std::function<std::optional<std::string>(const std::string&)> env;
};

struct JobSecret {
  std::string value;
  std::string source;  // "--secret-file PATH", "MESHTRAIN_JOB_SECRET", ... or "none (loopback)" / "this process"
};

// The job's secret (see the file comment). Without one: a one-host job makes its own (no other process needs it); a
// job of several hosts whose coordinator is on loopback runs with an empty secret, which any local process can prove
// (the caller warns); any other job is refused with a UserError that says how to make one.
JobSecret resolve_job_secret(const SecretSources& sources, int hosts, bool coordinator_on_loopback);

}  // namespace meshtrain::control
