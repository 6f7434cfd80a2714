// l2_flush.h: empties L2 between timed calls by reading a buffer twice its size. A read leaves clean
// lines behind, which the timed kernel evicts for free; a write (cudaMemset) would leave dirty ones,
// whose write-back to HBM would be charged to the kernel that evicts them.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "harness.h"

namespace bench {

// Reads bytes (a multiple of 16) of buffer on stream. The buffer must be all zeros; then nothing
// is written.
void read_through_l2(const void* buffer, size_t bytes, cudaStream_t stream);

// A zeroed device buffer twice the size of L2; calling it reads the buffer (read_through_l2) on the
// default stream. A call timed after it finds none of its inputs in L2, as a decode step does when
// every layer reads a cache of its own, and no dirty line of the flush is left for it to write back.
class L2Flush {
 public:
  L2Flush();
  void operator()() const;

 private:
  harness::DeviceBuffer<unsigned char> buffer_;
};

}  // namespace bench
