// flash_stage.cuh: the one header a stage folder needs besides itself.
//
// It holds the contract every stage shares (status codes and their messages, the argument checks
// that run before any launch, the shared memory a block may have, the causal convention) and the
// online-softmax merge that stage 03 introduces and every fused stage after it reuses. Header-only:
// copy it next to a stage folder and the stage builds with nothing but the CUDA runtime.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

namespace flash {

// ---------------------------------------------------------------------------------------------
// Status
// ---------------------------------------------------------------------------------------------

// What a stage call reports; kSuccess (0) is the only code that is not a failure.
enum class StatusCode : int {
  kSuccess = 0,           // nothing was wrong
  kNullPointer,           // a required pointer is null
  kInvalidDimension,      // a size is < 1 or too large to index
  kInvalidArgument,       // a value that is not a size is unusable (a non-finite scale)
  kHeadDimNotSupported,   // head_dim is not one this stage was compiled for
  kHeadsNotDivisible,     // heads_q is not a multiple of heads_kv
  kMisalignedPointer,     // a tensor does not start on a kTensorAlignment boundary
  kNotSupported,          // a feature this stage does not have (causal before stage 06, ...)
  kWorkspaceTooSmall,     // workspace_bytes < the stage's forward_workspace_size
  kCudaError,             // CUDA itself failed; cuda_error says how
  kDtypeNotSupported,     // the tensors' element type is not one this stage was compiled for
  kArchNotSupported,      // the GPU (or the build) lacks an instruction the stage needs (value: its compute capability)
  kSharedMemoryTooSmall,  // the smallest tiles need more shared memory per block than the GPU allows
};

// The element type of q, k, v and o (and of the gradients). lse is always fp32, and so is every
// accumulator: half-precision stages multiply in fp16/bf16 on the tensor cores and add in fp32.
enum class DType : int {
  kFp32 = 0,  // float: stages 01-07, on the CUDA cores
  kFp16 = 1,  // __half: 10 mantissa bits, exponent range to 65504
  kBf16 = 2,  // __nv_bfloat16: 7 mantissa bits, fp32's exponent range
};

// "fp32", "fp16" or "bf16": the spelling of the registry, the runner's --dtype and the docs.
inline const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kFp32: return "fp32";
    case DType::kFp16: return "fp16";
    case DType::kBf16: return "bf16";
  }
  return "unknown dtype";
}

// Bytes per element of a tensor in this dtype.
inline size_t dtype_size(DType dtype) { return dtype == DType::kFp32 ? 4 : 2; }

// A status names what was wrong, not only that something was: the argument, its value and, where
// there is one, the value it needed. Plain data, so it crosses a C ABI unchanged.
struct Status {
  StatusCode code = StatusCode::kSuccess;  // what was wrong, if anything
  const char* argument = nullptr;          // the offending argument's name (a string literal)
  long long value = 0;                     // the value it had
  long long required = 0;                  // workspace, shared memory: the bytes needed; kHeadsNotDivisible: heads_kv
  cudaError_t cuda_error = cudaSuccess;    // CUDA's own error, set with kCudaError
  // What the value had to be, in words (a string literal), where the code's own wording would be
  // wrong for this stage: "64, 128" for the head_dims of a stage without 32, "1 to 16" for the
  // query rows of the decoding stage. Null: the code's default wording.
  const char* detail = nullptr;

  // True for kSuccess: every check passed and, for a launcher, the work was queued.
  bool ok() const { return code == StatusCode::kSuccess; }
};

// A failed status. argument is stored, not copied: pass a string literal.
inline Status make_status(StatusCode code, const char* argument, long long value, long long required = 0) {
  Status s;
  s.code = code;
  s.argument = argument;
  s.value = value;
  s.required = required;
  return s;
}

// s with its detail set (see Status::detail); detail is stored, not copied: pass a string literal.
inline Status with_detail(Status s, const char* detail) {
  s.detail = detail;
  return s;
}

// kSuccess for cudaSuccess, else kCudaError carrying err.
inline Status cuda_status(cudaError_t err) {
  Status s;
  if (err != cudaSuccess) {
    s.code = StatusCode::kCudaError;
    s.cuda_error = err;
  }
  return s;
}

// Every launch is followed by this: a launch error (bad configuration, no device) is only visible
// through cudaGetLastError.
inline Status last_launch_status() { return cuda_status(cudaGetLastError()); }

// The code in words, e.g. "misaligned pointer" (a string literal); to_string adds the details.
inline const char* status_name(StatusCode code) {
  switch (code) {
    case StatusCode::kSuccess: return "success";
    case StatusCode::kNullPointer: return "null pointer";
    case StatusCode::kInvalidDimension: return "invalid dimension";
    case StatusCode::kInvalidArgument: return "invalid argument";
    case StatusCode::kHeadDimNotSupported: return "head_dim not supported";
    case StatusCode::kHeadsNotDivisible: return "heads_q not a multiple of heads_kv";
    case StatusCode::kMisalignedPointer: return "misaligned pointer";
    case StatusCode::kNotSupported: return "not supported by this stage";
    case StatusCode::kWorkspaceTooSmall: return "workspace too small";
    case StatusCode::kCudaError: return "CUDA error";
    case StatusCode::kDtypeNotSupported: return "dtype not supported";
    case StatusCode::kArchNotSupported: return "GPU architecture not supported";
    case StatusCode::kSharedMemoryTooSmall: return "shared memory too small";
  }
  return "unknown status";
}

// Where a kSharedMemoryTooSmall status came from, in words: the current GPU by name and compute
// capability, and, when `limit` bytes is less than the GPU's own limit per block, that
// set_shared_memory_limit lowered it. "the current GPU" when CUDA cannot say.
inline std::string describe_shared_memory_limit(long long limit) {
  int device = 0, major = 0, minor = 0, optin = 0;
  cudaDeviceProp prop;
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    return "the current GPU";
  std::string gpu = std::string(prop.name) + " (compute capability " + std::to_string(major) + "." +
                    std::to_string(minor) + ")";
  if (optin > limit)
    gpu += ", whose own " + std::to_string(optin) + " were lowered by flash::set_shared_memory_limit";
  return gpu;
}

// The current GPU's name for a message, e.g. "NVIDIA H100 80GB HBM3"; empty when CUDA cannot say.
inline std::string current_gpu_name() {
  int device = 0;
  cudaDeviceProp prop;
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) return "";
  return prop.name;
}

// The message a user sees, e.g. "invalid dimension: seq_q = 0 (must be >= 1)".
inline std::string to_string(const Status& s) {
  std::string msg = status_name(s.code);
  const std::string arg = s.argument ? s.argument : "?";
  const std::string val = std::to_string(s.value);
  const std::string detail = s.detail ? s.detail : "";
  switch (s.code) {
    case StatusCode::kSuccess: break;
    case StatusCode::kNullPointer: msg += ": " + arg + " is null"; break;
    case StatusCode::kInvalidDimension:
      msg += ": " + arg + " = " + val + " (" + (s.detail ? detail : "must be >= 1 and fit the index range") + ")";
      break;
    case StatusCode::kInvalidArgument:
      msg += s.detail ? ": " + arg + " = " + val + " (" + detail + ")" : ": " + arg + " must be finite"; break;
    case StatusCode::kHeadDimNotSupported:
      msg += ": " + arg + " = " + val + " (supported: " + (s.detail ? detail : "32, 64, 128") + ")"; break;
    case StatusCode::kHeadsNotDivisible:
      msg += ": heads_q = " + val + ", heads_kv = " + std::to_string(s.required); break;
    case StatusCode::kMisalignedPointer: msg += ": " + arg + " is not 16-byte aligned"; break;
    case StatusCode::kNotSupported: msg += ": " + arg + " = " + val + (s.detail ? " (" + detail + ")" : ""); break;
    case StatusCode::kWorkspaceTooSmall:
      msg += ": " + arg + " = " + val + ", needs " + std::to_string(s.required); break;
    case StatusCode::kCudaError: msg += ": " + std::string(cudaGetErrorString(s.cuda_error)); break;
    case StatusCode::kDtypeNotSupported:
      msg += ": " + arg + " = " + dtype_name(static_cast<DType>(s.value)); break;
    case StatusCode::kArchNotSupported: {
      // The GPU by name where CUDA can say, then what the stage needs: "or newer" by default, the
      // detail where the stage's requirement is not a minimum (stage 12: Hopper only, sm_90a code).
      const std::string name = current_gpu_name();
      msg += ": the GPU" + (name.empty() ? std::string() : " (" + name + ")") + " has compute capability " +
             std::to_string(s.value / 10) + "." + std::to_string(s.value % 10) + ", " +
             (s.detail ? detail
                       : "this stage needs " + std::to_string(s.required / 10) + "." +
                             std::to_string(s.required % 10) + " or newer");
      break;
    }
    case StatusCode::kSharedMemoryTooSmall:
      msg += ": this stage's smallest tiles need " + std::to_string(s.required) + " bytes per block, " + val +
             " are allowed on " + describe_shared_memory_limit(s.value); break;
  }
  return msg;
}

// ---------------------------------------------------------------------------------------------
// Argument checks, shared by every stage and run before any launch
// ---------------------------------------------------------------------------------------------

// Tensors must start on 16 bytes so that later stages can move float4s; with head_dim a multiple
// of 4 every row then starts aligned too.
constexpr std::uintptr_t kTensorAlignment = 16;

// The kernels index with 64-bit offsets but launch rows on grid x and keep per-tensor counts in int;
// refusing sizes past this keeps every int product in range.
constexpr long long kMaxDim = (1LL << 31) - 1;

// The head_dim values the stages are compiled for: 32, 64 and 128.
inline bool supported_head_dim(int head_dim) { return head_dim == 32 || head_dim == 64 || head_dim == 128; }

// True when p starts on a kTensorAlignment boundary; a null pointer counts as aligned.
inline bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kTensorAlignment == 0; }

// Checks what every stage requires of a forward call. Stage-specific checks (causal, workspace)
// follow in the stage's own launcher.
// The pointers are untyped so that one check serves every dtype.
inline Status check_forward_args(const void* q, const void* k, const void* v, const void* o, const float* lse,
                                 int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim,
                                 float scale) {
  if (!q) return make_status(StatusCode::kNullPointer, "q", 0);
  if (!k) return make_status(StatusCode::kNullPointer, "k", 0);
  if (!v) return make_status(StatusCode::kNullPointer, "v", 0);
  if (!o) return make_status(StatusCode::kNullPointer, "o", 0);
  if (batch < 1) return make_status(StatusCode::kInvalidDimension, "batch", batch);
  if (heads_q < 1) return make_status(StatusCode::kInvalidDimension, "heads_q", heads_q);
  if (heads_kv < 1) return make_status(StatusCode::kInvalidDimension, "heads_kv", heads_kv);
  if (seq_q < 1) return make_status(StatusCode::kInvalidDimension, "seq_q", seq_q);
  if (seq_kv < 1) return make_status(StatusCode::kInvalidDimension, "seq_kv", seq_kv);
  if (head_dim < 1) return make_status(StatusCode::kInvalidDimension, "head_dim", head_dim);
  if (!supported_head_dim(head_dim)) return make_status(StatusCode::kHeadDimNotSupported, "head_dim", head_dim);
  if (heads_q % heads_kv != 0) return make_status(StatusCode::kHeadsNotDivisible, "heads_q", heads_q, heads_kv);
  const long long rows_q = static_cast<long long>(batch) * heads_q * seq_q;
  if (rows_q > kMaxDim) return make_status(StatusCode::kInvalidDimension, "batch*heads_q*seq_q", rows_q);
  const long long rows_kv = static_cast<long long>(batch) * heads_kv * seq_kv;
  if (rows_kv > kMaxDim) return make_status(StatusCode::kInvalidDimension, "batch*heads_kv*seq_kv", rows_kv);
  if (!std::isfinite(scale)) return make_status(StatusCode::kInvalidArgument, "scale", 0);
  if (!aligned(q)) return make_status(StatusCode::kMisalignedPointer, "q", 0);
  if (!aligned(k)) return make_status(StatusCode::kMisalignedPointer, "k", 0);
  if (!aligned(v)) return make_status(StatusCode::kMisalignedPointer, "v", 0);
  if (!aligned(o)) return make_status(StatusCode::kMisalignedPointer, "o", 0);
  if (lse && !aligned(lse)) return make_status(StatusCode::kMisalignedPointer, "lse", 0);
  return Status{};
}

// The tensor-core stages (08 on) take fp16 or bf16; fp32 stays with stages 01-07.
inline Status check_half_dtype(DType dtype) {
  if (dtype != DType::kFp16 && dtype != DType::kBf16)
    return make_status(StatusCode::kDtypeNotSupported, "dtype", static_cast<long long>(dtype));
  return Status{};
}

// The current device's compute capability as 10 * major + minor (90 for an H100).
inline Status compute_capability(int* cc) {
  int device = 0, major = 0, minor = 0;
  Status s = cuda_status(cudaGetDevice(&device));
  if (s.ok()) s = cuda_status(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (s.ok()) s = cuda_status(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  if (s.ok()) *cc = 10 * major + minor;
  return s;
}

// Refuses a GPU older than compute capability `needed` (80 for 8.0): mma.sync with bf16, ldmatrix and
// cp.async arrived with Ampere, and a kernel built without them would do nothing.
inline Status check_compute_capability(int needed) {
  int cc = 0;
  const Status s = compute_capability(&cc);
  if (!s.ok()) return s;
  if (cc < needed) return make_status(StatusCode::kArchNotSupported, "device", cc, needed);
  return Status{};
}

// ---------------------------------------------------------------------------------------------
// Shared memory per block: what the GPU allows, and the tiles that fit
// ---------------------------------------------------------------------------------------------

// The dynamic shared memory any block may use. Past it, the launcher must opt in per kernel with
// cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), up to the
// device's opt-in limit (shared_memory_limit).
constexpr size_t kDefaultSharedMemory = 48 * 1024;

// Where set_shared_memory_limit keeps its value (0: no override). An inline function's static: one
// object for the whole program, however many stages include this header. Use the two functions
// below rather than this.
inline std::atomic<size_t>& shared_memory_override() {
  static std::atomic<size_t> bytes{0};
  return bytes;
}

// Makes every stage choose its tiles as if the GPU allowed at most `bytes` of shared memory per
// block; 0 removes the override. A limit above the GPU's own changes nothing. For the tests and the
// runner's --smem-limit: on an H100 they run the tiles a T4 (64 KiB) or an RTX 30/40 card (99 KiB)
// would. Process-wide and thread-safe; launches already queued keep their tiles.
inline void set_shared_memory_limit(size_t bytes) { shared_memory_override().store(bytes); }

// The override set by set_shared_memory_limit, in bytes; 0 when there is none.
inline size_t shared_memory_limit_override() { return shared_memory_override().load(); }

// The shared memory one block may use on the current device, in bytes: the device's opt-in limit
// (cudaDevAttrMaxSharedMemoryPerBlockOptin; the CUDA C++ Programming Guide's table of compute
// capabilities gives 64 KiB on a T4, 99 KiB on RTX 30/40 cards, 163 KiB on an A100, 227 KiB on an
// H100), or the override of set_shared_memory_limit where that is lower.
// The stages that tile (04 on) take the largest of their tile configurations that fits it.
inline Status shared_memory_limit(size_t* bytes) {
  int device = 0, optin = 0;
  Status s = cuda_status(cudaGetDevice(&device));
  if (s.ok()) s = cuda_status(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (!s.ok()) return s;
  const size_t override_bytes = shared_memory_limit_override();
  *bytes = override_bytes != 0 && override_bytes < static_cast<size_t>(optin) ? override_bytes
                                                                              : static_cast<size_t>(optin);
  return Status{};
}

// A tile configuration, as a stage's launcher chose it for a head_dim and a shared-memory limit.
struct TileShape {
  int block_rows = 0;       // Br: query rows per tile
  int block_cols = 0;       // Bc: keys per K/V tile
  size_t shared_bytes = 0;  // the dynamic shared memory one block takes
};

// kSharedMemoryTooSmall: `limit` bytes per block are allowed, the stage's smallest tiles need `needed`.
inline Status shared_memory_status(size_t limit, size_t needed) {
  return make_status(StatusCode::kSharedMemoryTooSmall, "shared memory per block", static_cast<long long>(limit),
                     static_cast<long long>(needed));
}

// For a stage with one tile configuration (08 on): refuses, before any launch, a block of `needed`
// bytes that shared_memory_limit does not allow.
inline Status check_shared_memory(size_t needed) {
  size_t limit = 0;
  const Status s = shared_memory_limit(&limit);
  if (!s.ok()) return s;
  return needed > limit ? shared_memory_status(limit, needed) : Status{};
}

// Lets `kernel` use `bytes` of dynamic shared memory: the opt-in that blocks past
// kDefaultSharedMemory need (nothing to do below it).
template <typename Kernel>
Status allow_shared_memory(Kernel* kernel, size_t bytes) {
  if (bytes <= kDefaultSharedMemory) return Status{};
  return cuda_status(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

// Checks workspace against the bytes the stage needs: too small first, then null or misaligned.
// When needed is 0, any workspace passes, null included.
inline Status check_workspace(const void* workspace, size_t workspace_bytes, size_t needed) {
  if (workspace_bytes < needed)
    return make_status(StatusCode::kWorkspaceTooSmall, "workspace_bytes", static_cast<long long>(workspace_bytes),
                       static_cast<long long>(needed));
  if (needed > 0 && !workspace) return make_status(StatusCode::kNullPointer, "workspace", 0);
  if (needed > 0 && !aligned(workspace)) return make_status(StatusCode::kMisalignedPointer, "workspace", 0);
  return Status{};
}

// ---------------------------------------------------------------------------------------------
// Conventions every kernel follows
// ---------------------------------------------------------------------------------------------

// Causal, bottom-right aligned (FlashAttention 2.1+): the last query row sees every key, so query i
// sees key j iff j <= i + (seq_kv - seq_q). Returns one past the last visible key, possibly <= 0.
__host__ __device__ inline int causal_key_end(int query, int seq_q, int seq_kv) {
  return query + (seq_kv - seq_q) + 1;
}

// The K/V head that query head h reads: heads_q / heads_kv query heads share one K/V head
// (heads_kv == heads_q is multi-head attention, 1 is multi-query, anything between is grouped).
__host__ __device__ inline int kv_head_of(int head_q, int heads_q, int heads_kv) {
  return head_q / (heads_q / heads_kv);
}

// ---------------------------------------------------------------------------------------------
// Online softmax (stage 03 onwards)
// ---------------------------------------------------------------------------------------------

// The running statistics of one softmax row over the keys seen so far: row_max = max_j s_j and
// row_sum = sum_j exp(s_j - row_max). An empty row is {-inf, 0}.
struct SoftmaxStats {
  float row_max;  // max_j s_j; -inf while no key was seen
  float row_sum;  // sum_j exp(s_j - row_max); 0 while no key was seen
};

// The statistics of no keys, {-inf, 0}: merging them with any other set changes nothing.
__host__ __device__ inline SoftmaxStats empty_softmax_stats() { return {-INFINITY, 0.0f}; }

// Merges the statistics of two disjoint sets of keys. Each side's accumulator (sum of
// exp(s_j - its row_max) * v_j) must be multiplied by the returned factor to share the new max:
// that rescale is the whole trick of online softmax. One score s with value v is the set {s, 1}.
// Merging is associative and commutative up to rounding, so any split of the keys gives the softmax.
__host__ __device__ inline SoftmaxStats merge_softmax_stats(SoftmaxStats a, SoftmaxStats b, float* rescale_a,
                                                            float* rescale_b) {
  const float row_max = fmaxf(a.row_max, b.row_max);
  if (row_max == -INFINITY) {  // both empty (every key masked): exp(-inf - -inf) would be NaN
    *rescale_a = 0.0f;
    *rescale_b = 0.0f;
    return empty_softmax_stats();
  }
  *rescale_a = expf(a.row_max - row_max);
  *rescale_b = expf(b.row_max - row_max);
  return {row_max, a.row_sum * *rescale_a + b.row_sum * *rescale_b};
}

// The log-sum-exp of the row: lse = row_max + log(row_sum); -inf for a row that saw no key.
__host__ __device__ inline float softmax_lse(SoftmaxStats s) {
  return s.row_sum > 0.0f ? s.row_max + logf(s.row_sum) : -INFINITY;
}

// 1 / row_sum, the factor that turns the accumulator into the output; 0 for an empty row, whose
// output is zeros by the API's convention.
__host__ __device__ inline float softmax_normalizer(SoftmaxStats s) {
  return s.row_sum > 0.0f ? 1.0f / s.row_sum : 0.0f;
}

}  // namespace flash
