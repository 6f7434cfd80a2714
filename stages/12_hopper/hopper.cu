// Stage 12: Hopper. The kernel arrives in the next steps; this file checks the arguments and the GPU.
//
// Built two ways (CMakeLists.txt): for sm_90a, with FLASH_STAGE12_SM90A defined, when the configured
// CUDA architectures include Hopper; otherwise as a stub that refuses every call with
// kArchNotSupported, so that the project still builds and runs everywhere else.
#include "hopper.h"

namespace stage12 {
namespace {

// The one compute capability whose code this stage carries: sm_90a instructions (wgmma, setmaxnreg)
// run on 9.0 and nowhere else, not even on later GPUs (PTX ISA, "Target ISA notes": "Requires sm_90a").
constexpr int kHopper = 90;

// The shared check's head_dim message lists 32, which this stage does not take.
flash::Status with_own_head_dims(flash::Status s) {
  return s.code == flash::StatusCode::kHeadDimNotSupported ? flash::with_detail(s, "64, 128") : s;
}

}  // namespace

size_t forward_workspace_size(int, int, int, int, int, int) { return 0; }

flash::Status check_gpu() {
  int device = 0, major = 0, minor = 0;
  flash::Status s = flash::cuda_status(cudaGetDevice(&device));
  if (s.ok()) s = flash::cuda_status(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (s.ok()) s = flash::cuda_status(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (!s.ok()) return s;
  const int cc = 10 * major + minor;
#if defined(FLASH_STAGE12_SM90A)
  if (cc != kHopper)
    return flash::with_detail(flash::make_status(flash::StatusCode::kArchNotSupported, "device", cc, kHopper),
                              "stage 12 needs compute capability 9.0 (its sm_90a code, wgmma and setmaxnreg, runs "
                              "on Hopper GPUs only)");
  return flash::Status{};
#else
  return flash::with_detail(flash::make_status(flash::StatusCode::kArchNotSupported, "device", cc, kHopper),
                            "this build of stage 12 has no sm_90a code (configure with 90 in "
                            "CMAKE_CUDA_ARCHITECTURES to build it)");
#endif
}

flash::Status forward(const void* q, const void* k, const void* v, void* o, float* lse, int batch, int heads_q,
                      int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal, flash::DType dtype,
                      void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  flash::Status status = with_own_head_dims(
      flash::check_forward_args(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale));
  if (status.ok() && head_dim != 64 && head_dim != 128)
    status = flash::with_detail(flash::make_status(flash::StatusCode::kHeadDimNotSupported, "head_dim", head_dim),
                                "64, 128");
  if (status.ok()) status = flash::check_half_dtype(dtype);
  if (status.ok()) status = flash::check_workspace(workspace, workspace_bytes, 0);
  if (status.ok()) status = check_gpu();
  if (!status.ok()) return status;
  (void)causal;
  (void)stream;
  return flash::with_detail(flash::make_status(flash::StatusCode::kNotSupported, "stage", 12),
                            "the Hopper kernel is not written yet");
}

}  // namespace stage12
