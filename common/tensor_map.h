// tensor_map.h: the host side of TMA for the Hopper stages (12 and 14): the 128-byte descriptor the
// copy engine reads (CUtensorMap), made by the driver's cuTensorMapEncodeTiled over a
// [heads_total, seq, head_dim] tensor of 16-bit elements. The device side (the copies) is in
// hopper.cuh. Include it only from a file compiled for Hopper: it needs cudaTypedefs.h.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled_v12000

#include <mutex>

#include "flash_stage.cuh"

namespace tensor_map {

// cuTensorMapEncodeTiled is a driver function. The runtime hands out its address
// (cudaGetDriverEntryPointByVersion, the CUDA 13 form of cudaGetDriverEntryPoint, which 13.0
// deprecates), so the library needs no link to libcuda. 12000: the CUDA version whose ABI of the
// function we call (PFN_cuTensorMapEncodeTiled_v12000, cudaTypedefs.h).
constexpr unsigned kEncodeAbiVersion = 12000;

// The driver's cuTensorMapEncodeTiled, looked up once per process; the status of the lookup.
inline flash::Status encoder(PFN_cuTensorMapEncodeTiled_v12000* encode) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static cudaError_t err = cudaSuccess;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, kEncodeAbiVersion, cudaEnableDefault, &found);
    if (err == cudaSuccess && (found != cudaDriverEntryPointSuccess || p == nullptr)) err = cudaErrorNotSupported;
    fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  });
  *encode = fn;
  return flash::cuda_status(err);
}

// A 3-D map over a [heads_total, seq, head_dim] tensor of 16-bit elements (the batch and head
// dimensions of q, k, v flattened into one: a box never crosses a head, and rows past the end of a
// head's sequence are outside the tensor, so the copy engine fills them with zeros rather than
// reading the next head). Dimensions innermost first, as cuTensorMapEncodeTiled takes them:
//   globalDim     {head_dim, seq, heads_total}
//   globalStrides {head_dim * 2, seq * head_dim * 2} bytes (dimension 0 is contiguous; both are
//                 multiples of 16, as the driver requires)
//   boxDim        {box_cols, box_rows, 1}: box_cols columns (at most 64: 128 bytes, the most the
//                 128-byte swizzle allows in a box row) of box_rows rows of one head
//   swizzle       CU_TENSOR_MAP_SWIZZLE_128B: the layout wgmma's 128-byte swizzle mode reads
//   oobFill       CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: zeros outside the tensor
//   l2Promotion   256 bytes: each L2 fill brings two 128-byte box rows' worth.
inline flash::Status make_3d(CUtensorMap* map, const void* base, flash::DType dtype, int head_dim, int seq,
                             long long heads_total, int box_cols, int box_rows) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  flash::Status status = encoder(&encode);
  if (!status.ok()) return status;
  constexpr cuuint64_t kBytes = 2;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(seq),
                              static_cast<cuuint64_t>(heads_total)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(head_dim) * kBytes,
                                 static_cast<cuuint64_t>(seq) * head_dim * kBytes};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult r = encode(map,
                            dtype == flash::DType::kBf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                         : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
                            3, const_cast<void*>(base), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return flash::with_detail(flash::make_status(flash::StatusCode::kInvalidArgument, "tensor map", r),
                              "cuTensorMapEncodeTiled refused it: the driver's CUresult");
  return flash::Status{};
}

}  // namespace tensor_map
