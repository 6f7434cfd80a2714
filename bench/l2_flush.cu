// l2_flush.cu: see l2_flush.h.
#include "l2_flush.h"

namespace bench {
namespace {

// Used if the device reports no L2 size: more than the largest L2 of the GPUs the course targets
// (the H100's 50 MiB).
constexpr size_t kFallbackL2Bytes = size_t{64} << 20;

// A grid-stride read needs only enough threads in flight to keep HBM busy, not one per vector.
constexpr int kBlocks = 1024;
constexpr int kThreads = 256;

// XORs every 16-byte vector of the buffer into a register and stores the result only if every bit is
// set: a value the zeroed flush buffer cannot give, but one the compiler cannot rule out, so it keeps
// every load.
__global__ void read_kernel(const uint4* data, size_t count, unsigned* sink) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint4 x = data[i];
    acc.x ^= x.x;
    acc.y ^= x.y;
    acc.z ^= x.z;
    acc.w ^= x.w;
  }
  if ((acc.x & acc.y & acc.z & acc.w) == 0xFFFFFFFFu) *sink = acc.x;
}

}  // namespace

void read_through_l2(const void* buffer, size_t bytes, cudaStream_t stream) {
  // The sink is the buffer's own first word, never written for a zeroed buffer (see read_kernel).
  read_kernel<<<kBlocks, kThreads, 0, stream>>>(static_cast<const uint4*>(buffer), bytes / sizeof(uint4),
                                        const_cast<unsigned*>(static_cast<const unsigned*>(buffer)));
}

L2Flush::L2Flush() {
  int device = 0, l2 = 0;
  harness::cuda_check(cudaGetDevice(&device), "cudaGetDevice");
  harness::cuda_check(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device), "cudaDeviceGetAttribute");
  buffer_ = harness::DeviceBuffer<unsigned char>(2 * (l2 > 0 ? static_cast<size_t>(l2) : kFallbackL2Bytes));
  harness::cuda_check(cudaMemset(buffer_.get(), 0, buffer_.bytes()), "cudaMemset");
}

void L2Flush::operator()() const {
  read_through_l2(buffer_.get(), buffer_.bytes(), nullptr);
  harness::cuda_check(cudaGetLastError(), "read_through_l2");
}

}  // namespace bench
