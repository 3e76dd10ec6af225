// shard_reader.cpp — memory mapping (with the SIGBUS handler that names a shard truncated while mapped) and the
// up-front validation of shard directories.
#include "meshtrain/token_shards/shard_reader.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

#include "meshtrain/common/checksum.hpp"
#include "meshtrain/common/error.hpp"
#include "meshtrain/tokenizer/tokenizer.hpp"

namespace meshtrain::token_shards {
namespace fs = std::filesystem;
namespace {

// The copy of token ids to 4 bytes (widening 2-byte ones), the host loader's inner loop, which also returns the
// largest id copied (for the loader's check against the vocabulary: one vector max per 8 ids, in registers). On
// x86-64 compiled twice, for AVX2 (one vpmovzxwd per 8 ids) and for the baseline (SSE2), the loader picking the one
// the CPU runs (GCC's target_clones, resolved once at load time; BENCHMARKS.md, "Host loader"). Not in the sanitizer
// builds: their runtimes are not started yet when the dynamic loader runs the resolver, and the binary would crash
// at load.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__) && \
    !defined(__SANITIZE_ADDRESS__)
#define MESHTRAIN_TOKEN_COPY_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define MESHTRAIN_TOKEN_COPY_CLONES
#endif
MESHTRAIN_TOKEN_COPY_CLONES uint32_t widen_u16(const uint16_t* ids, uint64_t count, uint32_t* out) {
  uint16_t largest = 0;
  for (uint64_t i = 0; i < count; ++i) {
    out[i] = ids[i];
    largest = std::max(largest, ids[i]);
  }
  return largest;
}
MESHTRAIN_TOKEN_COPY_CLONES uint32_t copy_u32(const uint32_t* ids, uint64_t count, uint32_t* out) {
  uint32_t largest = 0;
  for (uint64_t i = 0; i < count; ++i) {
    out[i] = ids[i];
    largest = std::max(largest, ids[i]);
  }
  return largest;
}

// The mappings the SIGBUS handler can name: a fixed table whose slots are claimed and released without locks, since
// the handler may read it while other threads map and unmap. Mappings beyond its size work but go unnamed.
struct NamedMapping {
  std::atomic<bool> claimed{false};
  std::atomic<const uint8_t*> begin{nullptr};  // set last, cleared first: non-null means size and path are valid
  std::atomic<uint64_t> size{0};
  std::atomic<const char*> path{nullptr};
};
constexpr size_t kNamedMappings = 4096;
NamedMapping g_named_mappings[kNamedMappings];
struct sigaction g_previous_sigbus;

void write_text(const char* text) {
  for (size_t left = std::strlen(text); left > 0;) {
    const ssize_t n = ::write(STDERR_FILENO, text, left);
    if (n <= 0) return;
    text += n;
    left -= static_cast<size_t>(n);
  }
}

void write_number(uint64_t value) {
  char digits[24];
  char* p = digits + sizeof(digits) - 1;
  *p = '\0';
  do {
    *--p = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value > 0);
  write_text(p);
}

// Async-signal-safe: only atomics, write(2) and _exit(2).
void on_sigbus(int signal_number, siginfo_t* info, void* context) {
  const auto* address = static_cast<const uint8_t*>(info->si_addr);
  for (NamedMapping& mapping : g_named_mappings) {
    const uint8_t* begin = mapping.begin.load(std::memory_order_acquire);
    const uint64_t size = mapping.size.load(std::memory_order_relaxed);
    if (!begin || address < begin || address >= begin + size) continue;
    write_text("meshtrain: ");
    write_text(mapping.path.load(std::memory_order_relaxed));
    write_text(": truncated while mapped: reading byte ");
    write_number(static_cast<uint64_t>(address - begin));
    write_text(" of the ");
    write_number(size);
    write_text(" bytes it had when it was opened and checked failed (SIGBUS). The file was shortened in place while "
               "this process read it; token shards must not change during a run.\n");
    ::_exit(kTruncatedWhileMapped);
  }
  // Not a mapped shard: whoever handled SIGBUS before decides.
  if ((g_previous_sigbus.sa_flags & SA_SIGINFO) && g_previous_sigbus.sa_sigaction) {
    g_previous_sigbus.sa_sigaction(signal_number, info, context);
  } else if (!(g_previous_sigbus.sa_flags & SA_SIGINFO) && g_previous_sigbus.sa_handler != SIG_DFL &&
             g_previous_sigbus.sa_handler != SIG_IGN) {
    g_previous_sigbus.sa_handler(signal_number);
  } else {
    ::signal(SIGBUS, SIG_DFL);  // the faulting access runs again on return and ends the process as usual
  }
}

// Returns the slot naming [data, data + size) as `path`, or -1 if the table is full.
int name_mapping(const uint8_t* data, uint64_t size, const char* path) {
  static std::once_flag installed;
  std::call_once(installed, [] {
    struct sigaction action {};
    action.sa_sigaction = on_sigbus;
    action.sa_flags = SA_SIGINFO;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGBUS, &action, &g_previous_sigbus);
  });
  for (size_t slot = 0; slot < kNamedMappings; ++slot) {
    NamedMapping& mapping = g_named_mappings[slot];
    bool free = false;
    if (!mapping.claimed.compare_exchange_strong(free, true)) continue;
    mapping.path.store(path, std::memory_order_relaxed);
    mapping.size.store(size, std::memory_order_relaxed);
    mapping.begin.store(data, std::memory_order_release);
    return static_cast<int>(slot);
  }
  return -1;
}

void unname_mapping(int slot) {
  if (slot < 0) return;
  g_named_mappings[slot].begin.store(nullptr, std::memory_order_release);
  g_named_mappings[slot].claimed.store(false, std::memory_order_release);
}

// The largest of `count` tokens of `token_bytes` each at `tokens`.
uint32_t largest_token(const void* tokens, uint64_t count, uint32_t token_bytes) {
  if (token_bytes == 2) {
    const auto* narrow = static_cast<const uint16_t*>(tokens);
    return *std::max_element(narrow, narrow + count);
  }
  const auto* wide = static_cast<const uint32_t*>(tokens);
  return *std::max_element(wide, wide + count);
}

}  // namespace

MappedFile::MappedFile(const fs::path& path) : path_(path.string()) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MT_USER_CHECK(fd >= 0, "{}: cannot open: {}", path.string(), std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw UserError(fmt::format("{}: cannot stat: {}", path.string(), std::strerror(errno)));
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {
    void* mapped = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) {
      ::close(fd);
      throw UserError(fmt::format("{}: cannot map: {}", path.string(), std::strerror(errno)));
    }
    data_ = static_cast<const uint8_t*>(mapped);
    registration_ = name_mapping(data_, size_, path_.c_str());
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  unname_mapping(registration_);
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

TokenShard::TokenShard(const fs::path& path, const ShardEntry& entry, PayloadCheck payload_check)
    : path_(path), file_(std::make_shared<MappedFile>(path)) {
  const bool verify_checksum = payload_check == PayloadCheck::at_open;
  if (payload_check == PayloadCheck::on_first_read) first_read_check_ = std::make_shared<std::once_flag>();
  const std::string name = path.string();
  header_ = decode_shard_header(file_->data(), file_->size(), path);
  MT_USER_CHECK(file_->size() >= header_.file_bytes, "{}: truncated: {} bytes, the header says {}", name, file_->size(),
                header_.file_bytes);
  MT_USER_CHECK(file_->size() == header_.file_bytes, "{}: corrupted: {} bytes after the end the header gives ({})",
                name, file_->size() - header_.file_bytes, header_.file_bytes);
  MT_USER_CHECK(header_.token_count == entry.tokens && header_.document_count == entry.documents &&
                    header_.payload_crc32c == entry.crc32c,
                "{}: does not match the index: {} tokens, {} documents, crc32c {:08x} (index: {}, {}, {:08x})", name,
                header_.token_count, header_.document_count, header_.payload_crc32c, entry.tokens, entry.documents,
                entry.crc32c);
  if (verify_checksum) check_payload();
  const uint64_t* starts = document_starts();
  MT_USER_CHECK(starts[0] == 0 && starts[header_.document_count] == header_.token_count,
                "{}: corrupted: document offsets must run from 0 to {}", name, header_.token_count);
  for (uint64_t d = 0; d < header_.document_count; ++d) {
    MT_USER_CHECK(starts[d] <= starts[d + 1], "{}: corrupted: document {} starts after document {}", name, d, d + 1);
  }
  if (header_.token_count == 0) return;
  max_token_ = entry.max_token;
  if (verify_checksum || !max_token_) {
    const uint32_t largest = largest_token(tokens(), header_.token_count, header_.token_bytes);
    MT_USER_CHECK(!max_token_ || *max_token_ == largest,
                  "{}: does not match the index: the largest token id is {}, the index says {}", name, largest,
                  *max_token_);
    max_token_ = largest;
  }
}

void TokenShard::check_payload() const {
  const uint32_t actual = crc32c(file_->data() + kShardHeaderBytes, header_.file_bytes - kShardHeaderBytes);
  MT_USER_CHECK(actual == header_.payload_crc32c,
                "{}: checksum mismatch: payload CRC-32C is {:08x}, the header says {:08x} (the file is corrupted)",
                path_.string(), actual, header_.payload_crc32c);
}

uint32_t TokenShard::token(uint64_t i) const {
  if (header_.token_bytes == 2) return static_cast<const uint16_t*>(tokens())[i];
  return static_cast<const uint32_t*>(tokens())[i];
}

uint32_t TokenShard::copy_tokens(uint64_t begin, uint64_t count, uint32_t* out) const {
  MT_CHECK(begin + count <= header_.token_count, "tokens [{}, {}) out of range of {} ({} tokens)", begin, begin + count,
           path_.string(), header_.token_count);
  if (count == 0) return 0;  // `out` may be null
  if (first_read_check_) std::call_once(*first_read_check_, [this] { check_payload(); });
  if (header_.token_bytes == 4) return copy_u32(static_cast<const uint32_t*>(tokens()) + begin, count, out);
  return widen_u16(static_cast<const uint16_t*>(tokens()) + begin, count, out);
}

ShardDirectory ShardDirectory::open(const fs::path& dir, const OpenOptions& options) {
  ShardDirectory result;
  result.path_ = dir;
  MT_USER_CHECK(fs::is_directory(dir),
                "{}: not a directory (expected a token-shard directory from `meshtrain "
                "prepare`)",
                dir.string());
  fs::path index_path = dir / kIndexFileName;
  MT_USER_CHECK(fs::exists(index_path),
                "{}: missing: not a finished token-shard directory (an interrupted `meshtrain "
                "prepare` leaves none)",
                index_path.string());
  result.index_ = index_from_json(tokenizer::read_file_bytes(index_path), index_path);
  const ShardIndex& index = result.index_;
  if (!options.expected_tokenizer_fingerprint.empty()) {
    MT_USER_CHECK(index.tokenizer.fingerprint == options.expected_tokenizer_fingerprint,
                  "{}: tokenizer mismatch: prepared with {} ({}), expected {}", index_path.string(),
                  index.tokenizer.name, index.tokenizer.fingerprint, options.expected_tokenizer_fingerprint);
  }
  uint64_t tokens = 0, documents = 0;
  for (const ShardEntry& entry : index.shards) {
    fs::path shard_path = dir / entry.file;
    MT_USER_CHECK(fs::exists(shard_path), "{}: missing (listed in {})", shard_path.string(), index_path.string());
    TokenShard& shard = result.shards_.emplace_back(shard_path, entry, options.payload_check);
    MT_USER_CHECK(shard.header().tokenizer_fingerprint == index.tokenizer.fingerprint &&
                      shard.header().tokenizer_name == index.tokenizer.name,
                  "{}: tokenizer mismatch: the shard was written by {} ({}), the index says {} ({})",
                  shard_path.string(), shard.header().tokenizer_name, shard.header().tokenizer_fingerprint,
                  index.tokenizer.name, index.tokenizer.fingerprint);
    MT_USER_CHECK(shard.token_bytes() == index.token_bytes, "{}: token width {} differs from the index's {}",
                  shard_path.string(), shard.token_bytes(), index.token_bytes);
    MT_USER_CHECK(!shard.max_token() || *shard.max_token() < index.tokenizer.vocab_size,
                  "{}: token id check failed: token id {} is not below the vocabulary size {} of tokenizer {} ({})",
                  shard_path.string(), shard.max_token().value_or(0), index.tokenizer.vocab_size,
                  index.tokenizer.name, index_path.string());
    tokens += shard.token_count();
    documents += shard.document_count();
  }
  MT_USER_CHECK(tokens == index.total_tokens && documents == index.total_documents,
                "{}: corrupted index: the shards hold {} tokens and {} documents, the index says {} and {}",
                index_path.string(), tokens, documents, index.total_tokens, index.total_documents);
  return result;
}

}  // namespace meshtrain::token_shards
