// secret.cpp — HMAC-SHA256 and randomness through OpenSSL's libcrypto; reading and choosing the job secret.
#include "meshtrain/control/secret.hpp"

#include "meshtrain/common/error.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace meshtrain::control {

Digest hmac_sha256(const std::string& key, const std::string& message) {
  Digest digest{};
  unsigned int length = 0;
  const unsigned char* result =
      ::HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
             reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest.data(), &length);
  MT_CHECK(result != nullptr && length == digest.size(), "HMAC-SHA256 failed");
  return digest;
}

bool same_digest(const Digest& a, const Digest& b) { return ::CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

std::string random_bytes(size_t count) {
  std::string bytes(count, '\0');
  MT_CHECK(::RAND_bytes(reinterpret_cast<unsigned char*>(bytes.data()), static_cast<int>(count)) == 1,
           "the kernel's random source gave no bytes");
  return bytes;
}

std::string make_secret() {
  static const char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : random_bytes(32)) {
    hex.push_back(kHex[c >> 4]);
    hex.push_back(kHex[c & 15]);
  }
  return hex;
}

std::string how_to_make_a_secret() {
  return "make one with `head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > job.secret && chmod 600 job.secret`, "
         "copy it to every host, and pass `--secret-file job.secret` (or set MESHTRAIN_JOB_SECRET) on each";
}

std::string read_secret_file(const std::string& path) {
  struct stat info {};
  MT_USER_CHECK(::stat(path.c_str(), &info) == 0, "job secret file {}: cannot read it: {}", path, std::strerror(errno));
  MT_USER_CHECK(S_ISREG(info.st_mode), "job secret file {}: not a regular file", path);
  MT_USER_CHECK((info.st_mode & 077) == 0,
                "job secret file {}: its mode is {:03o}, readable or writable by group or others; `chmod 600 {}`",
                path, info.st_mode & 0777, path);
  MT_USER_CHECK(info.st_size <= 4096, "job secret file {}: {} bytes, more than the 4096 a secret may have", path,
                static_cast<int64_t>(info.st_size));
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  const size_t first = line.find_first_not_of(" \t\r");
  const size_t last = line.find_last_not_of(" \t\r");
  line = first == std::string::npos ? "" : line.substr(first, last - first + 1);
  MT_USER_CHECK(!line.empty(), "job secret file {}: its first line is empty; {}", path, how_to_make_a_secret());
  return line;
}

JobSecret resolve_job_secret(const SecretSources& sources, int hosts, bool coordinator_on_loopback) {
  if (sources.secret_file) {
    return JobSecret{read_secret_file(*sources.secret_file), "--secret-file " + *sources.secret_file};
  }
  if (std::optional<std::string> value = sources.env("MESHTRAIN_JOB_SECRET"); value && !value->empty()) {
    return JobSecret{*value, "MESHTRAIN_JOB_SECRET"};
  }
  if (std::optional<std::string> file = sources.env("MESHTRAIN_SECRET_FILE"); file && !file->empty()) {
    return JobSecret{read_secret_file(*file), "MESHTRAIN_SECRET_FILE " + *file};
  }
  if (hosts == 1) return JobSecret{make_secret(), "made by this host (a one-host job)"};
  MT_USER_CHECK(coordinator_on_loopback,
                "a job of {} hosts whose coordinator is not on loopback needs a job secret, so that only its hosts "
                "can use its control plane: {}",
                hosts, how_to_make_a_secret());
  return JobSecret{"", "none (coordinator on loopback: any local process can join)"};
}

}  // namespace meshtrain::control
