// build_id.cpp — reads the NT_GNU_BUILD_ID note of the main executable through dl_iterate_phdr.
#include "meshtrain/common/build_id.hpp"

#include <elf.h>
#include <link.h>

#include <fmt/format.h>

#include <cstring>
#include <filesystem>

namespace meshtrain {
namespace {

// dl_iterate_phdr visits the main executable first; its notes are in PT_NOTE segments.
int find_build_id(struct dl_phdr_info* info, size_t, void* out_ptr) {
  auto* out = static_cast<std::string*>(out_ptr);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& segment = info->dlpi_phdr[i];
    if (segment.p_type != PT_NOTE) continue;
    const char* at = reinterpret_cast<const char*>(info->dlpi_addr + segment.p_vaddr);
    const char* end = at + segment.p_memsz;
    while (at + sizeof(ElfW(Nhdr)) <= end) {
      const auto* note = reinterpret_cast<const ElfW(Nhdr)*>(at);
      const char* name = at + sizeof(ElfW(Nhdr));
      const char* desc = name + ((note->n_namesz + 3) & ~3u);
      if (note->n_type == NT_GNU_BUILD_ID && note->n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0 &&
          desc + note->n_descsz <= end) {
        for (uint32_t k = 0; k < note->n_descsz; ++k)
          *out += fmt::format("{:02x}", static_cast<unsigned char>(desc[k]));
        return 1;
      }
      at = desc + ((note->n_descsz + 3) & ~3u);
    }
  }
  return 1;  // only the main executable matters
}

}  // namespace

std::string build_id() {
  std::string id;
  dl_iterate_phdr(find_build_id, &id);
  if (!id.empty()) return id;
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return "unknown";
  const auto size = std::filesystem::file_size(exe, error);
  const auto mtime = std::filesystem::last_write_time(exe, error).time_since_epoch().count();
  return fmt::format("size {} mtime {}", size, mtime);
}

}  // namespace meshtrain
