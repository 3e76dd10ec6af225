// dataset.cpp — path resolution, sample arithmetic and the widening read across shard boundaries.
#include "meshtrain/data/dataset.hpp"

#include "meshtrain/common/error.hpp"
#include "meshtrain/tokenizer/tokenizer.hpp"

#include <algorithm>
#include <cstdint>

namespace fs = std::filesystem;

namespace meshtrain::data {
namespace {

// The error for a piece of sample `id` (tokens [offset, offset + count) of `shard`, copied to `ids`) holding an id
// at or beyond `vocab_size`, naming the first such id. Out of line: the loader's loop only compares a maximum.
[[noreturn, gnu::cold, gnu::noinline]] void throw_token_beyond_vocabulary(const token_shards::TokenShard& shard,
                                                                          const token_shards::ShardIndex& index, int64_t id,
                                                                          uint64_t offset, uint64_t count,
                                                                          const int32_t* ids) {
  const uint32_t vocab_size = index.tokenizer.vocab_size;
  const auto* bad = std::find_if(ids, ids + count, [&](int32_t t) { return static_cast<uint32_t>(t) >= vocab_size; });
  throw UserError(fmt::format(
      "{}: token id check failed: sample {} holds token id {} (token {} of the shard), not below the vocabulary size "
      "{} of tokenizer {}; the index says the shard's largest id is {} (the shard or its index.json was altered or "
      "damaged)", shard.path().string(), id, static_cast<uint32_t>(*bad), offset + (bad - ids), vocab_size,
      index.tokenizer.name, shard.max_token().value_or(0)));
}

}  // namespace

fs::path TokenDataset::resolve(const std::string& path_or_name) {
  MT_USER_CHECK(!path_or_name.empty(), "dataset.path is empty (a token-shard directory or a name under {})",
                (tokenizer::assets_dir() / "shards").string());
  if (fs::is_directory(path_or_name)) return path_or_name;
  const fs::path named = tokenizer::assets_dir() / "shards" / path_or_name;
  MT_USER_CHECK(fs::is_directory(named),
                "dataset.path={}: no such token-shard directory (looked at {} and {}; `meshtrain prepare` makes one)",
                path_or_name, fs::absolute(path_or_name).string(), named.string());
  return named;
}

TokenDataset::TokenDataset(const fs::path& dir, int64_t block_size, token_shards::PayloadCheck payload_check)
    : shards_(token_shards::ShardDirectory::open(dir, token_shards::OpenOptions{"", payload_check})), block_size_(block_size) {
  MT_USER_CHECK(block_size > 0, "block_size must be positive, got {}", block_size);
  // The shard directory has checked every token id against its tokenizer's vocabulary (and the trainer checks that
  // vocabulary against the model's); the ids are handed on as int32, so the vocabulary must fit that.
  MT_USER_CHECK(index().tokenizer.vocab_size <= uint64_t(INT32_MAX) + 1,
                "{}: token id check failed: vocab_size {} of tokenizer {} has ids beyond int32, the type samples are "
                "read as", (dir / token_shards::kIndexFileName).string(), index().tokenizer.vocab_size,
                index().tokenizer.name);
  uint64_t start = 0;
  for (const token_shards::TokenShard& shard : shards_.shards()) {
    shard_starts_.push_back(start);
    start += shard.token_count();
  }
  shard_starts_.push_back(start);
  const int64_t total = static_cast<int64_t>(start);
  num_samples_ = total > 0 ? (total - 1) / block_size : 0;
  MT_USER_CHECK(num_samples_ > 0, "{}: {} tokens make no sample of block_size + 1 = {} tokens", dir.string(), total,
                block_size + 1);
}

template <typename PieceFn>
void TokenDataset::for_each_piece(int64_t id, mesh::TokenRange range, PieceFn&& piece_fn) const {
  MT_CHECK(id >= 0 && id < num_samples_, "sample {} is outside the dataset's {} samples", id, num_samples_);
  MT_CHECK(range.begin >= 0 && range.begin <= range.end && range.end <= block_size_ + 1,
           "tokens {}:{} are outside sample {}'s {} + 1", range.begin, range.end, id, block_size_);
  uint64_t begin = static_cast<uint64_t>(id * block_size_ + range.begin), left = static_cast<uint64_t>(range.size());
  if (left == 0) return;
  // The shard holding `begin`: the last whose start is <= begin.
  size_t s = std::upper_bound(shard_starts_.begin(), shard_starts_.end(), begin) - shard_starts_.begin() - 1;
  for (bool first = true; left > 0; first = false, ++s) {
    const token_shards::TokenShard& shard = shards_.shards()[s];
    const uint64_t offset = begin - shard_starts_[s], piece = std::min(left, shard.token_count() - offset);
    piece_fn(shard, offset, piece, first);
    begin += piece;
    left -= piece;
  }
}

void TokenDataset::read_sample(int64_t id, mesh::TokenRange range, int32_t* out) const {
  for_each_piece(id, range,
                 [&](const token_shards::TokenShard& shard, uint64_t offset, uint64_t piece, bool /*first*/) {
                   // int32 and uint32 may alias; token ids are below the vocabulary size, at most 2^31 (checked on
                   // construction), and each id is checked here, where it is handed on (the index's max_token is
                   // trusted when checksums are computed on first read).
                   if (shard.copy_tokens(offset, piece, reinterpret_cast<uint32_t*>(out)) >=
                       index().tokenizer.vocab_size)
                     throw_token_beyond_vocabulary(shard, index(), id, offset, piece, out);
                   out += piece;
                 });
}

void TokenDataset::read_sample_documents(int64_t id, mesh::TokenRange range, int32_t* out) const {
  MT_CHECK(range.end <= block_size_, "document numbers of tokens {}:{}: a sample has {} inputs", range.begin,
           range.end, block_size_);
  // The numbers count from the sample's first token: walk its pieces from there, a run of tokens of one document at a
  // time, writing only the positions inside the range.
  int32_t document = 0;
  int64_t position = 0;  // of the piece's first token in the sample
  for_each_piece(id, {0, range.end}, [&](const token_shards::TokenShard& shard, uint64_t offset, uint64_t piece,
                                         bool first) {
    // The shard's document starts (checked non-decreasing from 0 when it was opened, the last entry its token count);
    // the first one after `offset`.
    const uint64_t* starts = shard.document_starts();
    const uint64_t* next = std::upper_bound(starts, starts + shard.document_count() + 1, offset);
    if (!first && piece > 0) ++document;  // a shard begins with a document
    for (uint64_t k = 0; k < piece;) {
      const uint64_t run_end = std::min(*next - offset, piece);  // tokens k .. run_end - 1 are in `document`
      const int64_t from = std::max(position + static_cast<int64_t>(k), range.begin),
                    to = position + static_cast<int64_t>(run_end);
      if (from < to) out = std::fill_n(out, to - from, document);
      k = run_end;
      if (k < piece) {
        ++document;
        while (*next <= offset + k) ++next;  // empty documents start at the same token
      }
    }
    position += static_cast<int64_t>(piece);
  });
}

}  // namespace meshtrain::data
