// checksum.hpp — CRC-32C (Castagnoli), the checksum of token shards and tokenizer fingerprints.
//
// Uses the SSE4.2 crc32 instruction where the CPU has it (several GB/s per core), a table otherwise. Chained:
// crc32c(b, nb, crc32c(a, na)) == crc32c(a+b). The standard check value: crc32c("123456789") == 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshtrain {

uint32_t crc32c(const void* data, size_t size, uint32_t previous = 0);

}  // namespace meshtrain
