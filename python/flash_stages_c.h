/* flash_stages_c.h: the C ABI over every stage of the course, for callers that cannot use C++ (the
 * Python package flash_stages loads it through ctypes; any FFI works the same way).
 *
 * Plain C types only: ints, sizes, floats, raw device pointers and char buffers. Nothing here
 * throws, allocates device memory or synchronizes; each call returns a status code (the values of
 * flash::StatusCode, plus FLASH_STAGES_INTERNAL_ERROR) and, when `message` is not null, writes a
 * NUL-terminated message of at most message_bytes bytes into it ("" on success), e.g.
 * "invalid dimension: seq_q = 0 (must be >= 1 and fit the index range)".
 *
 * Stages are named by their course number (1, 2, ...), not by position; flash_stages_info walks
 * them by position. A stage's strings are static: they live as long as the library stays loaded.
 *
 * Tensors are contiguous, row-major, on the device:
 *   q, o, dq     [batch, heads_q,  seq_q,  head_dim]   (one of the stage's dtypes)
 *   k, v, dk, dv [batch, heads_kv, seq_kv, head_dim]
 *   lse          [batch, heads_q,  seq_q]              (always fp32)
 * and, for the paged entry point (flash_stages_forward_paged, stage 13):
 *   k_pages, v_pages [num_pages, page_size, heads_kv, head_dim]   (the stage's dtype)
 *   page_table       [batch, max_pages_per_seq]  int32: sequence b's pages in key order
 *   cache_lens       [batch]                     int32: sequence b's keys, its seq_q new ones included
 * `device` is the CUDA device ordinal the tensors live on; the call makes it current for the
 * launch and restores the previous one (a negative value: use whatever device is current).
 * `stream` is a cudaStream_t passed as void* (null: the legacy default stream). The launch is
 * asynchronous on that stream; an error of the kernel itself surfaces at the caller's next sync.
 */
#ifndef FLASH_STAGES_C_H
#define FLASH_STAGES_C_H

#include <stddef.h>

#if defined(_WIN32)
#define FLASH_STAGES_C_API __declspec(dllexport)
#else
#define FLASH_STAGES_C_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a signature below changes or one is added; the Python package refuses a library of
 * another. 3: flash_stages_limits and the paged entry point (stage 13). 4: flash_stages_backward takes
 * the dtype and the deterministic flag (stage 11, the half-precision backward), flash_stages_limits
 * says whether a backward uses atomics. 5: flash_stages_runs_here (the Hopper stages 12 and 14). */
#define FLASH_STAGES_C_ABI_VERSION 5

/* Element types: the values of flash::DType. lse is always fp32. */
enum { FLASH_STAGES_FP32 = 0, FLASH_STAGES_FP16 = 1, FLASH_STAGES_BF16 = 2 };

/* Status codes: the values of flash::StatusCode (common/flash_stage.cuh), checked at compile time. */
enum {
  FLASH_STAGES_SUCCESS = 0,
  FLASH_STAGES_NULL_POINTER = 1,
  FLASH_STAGES_INVALID_DIMENSION = 2,
  FLASH_STAGES_INVALID_ARGUMENT = 3, /* also: a stage number that is no stage */
  FLASH_STAGES_HEAD_DIM_NOT_SUPPORTED = 4,
  FLASH_STAGES_HEADS_NOT_DIVISIBLE = 5,
  FLASH_STAGES_MISALIGNED_POINTER = 6,
  FLASH_STAGES_NOT_SUPPORTED = 7, /* also: backward on a stage that has none */
  FLASH_STAGES_WORKSPACE_TOO_SMALL = 8,
  FLASH_STAGES_CUDA_ERROR = 9,
  FLASH_STAGES_DTYPE_NOT_SUPPORTED = 10,
  FLASH_STAGES_ARCH_NOT_SUPPORTED = 11, /* the GPU is older than the stage needs */
  FLASH_STAGES_SHARED_MEMORY_TOO_SMALL = 12, /* the GPU allows a block less shared memory than the stage needs */
  FLASH_STAGES_INTERNAL_ERROR = -1 /* a C++ exception caught at the boundary (a bug) */
};

FLASH_STAGES_C_API int flash_stages_abi_version(void);

/* The short name of a status code ("success", "null pointer", ...); never null. */
FLASH_STAGES_C_API const char* flash_stages_status_name(int code);

/* How many stages the library was built with. */
FLASH_STAGES_C_API int flash_stages_count(void);

/* The stage at position `index` (0 <= index < flash_stages_count(), course order). Any output
 * pointer may be null. head_dims receives up to head_dims_capacity entries; *num_head_dims the
 * full count. dtype lists the stage's dtypes in the registry's spelling, comma-separated, the
 * default first ("fp32", "bf16,fp16"). Returns FLASH_STAGES_INVALID_ARGUMENT for
 * an index out of range. */
FLASH_STAGES_C_API int flash_stages_info(int index, int* number, const char** folder, const char** name,
                                         const char** lesson, const char** dtype, int* causal, int* has_backward,
                                         int* head_dims, int head_dims_capacity, int* num_head_dims);

/* What the stage at position `index` takes beyond flash_stages_info: *max_seq_q the most query rows
 * per head (0: any; 16 for the decoding stage), *paged 1 when it has flash_stages_forward_paged,
 * *backward_atomic 1 when its backward's default mode sums with atomics (deterministic = 0 may then
 * differ in the last bits from run to run; stage 11). Any pointer may be null. Returns
 * FLASH_STAGES_INVALID_ARGUMENT for an index out of range. */
FLASH_STAGES_C_API int flash_stages_limits(int index, int* max_seq_q, int* paged, int* backward_atomic);

/* Whether stage `stage` runs on CUDA device `device` with this build: FLASH_STAGES_SUCCESS, or the
 * status that its calls would be refused with (FLASH_STAGES_ARCH_NOT_SUPPORTED for a GPU outside its
 * compute capabilities, or for a build without the stage's architecture-specific code), with the
 * message. No launch. */
FLASH_STAGES_C_API int flash_stages_runs_here(int stage, int device, char* message, size_t message_bytes);

/* The device workspace, in bytes, that one forward (backward) call of `stage` needs for this
 * problem; 0 for stages that need none. Sizes must be >= 1 and heads_q a multiple of heads_kv. */
FLASH_STAGES_C_API int flash_stages_forward_workspace_size(int stage, int batch, int heads_q, int heads_kv, int seq_q,
                                                           int seq_kv, int head_dim, size_t* bytes, char* message,
                                                           size_t message_bytes);
FLASH_STAGES_C_API int flash_stages_backward_workspace_size(int stage, int batch, int heads_q, int heads_kv,
                                                            int seq_q, int seq_kv, int head_dim, size_t* bytes,
                                                            char* message, size_t message_bytes);

/* O and lse (lse may be null) from Q, K, V, all four of element type dtype (FLASH_STAGES_FP32, ...).
 * causal: 0 or 1, bottom-right aligned. */
FLASH_STAGES_C_API int flash_stages_forward(int stage, const void* q, const void* k, const void* v, void* o,
                                            float* lse, int batch, int heads_q, int heads_kv, int seq_q, int seq_kv,
                                            int head_dim, float scale, int causal, int dtype, void* workspace,
                                            size_t workspace_bytes, int device, void* stream, char* message,
                                            size_t message_bytes);

/* The device workspace, in bytes, of one flash_stages_forward_paged call of `stage` for these sizes
 * (a cache of max_pages_per_seq * page_size keys per sequence); FLASH_STAGES_NOT_SUPPORTED for a
 * stage without a paged entry point. */
FLASH_STAGES_C_API int flash_stages_forward_paged_workspace_size(int stage, int batch, int heads_q, int heads_kv,
                                                                 int seq_q, int head_dim, int page_size,
                                                                 int max_pages_per_seq, size_t* bytes, char* message,
                                                                 size_t message_bytes);

/* O and lse (lse may be null) from Q and a paged K/V cache (layouts above); page_size a power of two
 * from 16 to 65536. The contents of page_table and cache_lens are not read on the host: a length is
 * clamped to the table's max_pages_per_seq * page_size keys and a page number outside [0, num_pages)
 * is not read. FLASH_STAGES_NOT_SUPPORTED for a stage without a paged entry point. */
FLASH_STAGES_C_API int flash_stages_forward_paged(int stage, const void* q, const void* k_pages, const void* v_pages,
                                                  const int* page_table, const int* cache_lens, void* o, float* lse,
                                                  int batch, int heads_q, int heads_kv, int seq_q, int head_dim,
                                                  int page_size, int num_pages, int max_pages_per_seq, float scale,
                                                  int causal, int dtype, void* workspace, size_t workspace_bytes,
                                                  int device, void* stream, char* message, size_t message_bytes);

/* dQ, dK, dV from dO, given the forward's O and lse; q, k, v, o, d_o, dq, dk, dv all of element type
 * dtype. deterministic: 1 asks for the same bits from the same inputs (stage 11 then computes dQ
 * without atomics, in a second pass); 0 lets a stage sum with atomics. A stage without atomics
 * (07) gives the same bits either way. */
FLASH_STAGES_C_API int flash_stages_backward(int stage, const void* q, const void* k, const void* v, const void* o,
                                             const float* lse, const void* d_o, void* dq, void* dk, void* dv,
                                             int batch, int heads_q, int heads_kv, int seq_q, int seq_kv,
                                             int head_dim, float scale, int causal, int dtype, int deterministic,
                                             void* workspace, size_t workspace_bytes, int device, void* stream,
                                             char* message, size_t message_bytes);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLASH_STAGES_C_H */
