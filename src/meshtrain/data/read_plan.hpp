// read_plan.hpp — ReadPlan: which rows of every global batch one host reads, which token ranges of those rows, and
// where each local device's tile (its rows x its sequence block) is.
//
// Computed from the mesh and the input sharding (data.input_sharding, rows over (data, fsdp) by default, the
// sequence over context when context parallelism is on), never from a process index: the host reads the distinct
// row blocks and sequence blocks its devices hold (host_local_layout), each once, in ascending order, packed into its
// host-local batch. Hosts whose devices hold the same tiles (replicas along an axis the sharding leaves out) read the
// same tokens. torchprime's "minibatch" mode is the case where the tiles are split over every device of the job.
//
// The sequence dimension of the global batch is in *load-balanced order* when it is split over C = context > 1
// ranks: block r (block_size / C tokens) of the global row is [chunk r, chunk 2C-1-r] of the natural row cut into 2C
// chunks (mesh::MeshRoles::context_chunks). So a host reads, of every row it holds, the chunks of the distinct
// context ranks of its devices (plus the one token after each, for the labels), and places context rank r's two
// chunks, in that order, at that block's place in its host-local batch. With C = 1 the row is in natural order.
#pragma once

#include "meshtrain/mesh/mesh.hpp"
#include "meshtrain/mesh/mesh_roles.hpp"
#include "meshtrain/sharding/spec.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain::data {

// The spec of the input batch from data.input_sharding (a parse error names the key) on `mesh`: with expert > 1 and
// a spec that leaves expert out, the rows are split over expert too (after the axes the spec names); with
// context > 1 and a spec whose sequence dimension is empty (and that names context nowhere), the sequence is split
// over context. UserError naming data.input_sharding when the sequence dimension names an axis other than context.
sharding::PartitionSpec input_sharding(const std::string& text, const mesh::Mesh& mesh);

// One block of the sequence dimension: context rank `context_rank`'s chunks of a row (natural token positions, in
// load-balanced order; the whole row when the sequence is not split), at `begin` of the global batch's sequence and
// at `local_begin` of the host-local batch's.
struct SequenceBlock {
  int context_rank = 0;
  std::vector<mesh::TokenRange> chunks;
  int64_t begin = 0;
  int64_t local_begin = 0;

  int64_t size() const;  // tokens: block_size / C
};

// Tokens `range` of a row (natural positions), placed at `local_begin` of the host-local row: what the host loader
// copies, plus the token after the range for the labels.
struct RowPiece {
  mesh::TokenRange range;
  int64_t local_begin = 0;
  bool operator==(const RowPiece& other) const { return range == other.range && local_begin == other.local_begin; }
};

// One device's tile of the global batch: rows [begin, begin + count), at `local_begin` of the host-local batch, and
// its sequence block.
struct DeviceTile {
  int device = 0;
  int64_t begin = 0;
  int64_t count = 0;
  int64_t local_begin = 0;
  SequenceBlock sequence;

  std::vector<int64_t> rows() const;  // begin, begin + 1, ..., begin + count - 1
  // The tile in the global batch ([rows, sequence block]) and where it starts in the host-local batch.
  sharding::ShardBounds bounds() const;
  sharding::Shape local_offset() const;
};

struct ReadPlan {
  int host = 0;
  int64_t block_size = 0;
  int context = 1;                     // C: the blocks the sequence is split into (1: not split)
  std::vector<int64_t> rows;           // the global rows the host reads, in host-local order
  std::vector<SequenceBlock> sequence;  // the sequence blocks it reads of each row, in host-local order
  std::vector<RowPiece> pieces;        // the same as token ranges to copy, adjacent ones merged, in host-local order
  std::vector<DeviceTile> devices;     // one per local device, in local order
  bool minibatch = false;              // the tiles are split over every device of the job

  // The plan of `host` for a batch [global_batch_size, block_size] under `spec` (a 2-D spec, not partial, whose
  // sequence dimension is whole or split over context). UserError naming global_batch_size, block_size or
  // data.input_sharding otherwise.
  static ReadPlan make(const mesh::Mesh& mesh, int64_t global_batch_size, int64_t block_size,
                       const sharding::PartitionSpec& spec, int host);

  bool sequence_split() const { return context > 1; }
  // The tokens of a row the host reads, in natural order, adjacent ranges merged.
  std::vector<mesh::TokenRange> token_ranges() const;
  // Tokens per host-local row.
  int64_t local_tokens() const;

  // "host 0 reads rows 0:4 of 8; device 0 holds rows 0:1, device 1 holds rows 1:2, ..."; when the sequence is split,
  // "host 0 reads rows 0:4 of 8, tokens [0:2048, 6144:8192] of 8192 in load-balanced order; device 0 holds rows 0:2
  // x tokens [0:1024, 7168:8192], ..."
  std::string summary(int64_t global_batch_size) const;
};

// "0:4" for consecutive rows, "0:2, 4:6" otherwise (half-open ranges, ascending input).
std::string rows_string(const std::vector<int64_t>& rows);

}  // namespace meshtrain::data
