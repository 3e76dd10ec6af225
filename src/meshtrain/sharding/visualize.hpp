// visualize.hpp — the sharding picture: which device holds which part of a global tensor, as a grid of tiles over the
// first two dimensions, each naming its index ranges and the devices that hold them (id, host, mesh coordinates),
// replicas listed together; for the input batch with its sequence over context, the natural tokens of each tile. How to
// read it, with examples: docs/sharding.md, "The picture". No call communicates.
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
// input_ids: what `meshtrain plan --show-sharding` draws. When the sequence is split over context > 1 (in
// load-balanced order: data/read_plan.hpp), each tile also names the natural token ranges its block holds.
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
// The same for the input batch (render_input_batch of `input_ids`).
void print_input_batch(const runtime::DeviceContext& ctx, const GlobalTensor& input_ids,
                       PrintScope scope = PrintScope::once_per_job);

}  // namespace meshtrain::sharding
