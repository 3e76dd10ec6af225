// dataset.hpp — TokenDataset: the samples of a token-shard directory, read from its memory-mapped shards.
//
// The shards are one token stream (shard 0, then shard 1, ...), packed across document boundaries the way
// torchprime groups texts. Sample i is the block_size + 1 tokens starting at token i * block_size: its first
// block_size tokens are the inputs, its last block_size the next-token labels (consecutive samples share one token).
// A sample may straddle two shards. num_samples = (total_tokens - 1) / block_size; the tail is never read.
#pragma once

#include "meshtrain/mesh/mesh_roles.hpp"
#include "meshtrain/token_shards/shard_reader.hpp"

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace meshtrain::data {

class TokenDataset {
 public:
  // `path_or_name` (the value of dataset.path): a token-shard directory, or the name of one under
  // <assets>/shards. UserError naming dataset.path and both places looked at when neither exists.
  static std::filesystem::path resolve(const std::string& path_or_name);

  // Opens and validates the directory (token_shards::ShardDirectory::open; `payload_check` says when each shard's bytes
  // are checksummed), which includes every token id being below the tokenizer's vocab_size; that must fit int32.
  TokenDataset(const std::filesystem::path& dir, int64_t block_size,
               token_shards::PayloadCheck payload_check = token_shards::PayloadCheck::at_open);

  const std::filesystem::path& path() const { return shards_.path(); }
  const token_shards::ShardIndex& index() const { return shards_.index(); }
  int64_t block_size() const { return block_size_; }
  int64_t num_samples() const { return num_samples_; }

  // Writes sample `id`'s block_size + 1 tokens, widened to int32, to `out`: the only copy of the data path. UserError
  // naming the shard file, the sample and the id if an id is not below the tokenizer's vocab_size (a shard whose
  // index understates its largest id; the trainer requires the model's vocab_size to cover the tokenizer's).
  void read_sample(int64_t id, int32_t* out) const { read_sample(id, {0, block_size_ + 1}, out); }
  // The same for tokens `range` of the sample only (positions within it, inside [0, block_size + 1)): the token
  // ranges a host reads when context parallelism splits the rows (ReadPlan).
  void read_sample(int64_t id, mesh::TokenRange range, int32_t* out) const;
  // Writes the document number of each of sample `id`'s first block_size tokens (its inputs) to `out`: 0 for the
  // document of its first token, one more at each document start after it (a shard starts a document).
  void read_sample_documents(int64_t id, int32_t* out) const { read_sample_documents(id, {0, block_size_}, out); }
  // The same numbers (counted from the sample's first token, not from range.begin) for the tokens `range` only
  // (inside [0, block_size)); walks the document starts before the range, not its tokens.
  void read_sample_documents(int64_t id, mesh::TokenRange range, int32_t* out) const;

 private:
  // Calls piece_fn(shard, offset, piece, first) for each shard's part of tokens `range` of sample `id` (positions
  // within the sample), in stream order (a sample may straddle shards); `first` for the part in the range's first
  // shard.
  template <typename PieceFn>
  void for_each_piece(int64_t id, mesh::TokenRange range, PieceFn&& piece_fn) const;

  token_shards::ShardDirectory shards_;
  int64_t block_size_;
  int64_t num_samples_;
  std::vector<uint64_t> shard_starts_;  // position of each shard's first token in the stream, then total_tokens
};

}  // namespace meshtrain::data
