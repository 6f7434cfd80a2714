// Stage 13: decoding. The kernels are in decoding_kernel.cuh; this file checks the arguments, plans
// the splits for the GPU it runs on, and launches the split kernel and, when there is more than one
// split, the merge kernel.
#include "decoding.h"

#include <atomic>
#include <cmath>
#include <utility>

#include "decoding_kernel.cuh"

namespace stage13 {
namespace {

constexpr int kMinComputeCapability = 80;  // mma.sync with bf16, ldmatrix, cp.async (sm_80)
// The paged cache's elements must have 64-bit offsets to spare.
constexpr long long kMaxCacheElements = 1LL << 62;

long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

bool power_of_two(int x) { return x > 0 && (x & (x - 1)) == 0; }

int log2_of(int power) {
  int shift = 0;
  while ((1 << shift) < power) ++shift;
  return shift;
}

// What only this stage refuses, after the checks every stage shares: head_dim 32 (the shared check
// accepts it), more query rows than decoding has.
flash::Status check_decoding_shape(int seq_q, int head_dim) {
  if (head_dim != 64 && head_dim != 128)
    return flash::with_detail(flash::make_status(flash::StatusCode::kHeadDimNotSupported, "head_dim", head_dim),
                              "64, 128");
  if (seq_q > kMaxSeqQ)
    return flash::with_detail(flash::make_status(flash::StatusCode::kNotSupported, "seq_q", seq_q, kMaxSeqQ),
                              "decoding takes 1 to 16 query rows per sequence; more is prefill, stage 10");
  return flash::Status{};
}

// The shared check's head_dim message lists 32, which this stage does not take.
flash::Status with_own_head_dims(flash::Status s) {
  return s.code == flash::StatusCode::kHeadDimNotSupported ? flash::with_detail(s, "64, 128") : s;
}

// What a launch needs to know about the GPU, asked once per device: the SM count, and whether it
// has programmatic dependent launch.
struct GpuFacts {
  int num_sms = 0;
  bool dependent_launch = false;  // programmatic dependent launch: compute capability 9.0 on
};

template <typename Kernel>
flash::Status gpu_facts(Kernel kernel, int shared_bytes, GpuFacts* facts) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known_sms[kMaxDevices];  // 0 until asked
  static std::atomic<bool> known_dependent_launch[kMaxDevices];
  int device = 0;
  flash::Status s = flash::cuda_status(cudaGetDevice(&device));
  if (!s.ok()) return s;
  const bool cacheable = device >= 0 && device < kMaxDevices;
  if (cacheable && known_sms[device].load() > 0) {
    facts->num_sms = known_sms[device].load();
    facts->dependent_launch = known_dependent_launch[device].load();
    return s;
  }
  // Above 48 KiB of dynamic shared memory a kernel must opt in, once per device.
  s = flash::allow_shared_memory(kernel, shared_bytes);
  if (s.ok()) s = flash::cuda_status(cudaDeviceGetAttribute(&facts->num_sms, cudaDevAttrMultiProcessorCount, device));
  int major = 0;
  if (s.ok()) s = flash::cuda_status(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (!s.ok()) return s;
  facts->dependent_launch = major >= 9;
  if (cacheable) {
    known_dependent_launch[device].store(facts->dependent_launch);
    known_sms[device].store(facts->num_sms);  // last: a reader takes sms > 0 as "all stored"
  }
  return s;
}

// The split kernel for one dtype, head_dim and cache, then the merge when there are splits.
// plan_kv is the key count the splits are planned for: seq_kv, or a paged cache's capacity.
// num_splits: 0 to let choose_splits decide, else the count to use (checked by the caller).
template <typename Element, int kHeadDim, class Cache>
flash::Status launch(const void* q, const Cache& cache, void* o, float* lse, int batch, int heads_q, int heads_kv,
                     int seq_q, int plan_kv, float scale, bool causal, void* workspace, cudaStream_t stream,
                     int num_splits = 0) {
  const auto kernel = split_kernel<Element, kHeadDim, Cache>;
  constexpr int kShared = kernel_detail::shared_bytes<Element, kHeadDim>();
  // One pipeline depth per head_dim: a GPU (or flash::set_shared_memory_limit) that allows a block
  // less than it needs is refused by name, not left to fail at the launch.
  flash::Status status = flash::check_shared_memory(kShared);
  if (!status.ok()) return status;
  GpuFacts facts;
  status = gpu_facts(kernel, kShared, &facts);
  if (!status.ok()) return status;

  SplitParams p;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.seq_q = seq_q;
  p.group_rows = heads_q / heads_kv * seq_q;
  p.row_tiles = row_tiles(heads_q, heads_kv, seq_q);
  p.num_splits =
      num_splits > 0 ? num_splits : choose_splits(batch, heads_q, heads_kv, seq_q, plan_kv, facts.num_sms);
  p.rows = static_cast<long long>(batch) * heads_q * seq_q;
  p.scale_log2 = scale * kernel_detail::kLog2e;
  p.causal = causal;
  // Partials, when there are splits: o [splits, rows, head_dim], then lse [splits, rows]; the
  // workspace holds max_splits of each, and num_splits <= max_splits.
  float* partial_o = p.num_splits > 1 ? static_cast<float*>(workspace) : nullptr;
  float* partial_lse = p.num_splits > 1 ? partial_o + p.num_splits * p.rows * kHeadDim : nullptr;

  const long long blocks = static_cast<long long>(batch) * heads_kv * p.num_splits * p.row_tiles;
  kernel<<<static_cast<unsigned>(blocks), kernel_detail::kThreads, kShared, stream>>>(
      static_cast<const Element*>(q), cache, static_cast<Element*>(o), lse, partial_o, partial_lse, p);
  status = flash::last_launch_status();
  if (!status.ok() || p.num_splits == 1) return status;

  // The merge as a programmatic dependent launch where the GPU has it (compute capability 9.0 on):
  // split_kernel lets it be scheduled early, and it waits for the partials itself (grid_dependency_wait).
  constexpr int kMergeThreads = 256;
  const long long merge_threads = p.rows * (kHeadDim / 4);
  cudaLaunchAttribute dependent;
  dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  dependent.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(ceil_div(merge_threads, kMergeThreads)));
  config.blockDim = dim3(kMergeThreads);
  config.stream = stream;
  config.attrs = &dependent;
  config.numAttrs = facts.dependent_launch ? 1 : 0;
  return flash::cuda_status(cudaLaunchKernelEx(&config, merge_kernel<Element, kHeadDim>, partial_o,
                                               static_cast<const float*>(partial_lse), static_cast<Element*>(o),
                                               lse, p.rows, p.num_splits));
}

template <typename Element>
flash::Status launch_contiguous(const void* q, const void* k, const void* v, void* o, float* lse, int batch,
                                int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim, float scale,
                                bool causal, void* workspace, cudaStream_t stream, int num_splits) {
  if (head_dim == 64) {
    const ContiguousCache<Element, 64> cache{static_cast<const Element*>(k), static_cast<const Element*>(v), heads_kv,
                                             seq_kv};
    return launch<Element, 64>(q, cache, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, scale, causal, workspace,
                               stream, num_splits);
  }
  const ContiguousCache<Element, 128> cache{static_cast<const Element*>(k), static_cast<const Element*>(v), heads_kv,
                                            seq_kv};
  return launch<Element, 128>(q, cache, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, scale, causal, workspace,
                              stream, num_splits);
}

template <typename Element>
flash::Status launch_paged(const void* q, const void* k_pages, const void* v_pages, const int* page_table,
                           const int* cache_lens, void* o, float* lse, int batch, int heads_q, int heads_kv, int seq_q,
                           int head_dim, int page_size, int num_pages, int max_pages_per_seq, float scale, bool causal,
                           void* workspace, cudaStream_t stream) {
  const int capacity = max_pages_per_seq * page_size;  // checked to fit an int
  const int shift = log2_of(page_size);
  if (head_dim == 64) {
    const PagedCache<Element, 64> cache{static_cast<const Element*>(k_pages), static_cast<const Element*>(v_pages),
                                        page_table, cache_lens, heads_kv, shift, num_pages, max_pages_per_seq};
    return launch<Element, 64>(q, cache, o, lse, batch, heads_q, heads_kv, seq_q, capacity, scale, causal, workspace,
                               stream);
  }
  const PagedCache<Element, 128> cache{static_cast<const Element*>(k_pages), static_cast<const Element*>(v_pages),
                                       page_table, cache_lens, heads_kv, shift, num_pages, max_pages_per_seq};
  return launch<Element, 128>(q, cache, o, lse, batch, heads_q, heads_kv, seq_q, capacity, scale, causal, workspace,
                              stream);
}

// The paged call's own checks, in the order of its arguments, before any launch.
flash::Status check_paged_args(const void* q, const void* k_pages, const void* v_pages, const int* page_table,
                               const int* cache_lens, const void* o, const float* lse, int batch, int heads_q,
                               int heads_kv, int seq_q, int head_dim, int page_size, int num_pages,
                               int max_pages_per_seq, float scale) {
  using flash::make_status;
  using flash::StatusCode;
  if (!q) return make_status(StatusCode::kNullPointer, "q", 0);
  if (!k_pages) return make_status(StatusCode::kNullPointer, "k_pages", 0);
  if (!v_pages) return make_status(StatusCode::kNullPointer, "v_pages", 0);
  if (!page_table) return make_status(StatusCode::kNullPointer, "page_table", 0);
  if (!cache_lens) return make_status(StatusCode::kNullPointer, "cache_lens", 0);
  if (!o) return make_status(StatusCode::kNullPointer, "o", 0);
  const std::pair<const char*, int> sizes[] = {{"batch", batch},       {"heads_q", heads_q},
                                               {"heads_kv", heads_kv}, {"seq_q", seq_q},
                                               {"head_dim", head_dim}, {"page_size", page_size},
                                               {"num_pages", num_pages}, {"max_pages_per_seq", max_pages_per_seq}};
  for (const auto& [name, value] : sizes)
    if (value < 1) return make_status(StatusCode::kInvalidDimension, name, value);
  flash::Status s = check_decoding_shape(seq_q, head_dim);
  if (!s.ok()) return s;
  if (heads_q % heads_kv != 0) return make_status(StatusCode::kHeadsNotDivisible, "heads_q", heads_q, heads_kv);
  if (!power_of_two(page_size) || page_size < kMinPageSize || page_size > kMaxPageSize)
    return flash::with_detail(make_status(StatusCode::kInvalidArgument, "page_size", page_size),
                              "must be a power of two from 16 to 65536");
  const long long rows_q = static_cast<long long>(batch) * heads_q * seq_q;
  if (rows_q > flash::kMaxDim) return make_status(StatusCode::kInvalidDimension, "batch*heads_q*seq_q", rows_q);
  const long long capacity = static_cast<long long>(max_pages_per_seq) * page_size;
  if (capacity > flash::kMaxDim)
    return make_status(StatusCode::kInvalidDimension, "max_pages_per_seq*page_size", capacity);
  const long long slots = static_cast<long long>(num_pages) * page_size;  // < 2^47
  if (slots > kMaxCacheElements / head_dim / heads_kv)
    return flash::with_detail(
        make_status(StatusCode::kInvalidDimension, "num_pages*page_size", slots),
        "the cache's num_pages * page_size * heads_kv * head_dim elements must have 64-bit offsets");
  if (!std::isfinite(scale)) return make_status(StatusCode::kInvalidArgument, "scale", 0);
  const std::pair<const char*, const void*> tensors[] = {{"q", q},          {"k_pages", k_pages},
                                                         {"v_pages", v_pages}, {"page_table", page_table},
                                                         {"cache_lens", cache_lens}, {"o", o}, {"lse", lse}};
  for (const auto& [name, pointer] : tensors)
    if (!flash::aligned(pointer)) return make_status(StatusCode::kMisalignedPointer, name, 0);
  return flash::Status{};
}

}  // namespace

int row_tiles(int heads_q, int heads_kv, int seq_q) {
  if (heads_q < 1 || heads_kv < 1 || seq_q < 1) return 1;
  const long long rows = static_cast<long long>(heads_q / heads_kv) * seq_q;
  return static_cast<int>(ceil_div(rows < 1 ? 1 : rows, kBlockRows));
}

int max_splits(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv) {
  if (batch < 1 || heads_kv < 1 || seq_kv < 1) return 1;
  const long long units = static_cast<long long>(batch) * heads_kv * row_tiles(heads_q, heads_kv, seq_q);
  if (units >= kMaxSplitBlocks) return 1;
  long long limit = ceil_div(seq_kv, kMinSplitKeys);
  if (limit > kMaxSplits) limit = kMaxSplits;
  if (limit > kMaxSplitBlocks / units) limit = kMaxSplitBlocks / units;
  return static_cast<int>(limit < 1 ? 1 : limit);
}

int choose_splits(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int num_sms) {
  const int limit = max_splits(batch, heads_q, heads_kv, seq_q, seq_kv);
  if (limit == 1) return 1;
  const long long units = static_cast<long long>(batch) * heads_kv * row_tiles(heads_q, heads_kv, seq_q);
  const long long slots = num_sms < 1 ? 1 : num_sms;  // one block per SM: a wave
  const long long steps = ceil_div(seq_kv, kBlockKeys);
  int best = 1;
  long long best_cost = -1;
  for (int s = 1; s <= limit; ++s) {
    const long long waves = ceil_div(units * s, slots);
    const long long cost = waves * (ceil_div(steps, s) + kBlockOverheadSteps);
    if (best_cost < 0 || cost < best_cost) {
      best = s;
      best_cost = cost;
    }
  }
  return best;
}

size_t forward_workspace_size(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim) {
  if (batch < 1 || heads_q < 1 || heads_kv < 1 || seq_q < 1 || seq_kv < 1 || head_dim < 1) return 0;
  const int splits = max_splits(batch, heads_q, heads_kv, seq_q, seq_kv);
  if (splits == 1) return 0;
  const size_t rows = static_cast<size_t>(batch) * heads_q * seq_q;
  return static_cast<size_t>(splits) * rows * (static_cast<size_t>(head_dim) + 1) * sizeof(float);
}

namespace {

// forward (choose: choose_splits decides, num_splits unused) and forward_with_splits (num_splits, checked).
flash::Status forward_contiguous(bool choose, int num_splits, const void* q, const void* k, const void* v, void* o,
                                 float* lse, int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim,
                                 float scale, bool causal, flash::DType dtype, void* workspace, size_t workspace_bytes,
                                 cudaStream_t stream) {
  flash::Status status = with_own_head_dims(
      flash::check_forward_args(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale));
  if (status.ok()) status = flash::check_half_dtype(dtype);
  if (status.ok()) status = check_decoding_shape(seq_q, head_dim);
  if (status.ok() && !choose) {
    const int most = max_splits(batch, heads_q, heads_kv, seq_q, seq_kv);
    if (num_splits < 1 || num_splits > most)
      status = flash::with_detail(flash::make_status(flash::StatusCode::kInvalidArgument, "num_splits", num_splits),
                                  "takes 1 to max_splits(...) of the call's sizes");
  }
  if (status.ok())
    status = flash::check_workspace(workspace, workspace_bytes,
                                    forward_workspace_size(batch, heads_q, heads_kv, seq_q, seq_kv, head_dim));
  if (status.ok()) status = flash::check_compute_capability(kMinComputeCapability);
  if (!status.ok()) return status;
  if (dtype == flash::DType::kFp16)
    return launch_contiguous<__half>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale, causal,
                                     workspace, stream, num_splits);
  return launch_contiguous<__nv_bfloat16>(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale,
                                          causal, workspace, stream, num_splits);
}

}  // namespace

flash::Status forward(const void* q, const void* k, const void* v, void* o, float* lse, int batch, int heads_q,
                      int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal, flash::DType dtype,
                      void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  return forward_contiguous(true, 0, q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale, causal,
                            dtype, workspace, workspace_bytes, stream);
}

flash::Status forward_with_splits(int num_splits, const void* q, const void* k, const void* v, void* o, float* lse,
                                  int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim,
                                  float scale, bool causal, flash::DType dtype, void* workspace,
                                  size_t workspace_bytes, cudaStream_t stream) {
  return forward_contiguous(false, num_splits, q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim,
                            scale, causal, dtype, workspace, workspace_bytes, stream);
}

size_t forward_paged_workspace_size(int batch, int heads_q, int heads_kv, int seq_q, int head_dim, int page_size,
                                    int max_pages_per_seq) {
  if (page_size < 1 || max_pages_per_seq < 1) return 0;
  const long long capacity = static_cast<long long>(max_pages_per_seq) * page_size;
  const int plan_kv = static_cast<int>(capacity > flash::kMaxDim ? flash::kMaxDim : capacity);
  return forward_workspace_size(batch, heads_q, heads_kv, seq_q, plan_kv, head_dim);
}

flash::Status forward_paged(const void* q, const void* k_pages, const void* v_pages, const int* page_table,
                            const int* cache_lens, void* o, float* lse, int batch, int heads_q, int heads_kv,
                            int seq_q, int head_dim, int page_size, int num_pages, int max_pages_per_seq, float scale,
                            bool causal, flash::DType dtype, void* workspace, size_t workspace_bytes,
                            cudaStream_t stream) {
  flash::Status status = check_paged_args(q, k_pages, v_pages, page_table, cache_lens, o, lse, batch, heads_q,
                                          heads_kv, seq_q, head_dim, page_size, num_pages, max_pages_per_seq, scale);
  if (status.ok()) status = flash::check_half_dtype(dtype);
  if (status.ok())
    status = flash::check_workspace(
        workspace, workspace_bytes,
        forward_paged_workspace_size(batch, heads_q, heads_kv, seq_q, head_dim, page_size, max_pages_per_seq));
  if (status.ok()) status = flash::check_compute_capability(kMinComputeCapability);
  if (!status.ok()) return status;
  if (dtype == flash::DType::kFp16)
    return launch_paged<__half>(q, k_pages, v_pages, page_table, cache_lens, o, lse, batch, heads_q, heads_kv, seq_q,
                                head_dim, page_size, num_pages, max_pages_per_seq, scale, causal, workspace, stream);
  return launch_paged<__nv_bfloat16>(q, k_pages, v_pages, page_table, cache_lens, o, lse, batch, heads_q, heads_kv,
                                     seq_q, head_dim, page_size, num_pages, max_pages_per_seq, scale, causal,
                                     workspace, stream);
}

}  // namespace stage13
