// tokenizer.cpp — the byte-level BPE encoder and decoder, special-token splitting and parallel encoding.
#include "meshtrain/tokenizer/tokenizer.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <list>
#include <mutex>
#include <thread>
#include <vector>

#include "meshtrain/common/error.hpp"

namespace meshtrain::tokenizer {

namespace {

// A fixed-size array in anonymous memory that asks for transparent huge pages: the lookup tables below are probed
// at random, and with 4 KiB pages most probes of a table of several MB would also miss the TLB.
template <typename T>
class HugePageArray {
 public:
  HugePageArray(size_t count, const T& fill) : bytes_(std::max<size_t>(count, 1) * sizeof(T)) {
    void* memory = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    MT_CHECK(memory != MAP_FAILED, "cannot allocate {} bytes for a tokenizer table", bytes_);
    ::madvise(memory, bytes_, MADV_HUGEPAGE);
    data_ = static_cast<T*>(memory);
    std::fill(data_, data_ + count, fill);
  }
  ~HugePageArray() { ::munmap(data_, bytes_); }
  HugePageArray(const HugePageArray&) = delete;
  HugePageArray& operator=(const HugePageArray&) = delete;
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  size_t bytes_;
  T* data_;
};

size_t table_capacity(size_t entries) {
  size_t capacity = 16;
  while (capacity < entries * 2) capacity *= 2;
  return capacity;
}

// The tokens of recently encoded pieces, per thread. Natural text repeats a few thousand words: a probe here stays in
// the core's caches, where the vocabulary's tables (4 MB of tokens and 8 MB of pairs for cl100k) are probed at random
// and miss to memory, several pair probes per byte of a word that is not one token. A piece of 2 to 16 bytes that is
// at most 3 tokens is kept; 65536 entries of 32 bytes in sets of two, the least recently used of a set replaced, so
// that two frequent pieces that share a slot do not evict each other on every use (the miss rates and speeds:
// BENCHMARKS.md, "Tokenizer").
class PieceCache {
 public:
  static constexpr size_t kMaxBytes = 16, kMaxIds = 3;
  struct Entry {  // half a cache line
    uint64_t bytes[2];  // the piece, zero-padded
    uint8_t length;
    uint8_t count;
    uint32_t ids[kMaxIds];
  };
  static_assert(sizeof(Entry) == 32);

  // This thread's cache for the tokenizer numbered `owner` (emptied when the thread moves to another tokenizer).
  static PieceCache& for_thread(uint64_t owner) {
    thread_local PieceCache cache;
    if (cache.owner_ != owner) {
      for (size_t i = 0; i < kSlots; ++i) cache.entries_[i] = Entry{};
      cache.owner_ = owner;
    }
    return cache;
  }

  // The two entries where `piece` may be kept (the one used more recently first), or nullptr if pieces of its size
  // are not kept; `key` receives the piece's padded bytes for find() and keep().
  Entry* set(std::string_view piece, uint64_t (&key)[2]) {
    if (piece.size() < 2 || piece.size() > kMaxBytes) return nullptr;
    key[0] = key[1] = 0;
    std::memcpy(key, piece.data(), piece.size());
    uint64_t hash = (key[0] ^ (key[1] * 0xBF58476D1CE4E5B9ull) ^ piece.size()) * 0x9E3779B97F4A7C15ull;
    return &entries_[(hash >> (64 - kSlotBits)) & ~size_t{1}];
  }
  // The entry of `set` holding `piece`, moved to the front; nullptr if neither does.
  static const Entry* find(Entry* set, std::string_view piece, const uint64_t (&key)[2]) {
    if (holds(set[0], piece, key)) return &set[0];
    if (!holds(set[1], piece, key)) return nullptr;
    std::swap(set[0], set[1]);
    return &set[0];
  }
  // Keeps `piece` at the front of `set`; the front entry moves back, and the back one is dropped.
  static void keep(Entry* set, std::string_view piece, const uint64_t (&key)[2], const uint32_t* ids, size_t count) {
    if (count > kMaxIds) return;
    set[1] = set[0];
    Entry& entry = set[0];
    entry.bytes[0] = key[0];
    entry.bytes[1] = key[1];
    entry.length = static_cast<uint8_t>(piece.size());
    entry.count = static_cast<uint8_t>(count);
    std::copy(ids, ids + count, entry.ids);
  }

 private:
  static bool holds(const Entry& entry, std::string_view piece, const uint64_t (&key)[2]) {
    return entry.bytes[0] == key[0] && entry.bytes[1] == key[1] && entry.length == piece.size();
  }

  static constexpr int kSlotBits = 16;
  static constexpr size_t kSlots = size_t(1) << kSlotBits;
  PieceCache() : entries_(kSlots, Entry{}) {}
  HugePageArray<Entry> entries_;
  uint64_t owner_ = 0;
};

std::atomic<uint64_t> tokenizers_built{0};

// Threads that help encode_parallel() calls, kept for the life of the process: each keeps its piece cache (2 MiB)
// warm from one call to the next, where a thread started per call would begin with an empty one. Calls from several
// threads at once share the helpers; a call's own thread always works on it too, so a call finishes even when every
// helper is busy elsewhere.
class EncodeHelpers {
 public:
  static EncodeHelpers& instance() {
    static EncodeHelpers* helpers = new EncodeHelpers;  // never destroyed: idle helpers wait until the process ends
    return *helpers;
  }

  // Runs work(i) for every i in [0, count), on the calling thread and on up to `helpers` helper threads; returns
  // when every call has returned, and rethrows the first exception one of them threw.
  void run(size_t count, int helpers, const std::function<void(size_t)>& work) {
    Job job(&work, count, helpers);
    std::list<Job*>::iterator queued;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      while (int(threads_.size()) < helpers) threads_.emplace_back([this] { help(); });
      queued = jobs_.insert(jobs_.end(), &job);
    }
    job_queued_.notify_all();
    drain(job);
    std::unique_lock<std::mutex> lock(mutex_);
    jobs_.erase(queued);
    helper_left_.wait(lock, [&] { return job.helping == 0; });
    if (job.failure) std::rethrow_exception(job.failure);
  }

 private:
  struct Job {
    Job(const std::function<void(size_t)>* work, size_t count, int helpers_wanted)
        : work(work), count(count), helpers_wanted(helpers_wanted) {}
    const std::function<void(size_t)>* work;
    size_t count;
    int helpers_wanted;
    std::atomic<size_t> next{0};  // the next item to claim
    int helping = 0;              // helpers working on it (under mutex_)
    std::exception_ptr failure;   // the first exception (under mutex_)
    bool open() const { return next.load(std::memory_order_relaxed) < count; }
  };

  // Claims and runs items of `job` until none is left; after a failure the rest are claimed and skipped.
  void drain(Job& job) {
    for (size_t i; (i = job.next.fetch_add(1)) < job.count;) {
      try {
        (*job.work)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!job.failure) job.failure = std::current_exception();
        job.next.store(job.count);
      }
    }
  }

  void help() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      Job* job = nullptr;
      job_queued_.wait(lock, [&] {
        for (Job* queued : jobs_) {
          if (queued->helping < queued->helpers_wanted && queued->open()) {
            job = queued;
            return true;
          }
        }
        return false;
      });
      ++job->helping;
      lock.unlock();
      drain(*job);
      lock.lock();
      if (--job->helping == 0) helper_left_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable job_queued_, helper_left_;
  std::list<Job*> jobs_;  // calls in progress, oldest first
  std::vector<std::thread> threads_;
};

}  // namespace

// Adjacent-pair merge rules keyed by (left id, right id): open addressing over a power-of-two table.
class Tokenizer::PairTable {
 public:
  struct Merge {
    uint32_t rank, result;
  };
  static constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();

  explicit PairTable(size_t entries)
      : slots_(table_capacity(entries), {kEmpty, {kNoRank, 0}}), mask_(table_capacity(entries) - 1) {}

  // Keeps the first (highest-priority) rule for a pair.
  void insert(uint32_t left, uint32_t right, Merge merge) {
    uint64_t key = pack(left, right);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return;
      if (slots_[i].key == kEmpty) {
        slots_[i] = {key, merge};
        return;
      }
    }
  }

  Merge find(uint32_t left, uint32_t right) const {
    uint64_t key = pack(left, right);
    for (size_t i = slot(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return slots_[i].merge;
      if (slots_[i].key == kEmpty) return {kNoRank, 0};
    }
  }

 private:
  static constexpr uint64_t kEmpty = std::numeric_limits<uint64_t>::max();
  struct Slot {
    uint64_t key;  // key and rule side by side: one cache line per probe
    Merge merge;
  };
  static uint64_t pack(uint32_t left, uint32_t right) { return (uint64_t(left) << 32) | right; }
  size_t slot(uint64_t key) const { return (key * 0x9E3779B97F4A7C15ull) >> 20 & mask_; }

  HugePageArray<Slot> slots_;
  size_t mask_;
};

// Token bytes -> id: open addressing over a power-of-two table. A slot holds a token's length and first 8 bytes, so
// looking up a token of up to 8 bytes (most of them) touches one cache line; longer ones compare the rest with
// TokenizerSpec::token_bytes.
class Tokenizer::TokenTable {
 public:
  static constexpr uint32_t kMissing = std::numeric_limits<uint32_t>::max();

  explicit TokenTable(const std::vector<std::string>& tokens)
      : tokens_(tokens),
        slots_(table_capacity(tokens.size()), {0, 0, kMissing}),
        mask_(table_capacity(tokens.size()) - 1) {}

  // Returns the id already holding these bytes, or kMissing after inserting `id`.
  uint32_t insert(uint32_t id) {
    std::string_view bytes = tokens_[id];
    uint64_t head = head_of(bytes);
    for (size_t i = hash(head, bytes) & mask_;; i = (i + 1) & mask_) {
      Slot& slot = slots_[i];
      if (slot.id == kMissing) {
        slot = {head, uint32_t(bytes.size()), id};
        return kMissing;
      }
      if (matches(slot, head, bytes)) return slot.id;
    }
  }

  uint32_t find(std::string_view bytes) const {
    uint64_t head = head_of(bytes);
    for (size_t i = hash(head, bytes) & mask_;; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.id == kMissing) return kMissing;
      if (matches(slot, head, bytes)) return slot.id;
    }
  }

 private:
  struct Slot {
    uint64_t head;
    uint32_t length, id;
  };
  static uint64_t head_of(std::string_view bytes) {
    uint64_t head = 0;
    std::memcpy(&head, bytes.data(), std::min<size_t>(bytes.size(), 8));
    return head;
  }
  bool matches(const Slot& slot, uint64_t head, std::string_view bytes) const {
    return slot.head == head && slot.length == bytes.size() &&
           (bytes.size() <= 8 || std::memcmp(tokens_[slot.id].data() + 8, bytes.data() + 8, bytes.size() - 8) == 0);
  }
  static uint64_t hash(uint64_t head, std::string_view bytes) {
    uint64_t h = (head ^ (bytes.size() * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
    for (size_t i = 8; i < bytes.size(); i += 8) {
      uint64_t word = 0;
      std::memcpy(&word, bytes.data() + i, std::min<size_t>(bytes.size() - i, 8));
      h = (h ^ (h >> 31) ^ word) * 0x94D049BB133111EBull;
    }
    return h ^ (h >> 29);
  }

  const std::vector<std::string>& tokens_;
  HugePageArray<Slot> slots_;
  size_t mask_;
};

Tokenizer::Tokenizer(TokenizerSpec spec) : spec_(std::move(spec)), serial_(++tokenizers_built) {
  const auto& tokens = spec_.token_bytes;
  MT_USER_CHECK(!tokens.empty(), "tokenizer {}: the vocabulary is empty", spec_.name);
  token_ids_ = std::make_unique<TokenTable>(tokens);
  for (uint32_t id = 0; id < tokens.size(); ++id) {
    if (tokens[id].empty()) continue;  // an id used by a special token, or unused
    uint32_t existing = token_ids_->insert(id);
    MT_USER_CHECK(existing == TokenTable::kMissing, "tokenizer {}: token id {} repeats the bytes of token id {}",
                  spec_.name, id, existing);
  }
  for (int byte = 0; byte < 256; ++byte) {
    char single = static_cast<char>(byte);
    uint32_t found = token_ids_->find(std::string_view(&single, 1));
    MT_USER_CHECK(found != TokenTable::kMissing,
                  "tokenizer {}: byte 0x{:02x} has no token (byte-level BPE needs all 256)", spec_.name, byte);
    byte_token_[byte] = found;
  }

  vocab_size_ = static_cast<uint32_t>(tokens.size());
  for (const SpecialToken& special : spec_.special_tokens) {
    MT_USER_CHECK(!special.text.empty(), "tokenizer {}: a special token has empty text", spec_.name);
    special_ids_[special.text] = special.id;
    vocab_size_ = std::max(vocab_size_, special.id + 1);
  }
  if (!spec_.end_of_text.empty()) {
    auto it = special_ids_.find(spec_.end_of_text);
    MT_USER_CHECK(it != special_ids_.end(), "tokenizer {}: the end-of-text token {} is not a special token", spec_.name,
                  spec_.end_of_text);
    end_of_text_id_ = it->second;
  }

  if (spec_.merges.empty()) {
    // tiktoken ranks: the pair (a, b) merges with the rank (id) of the token whose bytes are bytes(a) + bytes(b).
    // Collected first so that the table is sized by the pairs that exist, not by the bytes (cl100k: 233 k pairs,
    // 8 MB, instead of 544 k bytes, 32 MB): a smaller table misses the caches less.
    std::vector<std::array<uint32_t, 3>> rules;  // left, right, id
    for (uint32_t id = 0; id < tokens.size(); ++id) {
      std::string_view bytes = tokens[id];
      for (size_t cut = 1; cut < bytes.size(); ++cut) {
        uint32_t left = token_ids_->find(bytes.substr(0, cut));
        if (left == TokenTable::kMissing) continue;
        uint32_t right = token_ids_->find(bytes.substr(cut));
        if (right == TokenTable::kMissing) continue;
        rules.push_back({left, right, id});
      }
    }
    pairs_ = std::make_unique<PairTable>(rules.size());
    for (const auto& [left, right, id] : rules) pairs_->insert(left, right, {id, id});
  } else {
    pairs_ = std::make_unique<PairTable>(spec_.merges.size());
    for (uint32_t rank = 0; rank < spec_.merges.size(); ++rank) {
      const MergeRule& m = spec_.merges[rank];
      pairs_->insert(m.left, m.right, {rank, m.result});
    }
  }

  if (!spec_.pattern.empty()) pre_tokenizer_ = std::make_unique<RegexPattern>(spec_.pattern);
  if (!spec_.special_tokens.empty()) {
    std::vector<std::string> texts;
    for (const SpecialToken& special : spec_.special_tokens) texts.push_back(special.text);
    // Longest first, so that a special token that is a prefix of another does not hide it.
    std::sort(texts.begin(), texts.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
    std::string alternation;
    for (const std::string& text : texts) alternation += (alternation.empty() ? "" : "|") + regex_quote(text);
    special_finder_ = std::make_unique<RegexPattern>(alternation);
  }
}

Tokenizer::~Tokenizer() = default;

void Tokenizer::encode_piece(std::string_view piece, std::vector<uint32_t>& out) const {
  if (piece.size() == 1) {  // spaces, punctuation: no table to look at
    out.push_back(byte_token_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  if (spec_.whole_piece_lookup) {
    uint32_t id = token_ids_->find(piece);
    if (id != TokenTable::kMissing) {
      out.push_back(id);
      return;
    }
  }
  // parts[i] is the token of the i-th part; merges[i] the rule for merging parts i and i+1. Short pieces (nearly
  // all) use the stack.
  constexpr size_t kStackParts = 64;
  uint32_t stack_parts[kStackParts];
  PairTable::Merge stack_merges[kStackParts];
  std::vector<uint32_t> heap_parts;
  std::vector<PairTable::Merge> heap_merges;
  uint32_t* parts = stack_parts;
  PairTable::Merge* merges = stack_merges;
  if (piece.size() > kStackParts) {
    heap_parts.resize(piece.size());
    heap_merges.resize(piece.size());
    parts = heap_parts.data();
    merges = heap_merges.data();
  }
  size_t count = piece.size();
  for (size_t i = 0; i < count; ++i) parts[i] = byte_token_[static_cast<uint8_t>(piece[i])];
  for (size_t i = 0; i + 1 < count; ++i) merges[i] = pairs_->find(parts[i], parts[i + 1]);
  while (count > 1) {
    size_t best = 0;
    uint32_t best_rank = PairTable::kNoRank;
    for (size_t i = 0; i + 1 < count; ++i) {
      if (merges[i].rank < best_rank) {
        best_rank = merges[i].rank;
        best = i;
      }
    }
    if (best_rank == PairTable::kNoRank) break;
    parts[best] = merges[best].result;
    for (size_t i = best + 1; i + 1 < count; ++i) parts[i] = parts[i + 1];
    for (size_t i = best + 1; i + 2 < count; ++i) merges[i] = merges[i + 1];
    --count;
    if (best + 1 < count) merges[best] = pairs_->find(parts[best], parts[best + 1]);
    if (best > 0) merges[best - 1] = pairs_->find(parts[best - 1], parts[best]);
  }
  out.insert(out.end(), parts, parts + count);
}

void Tokenizer::encode_ordinary(std::string_view text, std::vector<uint32_t>& out) const {
  if (!pre_tokenizer_) {
    encode_piece(text, out);
    return;
  }
  PieceCache& cache = PieceCache::for_thread(serial_);
  pre_tokenizer_->split(text, [&](std::string_view piece) {
    uint64_t key[2];
    PieceCache::Entry* set = cache.set(piece, key);
    if (!set) return encode_piece(piece, out);
    if (const PieceCache::Entry* entry = PieceCache::find(set, piece, key)) {
      for (uint16_t i = 0; i < entry->count; ++i) out.push_back(entry->ids[i]);
      return;
    }
    size_t before = out.size();
    encode_piece(piece, out);
    PieceCache::keep(set, piece, key, out.data() + before, out.size() - before);
  });
}

void Tokenizer::encode(std::string_view text, std::vector<uint32_t>& out, SpecialTokens specials) const {
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired.assign(text);
    make_valid_utf8(repaired);
    text = repaired;
  }
  if (specials == SpecialTokens::as_text || !special_finder_) {
    encode_ordinary(text, out);
    return;
  }
  size_t position = 0;
  while (position < text.size()) {
    auto [begin, end] = special_finder_->find(text, position);
    if (begin == std::string_view::npos) break;
    encode_ordinary(text.substr(position, begin - position), out);
    out.push_back(special_ids_.at(text.substr(begin, end - begin)));
    position = end;
  }
  encode_ordinary(text.substr(position), out);
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text, SpecialTokens specials) const {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3 + 16);
  encode(text, out, specials);
  return out;
}

std::vector<uint32_t> Tokenizer::encode_parallel(std::string_view text, int threads) const {
  constexpr size_t kMinChunk = 256 * 1024;
  if (threads <= 1 || text.size() < 2 * kMinChunk || !spec_.splittable) return encode(text);
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired.assign(text);
    make_valid_utf8(repaired);
    text = repaired;
  }
  // Cut into about 4 chunks per thread at safe positions; a chunk without a safe position grows into the next.
  size_t target = std::max(kMinChunk, text.size() / (4 * size_t(threads)));
  std::vector<size_t> cuts = {0};
  while (text.size() - cuts.back() > target) {
    size_t cut = find_safe_split(text, cuts.back() + target / 2, cuts.back() + target);
    if (cut == 0) cut = find_safe_split(text, cuts.back() + target, text.size() - 1);
    if (cut == 0) break;
    cuts.push_back(cut);
  }
  cuts.push_back(text.size());
  size_t chunks = cuts.size() - 1;
  std::vector<std::vector<uint32_t>> results(chunks);
  EncodeHelpers::instance().run(chunks, std::min<int>(threads, int(chunks)) - 1, [&](size_t i) {
    // Into a vector of this thread's own: results[i] sits next to the other threads' vectors, and appending
    // through it would write their shared cache line on every token.
    std::vector<uint32_t> ids;
    ids.reserve((cuts[i + 1] - cuts[i]) / 3);
    encode_ordinary(text.substr(cuts[i], cuts[i + 1] - cuts[i]), ids);
    results[i] = std::move(ids);
  });
  size_t total = 0;
  for (const auto& r : results) total += r.size();
  std::vector<uint32_t> out;
  out.reserve(total);
  for (const auto& r : results) out.insert(out.end(), r.begin(), r.end());
  return out;
}

std::string Tokenizer::decode(const uint32_t* ids, size_t count) const {
  std::string text;
  for (size_t i = 0; i < count; ++i) {
    uint32_t id = ids[i];
    if (id < spec_.token_bytes.size() && !spec_.token_bytes[id].empty()) {
      text += spec_.token_bytes[id];
      continue;
    }
    auto special = std::find_if(spec_.special_tokens.begin(), spec_.special_tokens.end(),
                                [id](const SpecialToken& s) { return s.id == id; });
    MT_USER_CHECK(special != spec_.special_tokens.end(), "tokenizer {}: token id {} is not in the vocabulary (size {})",
                  spec_.name, id, vocab_size_);
    text += special->text;
  }
  return text;
}

size_t find_safe_split(std::string_view text, size_t floor, size_t limit) {
  auto is_ascii_letter = [](unsigned char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; };
  auto is_space = [](unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); };
  if (text.size() < 3) return 0;
  limit = std::min(limit, text.size() - 2);
  for (size_t p = limit; p > floor && p >= 2; --p) {
    const unsigned char before = text[p - 2], last = text[p - 1], first = text[p], second = text[p + 1];
    if (last == '\n' && is_ascii_letter(first) && before < 0x80 && !is_space(before)) return p;
    if (is_ascii_letter(last) && first == ' ' && is_ascii_letter(second)) return p;
  }
  return 0;
}

namespace {

// The length of the valid UTF-8 sequence at text[i], or 0 if it is not valid (overlong, surrogate, > U+10FFFF).
size_t utf8_sequence_length(std::string_view text, size_t i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  size_t length;
  uint32_t low = 0x80, high = 0xBF;  // the allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  if (byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (size_t k = 2; k < length; ++k)
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  return length;
}

}  // namespace

bool is_valid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    // Fast path over ASCII, 8 bytes at a time.
    while (i + 8 <= text.size()) {
      uint64_t word;
      std::memcpy(&word, text.data() + i, 8);
      if (word & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= text.size()) break;
    size_t length = utf8_sequence_length(text, i);
    if (length == 0) return false;
    i += length;
  }
  return true;
}

bool make_valid_utf8(std::string& text) {
  std::string repaired;
  bool changed = false;
  for (size_t i = 0; i < text.size();) {
    size_t length = utf8_sequence_length(text, i);
    if (length == 0) {
      repaired += "\xEF\xBF\xBD";
      changed = true;
      ++i;
    } else {
      repaired.append(text, i, length);
      i += length;
    }
  }
  if (changed) text = std::move(repaired);
  return changed;
}

}  // namespace meshtrain::tokenizer
