// l2_flush.h: empties L2 between timed calls by reading a buffer twice its size. A read leaves clean
// lines behind, which the timed kernel evicts for free; a write (cudaMemset) would leave dirty ones,
// whose write-back to HBM would be charged to the kernel that evicts them.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace bench {

// Reads bytes (a multiple of 16) of buffer on stream. The buffer must be all zeros; then nothing
// is written.
void read_through_l2(const void* buffer, size_t bytes, cudaStream_t stream);

}  // namespace bench
