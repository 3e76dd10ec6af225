// torch_pch.hpp — the torch headers precompiled once for every torch translation unit (see CMakeLists.txt).
// Keep it to headers that most torch TUs need; a part-specific heavy header belongs in that part.
#pragma once
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
