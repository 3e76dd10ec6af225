// visualize.cpp — drawing the sharding picture: tiles over the first two dimensions, replicas together, colours.
#include "meshtrain/sharding/visualize.hpp"

#include "meshtrain/common/log.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <functional>
#include <map>

namespace meshtrain::sharding {
namespace {

// Matplotlib's tab20, the colour map JAX's picture uses.
constexpr std::array<std::array<int, 3>, 20> kTileColors = {{
    {31, 119, 180}, {174, 199, 232}, {255, 127, 14}, {255, 187, 120}, {44, 160, 44},  {152, 223, 138}, {214, 39, 40},
    {255, 152, 150}, {148, 103, 189}, {197, 176, 213}, {140, 86, 75},  {196, 156, 148}, {227, 119, 194}, {247, 182, 210},
    {127, 127, 127}, {199, 199, 199}, {188, 189, 34},  {219, 219, 141}, {23, 190, 207},  {158, 218, 229},
}};

// Background colour of tile `index`, with black or white text by luminance.
std::string color_on(int index) {
  const auto& rgb = kTileColors[index % kTileColors.size()];
  const double luminance = 0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2];
  const int text = luminance > 140 ? 0 : 255;
  return fmt::format("\x1b[48;2;{};{};{}m\x1b[38;2;{};{};{}m", rgb[0], rgb[1], rgb[2], text, text, text);
}
constexpr const char* kColorOff = "\x1b[0m";

std::string device_label(const mesh::Mesh& mesh, int device) {
  const mesh::DeviceInfo& info = mesh.device(device);
  std::string out = fmt::format("device {} (host {}", device, info.host);
  for (mesh::Axis axis : mesh::kAllAxes)
    if (mesh.size(axis) > 1) out += fmt::format(", {}={}", mesh::axis_name(axis), info.coords[static_cast<int>(axis)]);
  return out + ")";
}

std::string repeat(const std::string& piece, size_t times) {
  std::string out;
  for (size_t i = 0; i < times; ++i) out += piece;
  return out;
}

std::string centered(const std::string& text, size_t width) {
  const size_t left = (width - text.size()) / 2;
  return std::string(left, ' ') + text + std::string(width - text.size() - left, ' ');
}

// One tile: the text lines and the colour index of its first shard.
struct Tile {
  std::vector<std::string> lines;
  int color = 0;
};

// A line under a shard's ranges (empty: none), and a line after the picture (empty: none).
using ShardNote = std::function<std::string(const ShardBounds&)>;

std::string render(const mesh::Mesh& mesh, const std::string& name, c10::ScalarType dtype, const Shape& shape,
                   const PartitionSpec& spec, const PictureOptions& options, const ShardNote& shard_note,
                   const std::string& footnote) {
  check_spec(mesh, shape, spec);
  const int rank = static_cast<int>(shape.size());
  static const std::vector<mesh::Axis> kNoAxes;
  const std::vector<mesh::Axis>& row_axes = rank >= 1 ? spec.dims[0] : kNoAxes;
  const std::vector<mesh::Axis>& col_axes = rank >= 2 ? spec.dims[1] : kNoAxes;
  const int rows = mesh.size_along(row_axes), cols = mesh.size_along(col_axes);

  // Devices grouped by tile, then by the shard they hold (ordered by its offset); shards numbered for colours.
  std::vector<std::map<Shape, std::vector<int>>> shards_by_tile(static_cast<size_t>(rows) * cols);
  for (const mesh::DeviceInfo& info : mesh.devices()) {
    const int tile = mesh.index_along(info.device, row_axes) * cols + mesh.index_along(info.device, col_axes);
    shards_by_tile[tile][shard_bounds(mesh, shape, spec, info.device).offset].push_back(info.device);
  }
  std::vector<Tile> tiles(shards_by_tile.size());
  int shard_number = 0;
  for (size_t t = 0; t < tiles.size(); ++t) {
    tiles[t].color = shard_number;
    for (const auto& [offset, devices] : shards_by_tile[t]) {
      const ShardBounds bounds = shard_bounds(mesh, shape, spec, devices.front());
      tiles[t].lines.push_back(bounds_string(bounds));
      if (shard_note) tiles[t].lines.push_back(shard_note(bounds));
      for (int device : devices) tiles[t].lines.push_back(device_label(mesh, device));
      ++shard_number;
    }
  }
  size_t width = 0, height = 0;
  for (const Tile& tile : tiles) {
    height = std::max(height, tile.lines.size());
    for (const std::string& line : tile.lines) width = std::max(width, line.size());
  }
  width += 2;  // a space either side

  std::string out = fmt::format("{} {} on mesh {} ({} host{} x {} device{} per host)\n", name,
                                type_string(dtype, shape, spec), mesh.shape().equation(), mesh.hosts(),
                                mesh.hosts() == 1 ? "" : "s", mesh.devices_per_host(),
                                mesh.devices_per_host() == 1 ? "" : "s");
  const std::string bar = repeat("─", width);
  auto border = [&](const char* left, const char* middle, const char* right) {
    std::string line = left;
    for (int c = 0; c < cols; ++c) line += bar + (c + 1 < cols ? middle : right);
    return line + "\n";
  };
  out += border("┌", "┬", "┐");
  for (int r = 0; r < rows; ++r) {
    for (size_t l = 0; l < height; ++l) {
      std::string line = "│";
      for (int c = 0; c < cols; ++c) {
        const Tile& tile = tiles[static_cast<size_t>(r) * cols + c];
        const std::string text = centered(l < tile.lines.size() ? tile.lines[l] : "", width);
        line += options.color ? color_on(tile.color) + text + kColorOff : text;
        line += "│";
      }
      out += line + "\n";
    }
    out += r + 1 < rows ? border("├", "┼", "┤") : border("└", "┴", "┘");
  }

  std::vector<mesh::Axis> replica_axes;
  for (mesh::Axis axis : spec.replica_axes())
    if (mesh.size(axis) > 1) replica_axes.push_back(axis);
  if (!spec.partial.empty())
    out += fmt::format("Devices listed under one range hold addends of a pending sum over {}{}.\n",
                       mesh::axes_label(spec.partial),
                       !replica_axes.empty()
                           ? fmt::format(", and replicas along {}", mesh::axes_label(replica_axes))
                           : std::string());
  else if (!replica_axes.empty())
    out += fmt::format("Devices listed under one range hold the same shard (replicas along {}).\n",
                       mesh::axes_label(replica_axes));
  if (!footnote.empty()) out += footnote + "\n";
  return out;
}

bool prints(const runtime::DeviceContext& ctx, PrintScope scope) {
  return scope == PrintScope::once_per_job ? ctx.device() == 0 : ctx.info().local == 0;
}

}  // namespace

std::string render_sharding(const mesh::Mesh& mesh, const std::string& name, c10::ScalarType dtype,
                            const Shape& shape, const PartitionSpec& spec, const PictureOptions& options) {
  return render(mesh, name, dtype, shape, spec, options, nullptr, "");
}

std::string render_sharding(const GlobalTensor& tensor, const std::string& name, const PictureOptions& options) {
  return render_sharding(tensor.mesh(), name, tensor.dtype(), tensor.global_shape(), tensor.spec(), options);
}

std::string render_input_batch(const mesh::Mesh& mesh, int64_t global_batch_size, int64_t block_size,
                               const PictureOptions& options, const PartitionSpec& spec) {
  const Shape shape = {global_batch_size, block_size};
  const int context = spec.rank() == 2 ? mesh.size_along(spec.dims[1]) : 1;
  if (context == 1) return render_sharding(mesh, "input_ids", c10::ScalarType::Int, shape, spec, options);
  // The sequence over context, in load-balanced order: each tile also names the natural tokens its block holds.
  check_spec(mesh, shape, spec);
  const ShardNote tokens = [&](const ShardBounds& bounds) {
    const int rank = static_cast<int>(bounds.offset[1] / bounds.shape[1]);
    return "tokens " + ranges_string(mesh::MeshRoles::context_chunks(block_size, context, rank));
  };
  return render(mesh, "input_ids", c10::ScalarType::Int, shape, spec, options, tokens,
                fmt::format("The sequence is in load-balanced order: block r holds chunks r and {}-r of the row's {} "
                            "(tokens under each range).", 2 * context - 1, 2 * context));
}

bool wants_color(int fd) { return isatty(fd) && std::getenv("NO_COLOR") == nullptr; }

void print_sharding(const runtime::DeviceContext& ctx, const GlobalTensor& tensor, const std::string& name,
                    PrintScope scope) {
  if (prints(ctx, scope)) log::block(render_sharding(tensor, name, PictureOptions{wants_color(STDERR_FILENO)}));
}

void print_input_batch(const runtime::DeviceContext& ctx, const GlobalTensor& input_ids, PrintScope scope) {
  if (prints(ctx, scope))
    log::block(render_input_batch(input_ids.mesh(), input_ids.global_shape().at(0), input_ids.global_shape().at(1),
                                  PictureOptions{wants_color(STDERR_FILENO)}, input_ids.spec()));
}

}  // namespace meshtrain::sharding
