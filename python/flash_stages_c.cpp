// flash_stages_c.cpp: the C ABI of flash_stages_c.h over the registry. Every entry point catches
// everything: a C++ exception must not unwind into a C or Python caller.
#include "flash_stages_c.h"

#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "registry.h"

namespace {

using flash::StatusCode;

static_assert(FLASH_STAGES_SUCCESS == static_cast<int>(StatusCode::kSuccess), "status codes drifted");
static_assert(FLASH_STAGES_NULL_POINTER == static_cast<int>(StatusCode::kNullPointer), "status codes drifted");
static_assert(FLASH_STAGES_INVALID_DIMENSION == static_cast<int>(StatusCode::kInvalidDimension), "status codes drifted");
static_assert(FLASH_STAGES_INVALID_ARGUMENT == static_cast<int>(StatusCode::kInvalidArgument), "status codes drifted");
static_assert(FLASH_STAGES_HEAD_DIM_NOT_SUPPORTED == static_cast<int>(StatusCode::kHeadDimNotSupported),
              "status codes drifted");
static_assert(FLASH_STAGES_HEADS_NOT_DIVISIBLE == static_cast<int>(StatusCode::kHeadsNotDivisible),
              "status codes drifted");
static_assert(FLASH_STAGES_MISALIGNED_POINTER == static_cast<int>(StatusCode::kMisalignedPointer),
              "status codes drifted");
static_assert(FLASH_STAGES_NOT_SUPPORTED == static_cast<int>(StatusCode::kNotSupported), "status codes drifted");
static_assert(FLASH_STAGES_WORKSPACE_TOO_SMALL == static_cast<int>(StatusCode::kWorkspaceTooSmall),
              "status codes drifted");
static_assert(FLASH_STAGES_CUDA_ERROR == static_cast<int>(StatusCode::kCudaError), "status codes drifted");
static_assert(FLASH_STAGES_DTYPE_NOT_SUPPORTED == static_cast<int>(StatusCode::kDtypeNotSupported),
              "status codes drifted");
static_assert(FLASH_STAGES_ARCH_NOT_SUPPORTED == static_cast<int>(StatusCode::kArchNotSupported),
              "status codes drifted");
static_assert(FLASH_STAGES_SHARED_MEMORY_TOO_SMALL == static_cast<int>(StatusCode::kSharedMemoryTooSmall),
              "status codes drifted");
static_assert(FLASH_STAGES_FP32 == static_cast<int>(flash::DType::kFp32) &&
                  FLASH_STAGES_FP16 == static_cast<int>(flash::DType::kFp16) &&
                  FLASH_STAGES_BF16 == static_cast<int>(flash::DType::kBf16),
              "dtype codes drifted");

// Each stage's dtype list, kept for the life of the program: flash_stages_info hands out pointers.
const char* dtype_list(const registry::Stage& s) {
  static const std::vector<std::string> lists = [] {
    std::vector<std::string> all;
    for (const registry::Stage& stage : registry::stages()) all.push_back(stage.dtype_list());
    return all;
  }();
  return lists[static_cast<size_t>(&s - &registry::stages()[0])].c_str();
}

// Copies msg into the caller's buffer, truncated and always NUL-terminated.
void write_message(const std::string& msg, char* out, size_t out_bytes) {
  if (!out || out_bytes == 0) return;
  const size_t n = msg.size() < out_bytes - 1 ? msg.size() : out_bytes - 1;
  std::memcpy(out, msg.data(), n);
  out[n] = '\0';
}

int finish(const flash::Status& s, char* message, size_t message_bytes) {
  write_message(s.ok() ? std::string() : flash::to_string(s), message, message_bytes);
  return static_cast<int>(s.code);
}

int fail(int code, const std::string& msg, char* message, size_t message_bytes) {
  write_message(msg, message, message_bytes);
  return code;
}

// "1 to 13": the stage numbers, for messages.
std::string stage_range() { return registry::stage_numbers(); }

// The stage with this course number, or null with the message written.
const registry::Stage* find_stage(int number, char* message, size_t message_bytes, int* code) {
  const registry::Stage* s = registry::find(number);
  if (!s) {
    *code = fail(FLASH_STAGES_INVALID_ARGUMENT,
                 "invalid argument: stage = " + std::to_string(number) + " is not a stage (stages: " + stage_range() +
                     ")",
                 message, message_bytes);
  }
  return s;
}

const registry::Stage* find_backward_stage(int number, char* message, size_t message_bytes, int* code) {
  const registry::Stage* s = find_stage(number, message, message_bytes, code);
  if (s && !s->backward) {
    *code = fail(FLASH_STAGES_NOT_SUPPORTED,
                 "not supported by this stage: stage " + std::to_string(number) + " (" + s->name +
                     ") has no backward",
                 message, message_bytes);
    return nullptr;
  }
  return s;
}

const registry::Stage* find_paged_stage(int number, char* message, size_t message_bytes, int* code) {
  const registry::Stage* s = find_stage(number, message, message_bytes, code);
  if (s && !s->forward_paged) {
    *code = fail(FLASH_STAGES_NOT_SUPPORTED,
                 "not supported by this stage: stage " + std::to_string(number) + " (" + s->name +
                     ") has no paged entry point",
                 message, message_bytes);
    return nullptr;
  }
  return s;
}

// The workspace functions multiply sizes: refuse what they cannot take before calling them.
flash::Status check_sizes(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim) {
  if (batch < 1) return flash::make_status(StatusCode::kInvalidDimension, "batch", batch);
  if (heads_q < 1) return flash::make_status(StatusCode::kInvalidDimension, "heads_q", heads_q);
  if (heads_kv < 1) return flash::make_status(StatusCode::kInvalidDimension, "heads_kv", heads_kv);
  if (seq_q < 1) return flash::make_status(StatusCode::kInvalidDimension, "seq_q", seq_q);
  if (seq_kv < 1) return flash::make_status(StatusCode::kInvalidDimension, "seq_kv", seq_kv);
  if (head_dim < 1) return flash::make_status(StatusCode::kInvalidDimension, "head_dim", head_dim);
  if (heads_q % heads_kv != 0) return flash::make_status(StatusCode::kHeadsNotDivisible, "heads_q", heads_q, heads_kv);
  return flash::Status{};
}

// Makes `device` current for the lifetime of the guard (no-op for a negative device) and clears a
// stale, non-sticky error left by someone else, so that the stage's own launch check reports only
// its own launch.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (device < 0) return;
    status_ = flash::cuda_status(cudaGetDevice(&previous_));
    if (!status_.ok()) return;
    if (previous_ != device) {
      status_ = flash::cuda_status(cudaSetDevice(device));
      if (!status_.ok()) return;
      switched_ = true;
    }
    cudaGetLastError();
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  const flash::Status& status() const { return status_; }

 private:
  flash::Status status_;
  int previous_ = 0;
  bool switched_ = false;
};

int internal_error(const char* what, char* message, size_t message_bytes) {
  return fail(FLASH_STAGES_INTERNAL_ERROR, std::string("internal error: ") + what, message, message_bytes);
}

}  // namespace

extern "C" {

int flash_stages_abi_version(void) { return FLASH_STAGES_C_ABI_VERSION; }

const char* flash_stages_status_name(int code) {
  if (code == FLASH_STAGES_INTERNAL_ERROR) return "internal error";
  if (code < 0 || code > FLASH_STAGES_SHARED_MEMORY_TOO_SMALL) return "unknown status";
  return flash::status_name(static_cast<StatusCode>(code));
}

int flash_stages_count(void) {
  try {
    return static_cast<int>(registry::stages().size());
  } catch (...) {
    return 0;
  }
}

int flash_stages_info(int index, int* number, const char** folder, const char** name, const char** lesson,
                      const char** dtype, int* causal, int* has_backward, int* head_dims, int head_dims_capacity,
                      int* num_head_dims) {
  try {
    const auto& all = registry::stages();
    if (index < 0 || index >= static_cast<int>(all.size())) return FLASH_STAGES_INVALID_ARGUMENT;
    const registry::Stage& s = all[static_cast<size_t>(index)];
    if (number) *number = s.number;
    if (folder) *folder = s.folder;
    if (name) *name = s.name;
    if (lesson) *lesson = s.lesson;
    if (dtype) *dtype = dtype_list(s);
    if (causal) *causal = s.causal ? 1 : 0;
    if (has_backward) *has_backward = s.backward ? 1 : 0;
    if (num_head_dims) *num_head_dims = static_cast<int>(s.head_dims.size());
    if (head_dims)
      for (int i = 0; i < head_dims_capacity && i < static_cast<int>(s.head_dims.size()); ++i)
        head_dims[i] = s.head_dims[static_cast<size_t>(i)];
    return FLASH_STAGES_SUCCESS;
  } catch (...) {
    return FLASH_STAGES_INTERNAL_ERROR;
  }
}

int flash_stages_limits(int index, int* max_seq_q, int* paged, int* backward_atomic) {
  try {
    const auto& all = registry::stages();
    if (index < 0 || index >= static_cast<int>(all.size())) return FLASH_STAGES_INVALID_ARGUMENT;
    const registry::Stage& s = all[static_cast<size_t>(index)];
    if (max_seq_q) *max_seq_q = s.max_seq_q;
    if (paged) *paged = s.forward_paged ? 1 : 0;
    if (backward_atomic) *backward_atomic = s.backward_atomic ? 1 : 0;
    return FLASH_STAGES_SUCCESS;
  } catch (...) {
    return FLASH_STAGES_INTERNAL_ERROR;
  }
}

int flash_stages_runs_here(int stage, int device, char* message, size_t message_bytes) {
  try {
    int code = 0;
    const registry::Stage* s = find_stage(stage, message, message_bytes, &code);
    if (!s) return code;
    const DeviceGuard guard(device);
    if (!guard.status().ok()) return finish(guard.status(), message, message_bytes);
    int cc = 0;
    flash::Status st = flash::compute_capability(&cc);
    if (st.ok() && (cc < s->min_compute_capability || (s->max_compute_capability && cc > s->max_compute_capability)))
      st = flash::make_status(StatusCode::kArchNotSupported, "device", cc, s->min_compute_capability);
    if (st.ok() && s->check_gpu) st = s->check_gpu();
    return finish(st, message, message_bytes);
  } catch (const std::exception& e) {
    return internal_error(e.what(), message, message_bytes);
  } catch (...) {
    return internal_error("unknown exception", message, message_bytes);
  }
}

int flash_stages_forward_workspace_size(int stage, int batch, int heads_q, int heads_kv, int seq_q, int seq_kv,
                                        int head_dim, size_t* bytes, char* message, size_t message_bytes) {
  try {
    int code = 0;
    const registry::Stage* s = find_stage(stage, message, message_bytes, &code);
    if (!s) return code;
    if (!bytes) return finish(flash::make_status(StatusCode::kNullPointer, "bytes", 0), message, message_bytes);
    const flash::Status sizes = check_sizes(batch, heads_q, heads_kv, seq_q, seq_kv, head_dim);
    if (!sizes.ok()) return finish(sizes, message, message_bytes);
    *bytes = s->forward_workspace_size(batch, heads_q, heads_kv, seq_q, seq_kv, head_dim);
    return finish(flash::Status{}, message, message_bytes);
  } catch (const std::exception& e) {
    return internal_error(e.what(), message, message_bytes);
  } catch (...) {
    return internal_error("unknown exception", message, message_bytes);
  }
}

int flash_stages_backward_workspace_size(int stage, int batch, int heads_q, int heads_kv, int seq_q, int seq_kv,
                                         int head_dim, size_t* bytes, char* message, size_t message_bytes) {
  try {
    int code = 0;
    const registry::Stage* s = find_backward_stage(stage, message, message_bytes, &code);
    if (!s) return code;
    if (!bytes) return finish(flash::make_status(StatusCode::kNullPointer, "bytes", 0), message, message_bytes);
    const flash::Status sizes = check_sizes(batch, heads_q, heads_kv, seq_q, seq_kv, head_dim);
    if (!sizes.ok()) return finish(sizes, message, message_bytes);
    *bytes = s->backward_workspace_size
                 ? s->backward_workspace_size(batch, heads_q, heads_kv, seq_q, seq_kv, head_dim)
                 : 0;
    return finish(flash::Status{}, message, message_bytes);
  } catch (const std::exception& e) {
    return internal_error(e.what(), message, message_bytes);
  } catch (...) {
    return internal_error("unknown exception", message, message_bytes);
  }
}

int flash_stages_forward(int stage, const void* q, const void* k, const void* v, void* o, float* lse, int batch,
                         int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, int causal,
                         int dtype, void* workspace, size_t workspace_bytes, int device, void* stream, char* message,
                         size_t message_bytes) {
  try {
    int code = 0;
    const registry::Stage* s = find_stage(stage, message, message_bytes, &code);
    if (!s) return code;
    const DeviceGuard guard(device);
    if (!guard.status().ok()) return finish(guard.status(), message, message_bytes);
    if (dtype < FLASH_STAGES_FP32 || dtype > FLASH_STAGES_BF16)
      return finish(flash::make_status(StatusCode::kInvalidArgument, "dtype", dtype), message, message_bytes);
    const flash::Status st = s->forward(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale,
                                        causal != 0, static_cast<flash::DType>(dtype), workspace, workspace_bytes,
                                        static_cast<cudaStream_t>(stream));
    return finish(st, message, message_bytes);
  } catch (const std::exception& e) {
    return internal_error(e.what(), message, message_bytes);
  } catch (...) {
    return internal_error("unknown exception", message, message_bytes);
  }
}

int flash_stages_forward_paged_workspace_size(int stage, int batch, int heads_q, int heads_kv, int seq_q, int head_dim,
                                              int page_size, int max_pages_per_seq, size_t* bytes, char* message,
                                              size_t message_bytes) {
  try {
    int code = 0;
    const registry::Stage* s = find_paged_stage(stage, message, message_bytes, &code);
    if (!s) return code;
    if (!bytes) return finish(flash::make_status(StatusCode::kNullPointer, "bytes", 0), message, message_bytes);
    flash::Status sizes = check_sizes(batch, heads_q, heads_kv, seq_q, 1, head_dim);
    if (sizes.ok() && page_size < 1) sizes = flash::make_status(StatusCode::kInvalidDimension, "page_size", page_size);
    if (sizes.ok() && max_pages_per_seq < 1)
      sizes = flash::make_status(StatusCode::kInvalidDimension, "max_pages_per_seq", max_pages_per_seq);
    if (!sizes.ok()) return finish(sizes, message, message_bytes);
    *bytes = s->forward_paged_workspace_size(batch, heads_q, heads_kv, seq_q, head_dim, page_size, max_pages_per_seq);
    return finish(flash::Status{}, message, message_bytes);
  } catch (const std::exception& e) {
    return internal_error(e.what(), message, message_bytes);
  } catch (...) {
    return internal_error("unknown exception", message, message_bytes);
  }
}

int flash_stages_forward_paged(int stage, const void* q, const void* k_pages, const void* v_pages,
                               const int* page_table, const int* cache_lens, void* o, float* lse, int batch,
                               int heads_q, int heads_kv, int seq_q, int head_dim, int page_size, int num_pages,
                               int max_pages_per_seq, float scale, int causal, int dtype, void* workspace,
                               size_t workspace_bytes, int device, void* stream, char* message, size_t message_bytes) {
  try {
    int code = 0;
    const registry::Stage* s = find_paged_stage(stage, message, message_bytes, &code);
    if (!s) return code;
    const DeviceGuard guard(device);
    if (!guard.status().ok()) return finish(guard.status(), message, message_bytes);
    if (dtype < FLASH_STAGES_FP32 || dtype > FLASH_STAGES_BF16)
      return finish(flash::make_status(StatusCode::kInvalidArgument, "dtype", dtype), message, message_bytes);
    const flash::Status st = s->forward_paged(q, k_pages, v_pages, page_table, cache_lens, o, lse, batch, heads_q,
                                              heads_kv, seq_q, head_dim, page_size, num_pages, max_pages_per_seq,
                                              scale, causal != 0, static_cast<flash::DType>(dtype), workspace,
                                              workspace_bytes, static_cast<cudaStream_t>(stream));
    return finish(st, message, message_bytes);
  } catch (const std::exception& e) {
    return internal_error(e.what(), message, message_bytes);
  } catch (...) {
    return internal_error("unknown exception", message, message_bytes);
  }
}

int flash_stages_backward(int stage, const void* q, const void* k, const void* v, const void* o, const float* lse,
                          const void* d_o, void* dq, void* dk, void* dv, int batch, int heads_q, int heads_kv,
                          int seq_q, int seq_kv, int head_dim, float scale, int causal, int dtype, int deterministic,
                          void* workspace, size_t workspace_bytes, int device, void* stream, char* message,
                          size_t message_bytes) {
  try {
    int code = 0;
    const registry::Stage* s = find_backward_stage(stage, message, message_bytes, &code);
    if (!s) return code;
    const DeviceGuard guard(device);
    if (!guard.status().ok()) return finish(guard.status(), message, message_bytes);
    if (dtype < FLASH_STAGES_FP32 || dtype > FLASH_STAGES_BF16)
      return finish(flash::make_status(StatusCode::kInvalidArgument, "dtype", dtype), message, message_bytes);
    const flash::Status st =
        s->backward(q, k, v, o, lse, d_o, dq, dk, dv, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale,
                    causal != 0, static_cast<flash::DType>(dtype), deterministic != 0, workspace, workspace_bytes,
                    static_cast<cudaStream_t>(stream));
    return finish(st, message, message_bytes);
  } catch (const std::exception& e) {
    return internal_error(e.what(), message, message_bytes);
  } catch (...) {
    return internal_error("unknown exception", message, message_bytes);
  }
}

}  // extern "C"
