// harness.h: what the tests, the benchmark and the course runner share. Not part of any stage: a
// stage copied into another project leaves this behind.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "flash_stage.cuh"

namespace harness {

// Throws std::runtime_error naming the call and CUDA's message. The harness may throw; stages
// return flash::Status instead.
void cuda_check(cudaError_t err, const char* what);

// True when a CUDA device can run our kernels; otherwise *why says why not, in one line that names
// what was found (check_gpu's message).
bool gpu_available(std::string* why);

// What check_gpu found. Without a GPU the CUDA runtime says "CUDA driver version is insufficient for
// CUDA runtime version" whether there is no driver at all or an old one; these tell them apart.
struct GpuCheck {
  // What was found.
  enum class Result {
    kOk,            // a device to run on
    kNoDriver,      // no NVIDIA driver: the CUDA driver library could not be loaded
    kNoDevice,      // a driver, but no device visible to this process
    kDriverTooOld,  // a driver older than the CUDA runtime this program was built with
    kCudaError,     // something else; message carries CUDA's error
  };
  Result result = Result::kOk;  // what was found
  int driver_version = 0;   // the newest CUDA the driver supports, 1000 * major + 10 * minor; 0: no driver
  int runtime_version = 0;  // the CUDA runtime this program was built with, in the same form
  int device_count = 0;     // CUDA devices visible to this process
  std::string message;      // one line: what was found and, when it is not ok, what to do
  // The result as a word for JSON: "ok", "no_driver", "no_device", "driver_too_old", "cuda_error".
  const char* result_name() const;
};
// Looks for a driver and a device without throwing; leaves no sticky CUDA error behind.
GpuCheck check_gpu();
// A CUDA version number (13000) as "13.0".
std::string cuda_version_string(int version);

// One attention problem: the shapes of the API plus scale, causal and the element type.
struct Problem {
  int batch = 1;        // independent sequences
  int heads_q = 1;      // query heads; a multiple of heads_kv
  int heads_kv = 1;     // K/V heads: heads_q for multi-head, 1 for multi-query, between for GQA
  int seq_q = 1;        // query rows per head
  int seq_kv = 1;       // keys (and values) per head
  int head_dim = 64;    // the width of every head; the stages take 32, 64 or 128
  bool causal = false;  // bottom-right aligned causal mask (flash::causal_key_end)
  // The softmax scale; NaN (the default) means the usual 1 / sqrt(head_dim). Any finite value, 0
  // included, is passed as it is.
  float scale = std::numeric_limits<float>::quiet_NaN();
  flash::DType dtype = flash::DType::kFp32;  // element type of q, k, v, o (lse is always fp32)

  // The scale to pass to a stage: scale, or 1 / sqrt(head_dim) when scale is NaN.
  float softmax_scale() const;
  // Elements of q and o (and of d_out, dq): batch * heads_q * seq_q * head_dim.
  long long q_elems() const { return static_cast<long long>(batch) * heads_q * seq_q * head_dim; }
  // Elements of k and v (and of dk, dv): batch * heads_kv * seq_kv * head_dim.
  long long kv_elems() const { return static_cast<long long>(batch) * heads_kv * seq_kv * head_dim; }
  // Query rows over every batch and head: the elements of lse.
  long long rows() const { return static_cast<long long>(batch) * heads_q * seq_q; }
  // Query-key pairs the mask lets through: seq_q * seq_kv, or fewer when causal (bottom-right:
  // query i sees min(seq_kv, max(0, i + seq_kv - seq_q + 1)) keys), per batch and head.
  double visible_pairs() const;
  // The shapes, causal and dtype on one line, e.g. "batch=1 heads_q=8 ... causal=0 dtype=bf16"; scale is left out.
  std::string describe() const;
};

// FLOPs by the FlashAttention convention: 4 * B * H * d per visible query-key pair (two matmuls of
// 2 FLOPs per multiply-add). Causal with seq_q = seq_kv = N that is (N^2 + N) / 2 pairs, the "halved"
// of the convention; with seq_q != seq_kv the bottom-right mask is counted exactly (seq_q = 1 sees
// every key).
double forward_flops(const Problem& p);
// The bytes a forward must move at least: Q, K, V read once, O and lse written once, in p.dtype.
double forward_compulsory_bytes(const Problem& p);

// Random inputs. kExtreme multiplies Q and K by 10, so scaled scores have a standard deviation of
// about 100 and reach several hundred: far past expf's overflow at ~88.7.
enum class InputKind { kNormal, kExtreme };
// One problem's inputs on the host, contiguous in the API's shapes.
struct HostInputs {
  std::vector<float> q, k, v;  // q [batch, heads_q, seq_q, head_dim]; k, v [batch, heads_kv, seq_kv, head_dim]
  std::vector<float> d_out;    // the gradient of O, for backward checks
};
// Standard-normal q, k, v and d_out for p, the same for the same seed; kExtreme scales q and k. For a
// half-precision p.dtype every value is rounded to that dtype, so the fp64 reference and an fp32
// stage see exactly the numbers a half stage reads.
HostInputs make_inputs(const Problem& p, uint64_t seed, InputKind kind = InputKind::kNormal);

// Relative L2 distance allowed between two stages' outputs on the same inputs (rounded to the
// coarser dtype) when one runs in dtype a and the other in b. Each output element is rounded once
// (at most half an ulp: 2^-9 relative in bf16, 2^-12 in fp16, about a third of that in RMS) and each
// probability once before the PV product (averaging out over the keys): bf16 allows 1e-2 and fp16
// 2e-3, four to seven times that sum; two fp32 stages differ only in summation order, 1e-5.
double agreement_tolerance(flash::DType a, flash::DType b);

// x rounded to the nearest value of dtype (round to nearest even), as a float; fp32 is unchanged.
float round_to(flash::DType dtype, float x);
// Host floats as the bytes of a device tensor of dtype, and back.
std::vector<unsigned char> encode(const std::vector<float>& x, flash::DType dtype);
// The bytes of a device tensor of dtype as host floats: encode's inverse.
std::vector<float> decode(const std::vector<unsigned char>& bytes, flash::DType dtype);

// A device allocation that frees itself. Moves, never copies.
template <typename T>
class DeviceBuffer {
 public:
  // Empty: nothing allocated, get() is null.
  DeviceBuffer() = default;
  // count uninitialized elements (cudaMalloc; throws on failure). A count of 0 allocates nothing.
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count_ > 0) cuda_check(cudaMalloc(reinterpret_cast<void**>(&ptr_), count_ * sizeof(T)), "cudaMalloc");
  }
  // A device copy of host.
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  // Frees the allocation; cudaFree's error, if any, is ignored.
  ~DeviceBuffer() { cudaFree(ptr_); }
  // Takes other's allocation; other is left empty.
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr_(other.ptr_), count_(other.count_) {
    other.ptr_ = nullptr;
    other.count_ = 0;
  }
  // Swaps allocations with other, which frees this one's old allocation when it goes.
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(ptr_, other.ptr_);
    std::swap(count_, other.count_);
    return *this;
  }
  // Not copyable: each allocation has one owner.
  DeviceBuffer(const DeviceBuffer&) = delete;
  // Not copy-assignable either.
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // The device pointer; null when empty.
  T* get() const { return ptr_; }
  // Number of elements, not bytes.
  size_t size() const { return count_; }
  // size() * sizeof(T).
  size_t bytes() const { return count_ * sizeof(T); }

  // Copies host into the buffer (a synchronous cudaMemcpy); host must have size() elements, else
  // std::invalid_argument.
  void upload(const std::vector<T>& host) {
    if (host.size() != count_) throw std::invalid_argument("DeviceBuffer::upload: size mismatch");
    cuda_check(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  // A host copy of the buffer (a synchronous cudaMemcpy).
  std::vector<T> download() const {
    std::vector<T> host(count_);
    cuda_check(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return host;
  }
  // Every byte 0xFF: for floats that is a NaN, so an element a kernel forgot to write fails checks.
  void poison() { cuda_check(cudaMemset(ptr_, 0xFF, bytes()), "cudaMemset"); }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

// A device tensor of any dtype: raw bytes that know their element type.
struct DeviceTensor {
  flash::DType dtype = flash::DType::kFp32;  // the element type
  DeviceBuffer<unsigned char> bytes;         // the elements, dtype_size(dtype) bytes each
  // count elements of dtype, uninitialized.
  DeviceTensor(flash::DType t, size_t count) : dtype(t), bytes(count * flash::dtype_size(t)) {}
  // A device copy of host, converted to dtype (exactly, for values make_inputs rounded to it).
  DeviceTensor(flash::DType t, const std::vector<float>& host) : dtype(t), bytes(encode(host, t)) {}
  // The device pointer, to pass to a stage as a tensor of dtype.
  void* get() const { return bytes.get(); }
  // Number of elements, not bytes.
  size_t size() const { return bytes.size() / flash::dtype_size(dtype); }
  // Every element NaN (all bits set is a NaN in fp32, fp16 and bf16 alike).
  void poison() { bytes.poison(); }
  // A host copy, each element converted to float (exactly: every fp16/bf16 value is a float).
  std::vector<float> download() const { return decode(bytes.download(), dtype); }
};

// Inputs on the device, in one dtype.
struct DeviceInputs {
  DeviceTensor q, k, v, d_out;  // device copies of HostInputs' tensors, same shapes
  // Uploads every tensor of in, d_out included, as dtype.
  explicit DeviceInputs(const HostInputs& in, flash::DType dtype = flash::DType::kFp32)
      : q(dtype, in.q), k(dtype, in.k), v(dtype, in.v), d_out(dtype, in.d_out) {}
  // The dtype every tensor was uploaded as.
  flash::DType dtype() const { return q.dtype; }
};

// Error of a result against a reference. Size mismatches throw std::invalid_argument.
struct ErrorStats {
  double max_abs = 0.0;     // max |x - ref| over elements where both are finite
  double rel_l2 = 0.0;      // ||x - ref|| / ||ref||
  size_t nonfinite = 0;     // elements where x is NaN/inf but ref is not (or they differ)
  size_t count = 0;         // elements compared
  // The pass test: no element wrongly non-finite and rel_l2 <= rel_tol; max_abs is not checked.
  bool within(double rel_tol) const { return nonfinite == 0 && rel_l2 <= rel_tol; }
  // One line, e.g. "rel_l2=1e-07 max_abs=2e-06 nonfinite=0 of 4096".
  std::string describe() const;
};
// got against an fp64 reference (the reference namespace's results).
ErrorStats compare(const std::vector<float>& got, const std::vector<double>& ref);
// got against an fp32 one, e.g. another stage's output.
ErrorStats compare(const std::vector<float>& got, const std::vector<float>& ref);
// Elements that are NaN or infinite.
size_t count_nonfinite(const std::vector<float>& x);

// Up to max_rows row indices of [0, num_rows): all of them when they fit, else evenly spread and
// always including the first and the last.
std::vector<long long> sample_rows(long long num_rows, long long max_rows);
// The rows picked out of a [num_rows, width] tensor.
std::vector<float> gather_rows(const std::vector<float>& x, const std::vector<long long>& rows, int width);

// What time_cuda measured.
struct Timing {
  double median_ms = 0.0;  // the median run in milliseconds: the figure we report
  double min_ms = 0.0;     // the fastest run in milliseconds; it shows the spread
  int runs = 0;            // timed runs, the warm-up not counted
};
// Times `launch` with CUDA events: `warmup` untimed runs, then `runs` (at least 1) timed ones, each
// between its own pair of events on `stream`, which is where launch must enqueue its work.
// `before_each`, when given, runs before every timed run, outside its events (an L2 flush).
Timing time_cuda(const std::function<void()>& launch, int warmup, int runs, cudaStream_t stream = nullptr,
                 const std::function<void()>& before_each = {});
// Times several launches that are to be compared, in `rounds` interleaved rounds: each round times
// every launch once with time_cuda(launch, warmup, runs_per_round), in an order of its own (a seeded
// shuffle, the same in every run of the program). A launch's median_ms is the median of its rounds'
// medians, its min_ms the fastest run of all. A GPU's clock drifts over a long run (power and
// temperature); timing the launches one after the other would hand that drift to whichever came
// last, while interleaving spreads it over all of them. The clock also follows the launch just
// before: stage 12's kernel, timed right after stage 10's lighter one in every round, measured up to
// 12.5% faster than the same kernel timed after another of stage 12's (lesson 12); a fixed order, even
// rotated, keeps each launch behind the same neighbour, and the shuffle does not.
std::vector<Timing> time_cuda_interleaved(const std::vector<std::function<void()>>& launches, int warmup,
                                          int runs_per_round, int rounds, cudaStream_t stream = nullptr);

}  // namespace harness
