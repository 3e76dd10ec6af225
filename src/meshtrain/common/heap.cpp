// heap.cpp — release_freed_heap_memory on glibc (a no-op elsewhere).
#include "meshtrain/common/heap.hpp"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace meshtrain {

void release_freed_heap_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

}  // namespace meshtrain
