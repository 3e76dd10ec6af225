// read_plan.hpp — ReadPlan: which rows of every global batch one host reads, and where each local device's rows are.
//
// Computed from the mesh and the input sharding (data.input_sharding, rows over (data, fsdp) by default), never from
// a process index: the host reads the distinct row blocks its devices hold (host_local_layout), each once, in
// ascending order, packed into its host-local batch. Hosts whose devices hold the same rows (replicas along an axis
// the sharding leaves out) read the same rows. torchprime's "minibatch" mode is the case where the rows are split
// over every device of the job: each host then reads only global_batch_size / hosts rows.
#pragma once

#include "meshtrain/mesh/mesh.hpp"
#include "meshtrain/sharding/spec.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace meshtrain::data {

// The spec of the input batch from data.input_sharding (a parse error names the key) on `mesh`: with expert > 1 and
// a spec that leaves expert out, the rows are split over expert too (after the axes the spec names).
sharding::PartitionSpec input_sharding(const std::string& text, const mesh::Mesh& mesh);

// The rows [begin, begin + count) of the global batch that one device holds; they sit at `local_begin` in its host's
// host-local batch.
struct DeviceRows {
  int device = 0;
  int64_t begin = 0;
  int64_t count = 0;
  int64_t local_begin = 0;

  std::vector<int64_t> rows() const;  // begin, begin + 1, ..., begin + count - 1
};

struct ReadPlan {
  int host = 0;
  std::vector<int64_t> rows;        // the global rows the host reads, in host-local order
  std::vector<DeviceRows> devices;  // one per local device, in local order
  bool minibatch = false;           // the rows are split over every device of the job

  // The plan of `host` for a batch [global_batch_size, block_size] under `spec` (a 2-D spec that leaves the sequence
  // dimension whole and is not partial). UserError naming global_batch_size / data.input_sharding otherwise.
  static ReadPlan make(const mesh::Mesh& mesh, int64_t global_batch_size, int64_t block_size,
                       const sharding::PartitionSpec& spec, int host);

  // "host 0 reads rows 0:4 of 8; device 0 holds rows 0:1, device 1 holds rows 1:2, ..."
  std::string summary(int64_t global_batch_size) const;
};

// "0:4" for consecutive rows, "0:2, 4:6" otherwise (half-open ranges, ascending input).
std::string rows_string(const std::vector<int64_t>& rows);

}  // namespace meshtrain::data
