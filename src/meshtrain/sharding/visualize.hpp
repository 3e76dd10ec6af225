// visualize.hpp — the sharding picture: which device holds which part of a global tensor.
//
// The grid tiles the first two dimensions (a 1-D tensor is a column of tiles); every tile names the index ranges of
// the shard(s) in it and, for each device holding them, the device id, its host and its mesh coordinates along the
// axes of size > 1. Devices holding the same shard (replicas) are listed together in one tile; for rank > 2 a tile
// lists each distinct shard of the remaining dimensions with its devices. Tiles have equal sizes, which is
// proportional since shards of one tensor have equal sizes. Box-drawing characters, with a background colour per
// tile when asked (a terminal). Example, a weight [4, 8] with rows over data and columns over tensor on 2 hosts x 4
// devices, data=2 x fsdp=2 x tensor=2:
//
//   w bf16[4@data, 8@tensor] on mesh data=2 x fsdp=2 x tensor=2 x expert=1 (2 hosts x 4 devices per host)
//   ┌─────────────────────────────────────────────┬─────────────────────────────────────────────┐
//   │                 [0:2, 0:4]                  │                 [0:2, 4:8]                  │
//   │ device 0 (host 0, data=0, fsdp=0, tensor=0) │ device 1 (host 0, data=0, fsdp=0, tensor=1) │
//   │ device 2 (host 0, data=0, fsdp=1, tensor=0) │ device 3 (host 0, data=0, fsdp=1, tensor=1) │
//   ├─────────────────────────────────────────────┼─────────────────────────────────────────────┤
//   │                 [2:4, 0:4]                  │                 [2:4, 4:8]                  │
//   │ device 4 (host 1, data=1, fsdp=0, tensor=0) │ device 5 (host 1, data=1, fsdp=0, tensor=1) │
//   │ device 6 (host 1, data=1, fsdp=1, tensor=0) │ device 7 (host 1, data=1, fsdp=1, tensor=1) │
//   └─────────────────────────────────────────────┴─────────────────────────────────────────────┘
//   Devices listed under one range hold the same shard (replicas along fsdp).
#pragma once

#include "meshtrain/mesh/mesh.hpp"
#include "meshtrain/runtime/device_context.hpp"
#include "meshtrain/sharding/global_tensor.hpp"
#include "meshtrain/sharding/spec.hpp"

#include <c10/core/ScalarType.h>

#include <string>

namespace meshtrain::sharding {

struct PictureOptions {
  bool color = false;  // ANSI background colours per tile (for a terminal)
};

// The picture (a title line naming the tensor, its type string and the mesh, the grid, and a line saying what devices
// listed together mean), ending with a newline.
std::string render_sharding(const mesh::Mesh& mesh, const std::string& name, c10::ScalarType dtype,
                            const Shape& shape, const PartitionSpec& spec, const PictureOptions& options = {});
std::string render_sharding(const GlobalTensor& tensor, const std::string& name, const PictureOptions& options = {});

// The input batch of a run, i32[global_batch_size, block_size] with `spec` (by default rows over (data, fsdp)), named
// input_ids: what `meshtrain plan --show-sharding` draws.
std::string render_input_batch(const mesh::Mesh& mesh, int64_t global_batch_size, int64_t block_size,
                               const PictureOptions& options = {},
                               const PartitionSpec& spec = PartitionSpec::sharded_rows(2, {mesh::Axis::data,
                                                                                             mesh::Axis::fsdp}));

// True when the file descriptor is a terminal and NO_COLOR is not set.
bool wants_color(int fd);

enum class PrintScope {
  once_per_job,   // only device 0 prints
  once_per_host,  // the first local device of every host prints
};

// Writes the picture of `tensor` to the log (a block), from the devices `scope` selects; the others do nothing.
// Colour when stderr is a terminal. No communication.
void print_sharding(const runtime::DeviceContext& ctx, const GlobalTensor& tensor, const std::string& name,
                    PrintScope scope = PrintScope::once_per_job);

}  // namespace meshtrain::sharding
