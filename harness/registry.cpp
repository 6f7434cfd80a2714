#include "registry.h"

#include <algorithm>
#include <stdexcept>

#include "01_naive/naive.h"
#include "02_safe_softmax/safe_softmax.h"
#include "03_online_softmax/online_softmax.h"
#include "04_tiled/tiled.h"
#include "05_warp_shuffle/warp_shuffle.h"
#include "06_causal/causal.h"
#include "07_backward/backward.h"
#include "08_tensor_cores/tensor_cores.h"
#include "09_swizzle_pipeline/swizzle_pipeline.h"
#include "10_flash2/flash2.h"
#include "11_backward_tc/backward_tc.h"
#include "12_hopper/hopper.h"
#include "13_decoding/decoding.h"
#include "14_hopper_backward/hopper_backward.h"

// The exercises' entry points. exercises/NN_name/*.cu is its stage's source compiled with
// -DstageNN=exerciseNN (CMakeLists.txt), so it defines these with the types of stageNN's header.
namespace exercise01 {
decltype(stage01::forward) forward;
decltype(stage01::forward_workspace_size) forward_workspace_size;
}  // namespace exercise01
namespace exercise02 {
decltype(stage02::forward) forward;
decltype(stage02::forward_workspace_size) forward_workspace_size;
}  // namespace exercise02
namespace exercise03 {
decltype(stage03::forward) forward;
decltype(stage03::forward_workspace_size) forward_workspace_size;
}  // namespace exercise03
namespace exercise04 {
decltype(stage04::forward) forward;
decltype(stage04::forward_workspace_size) forward_workspace_size;
decltype(stage04::forward_tiles) forward_tiles;
}  // namespace exercise04
namespace exercise05 {
decltype(stage05::forward) forward;
decltype(stage05::forward_workspace_size) forward_workspace_size;
decltype(stage05::forward_tiles) forward_tiles;
}  // namespace exercise05
namespace exercise06 {
decltype(stage06::forward) forward;
decltype(stage06::forward_workspace_size) forward_workspace_size;
decltype(stage06::forward_tiles) forward_tiles;
}  // namespace exercise06
namespace exercise07 {  // the backward only: exercise 07's forward is stage 07's
decltype(stage07::backward) backward;
decltype(stage07::backward_workspace_size) backward_workspace_size;
decltype(stage07::backward_tiles) backward_tiles;
}  // namespace exercise07
namespace exercise08 {
decltype(stage08::forward) forward;
decltype(stage08::forward_workspace_size) forward_workspace_size;
}  // namespace exercise08
namespace exercise09 {
decltype(stage09::forward) forward;
decltype(stage09::forward_workspace_size) forward_workspace_size;
}  // namespace exercise09
namespace exercise10 {
decltype(stage10::forward) forward;
decltype(stage10::forward_workspace_size) forward_workspace_size;
}  // namespace exercise10
namespace exercise11 {  // the backward only: exercise 11's forward is stage 10's, as stage 11's is
decltype(stage11::backward) backward;
decltype(stage11::backward_workspace_size) backward_workspace_size;
}  // namespace exercise11
namespace exercise12 {
decltype(stage12::forward) forward;
decltype(stage12::forward_workspace_size) forward_workspace_size;
decltype(stage12::check_gpu) check_gpu;
}  // namespace exercise12
namespace exercise13 {
decltype(stage13::forward) forward;
decltype(stage13::forward_workspace_size) forward_workspace_size;
decltype(stage13::forward_paged) forward_paged;
decltype(stage13::forward_paged_workspace_size) forward_paged_workspace_size;
}  // namespace exercise13
namespace exercise14 {  // the backward only: exercise 14's forward is stage 14's (stage 12's, or 10's at 32)
decltype(stage14::backward) backward;
decltype(stage14::backward_workspace_size) backward_workspace_size;
decltype(stage14::check_gpu) check_gpu;
}  // namespace exercise14

namespace registry {
namespace {

using flash::DType;

using Fp32Forward = flash::Status (*)(const float*, const float*, const float*, float*, float*, int, int, int, int, int,
                                      int, float, bool, void*, size_t, cudaStream_t);

// An fp32 stage's forward in the registry's signature: any other dtype is refused before the stage
// is called, with the status every stage gives for a dtype it lacks.
template <Fp32Forward kForward>
flash::Status fp32_forward(const void* q, const void* k, const void* v, void* o, float* lse, int batch, int heads_q,
                           int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal, DType dtype,
                           void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (dtype != DType::kFp32)
    return flash::make_status(flash::StatusCode::kDtypeNotSupported, "dtype", static_cast<long long>(dtype));
  return kForward(static_cast<const float*>(q), static_cast<const float*>(k), static_cast<const float*>(v),
                  static_cast<float*>(o), lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale, causal,
                  workspace, workspace_bytes, stream);
}

using Fp32Backward = flash::Status (*)(const float*, const float*, const float*, const float*, const float*,
                                       const float*, float*, float*, float*, int, int, int, int, int, int, float, bool,
                                       void*, size_t, cudaStream_t);

// An fp32 stage's backward in the registry's signature, as fp32_forward. deterministic is not passed
// on: these backwards have no atomics, so they are deterministic whatever it says.
template <Fp32Backward kBackward>
flash::Status fp32_backward(const void* q, const void* k, const void* v, const void* o, const float* lse,
                            const void* d_o, void* dq, void* dk, void* dv, int batch, int heads_q, int heads_kv,
                            int seq_q, int seq_kv, int head_dim, float scale, bool causal, DType dtype,
                            bool /*deterministic*/, void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (dtype != DType::kFp32)
    return flash::make_status(flash::StatusCode::kDtypeNotSupported, "dtype", static_cast<long long>(dtype));
  return kBackward(static_cast<const float*>(q), static_cast<const float*>(k), static_cast<const float*>(v),
                   static_cast<const float*>(o), lse, static_cast<const float*>(d_o), static_cast<float*>(dq),
                   static_cast<float*>(dk), static_cast<float*>(dv), batch, heads_q, heads_kv, seq_q, seq_kv, head_dim,
                   scale, causal, workspace, workspace_bytes, stream);
}

// Stage 14's forward: stage 12's at the head_dims it takes (64, 128), and stage 10's at 32, which
// stage 12 does not take; both write the lse that stage 14 reads.
flash::Status hopper_backward_forward(const void* q, const void* k, const void* v, void* o, float* lse, int batch,
                                      int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim, float scale,
                                      bool causal, DType dtype, void* workspace, size_t workspace_bytes,
                                      cudaStream_t stream) {
  const auto forward = head_dim == 32 ? stage10::forward : stage12::forward;
  return forward(q, k, v, o, lse, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, scale, causal, dtype, workspace,
                 workspace_bytes, stream);
}
size_t hopper_backward_forward_workspace_size(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv,
                                              int head_dim) {
  const auto size = head_dim == 32 ? stage10::forward_workspace_size : stage12::forward_workspace_size;
  return size(batch, heads_q, heads_kv, seq_q, seq_kv, head_dim);
}

}  // namespace

const std::vector<Stage>& stages() {
  static const std::vector<Stage> all = [] {
    std::vector<Stage> list = {
        {1, "01_naive", "naive", "S = QK^T in memory, softmax as exp(s)/sum exp(s), O = PV: O(N^2) memory, overflows",
         false, {DType::kFp32}, {32, 64, 128}, fp32_forward<stage01::forward>, stage01::forward_workspace_size},
        {2, "02_safe_softmax", "safe softmax", "subtract the row max before exp: no overflow, still O(N^2) memory",
         false, {DType::kFp32}, {32, 64, 128}, fp32_forward<stage02::forward>, stage02::forward_workspace_size},
        {3, "03_online_softmax", "online softmax",
         "one fused pass with a running max and sum: O(N) memory, no workspace", false, {DType::kFp32},
         {32, 64, 128}, fp32_forward<stage03::forward>, stage03::forward_workspace_size},
        {4, "04_tiled", "tiled", "K/V tiles in shared memory, shared by a block of query rows (FA2 loop order)", false,
         {DType::kFp32}, {32, 64, 128}, fp32_forward<stage04::forward>, stage04::forward_workspace_size},
        {5, "05_warp_shuffle", "warp shuffle",
         "warps own rows; scores and O in registers; row max/sum by __shfl_xor_sync butterflies", false,
         {DType::kFp32}, {32, 64, 128}, fp32_forward<stage05::forward>, stage05::forward_workspace_size},
        {6, "06_causal", "causal", "causal masking: K/V tiles above the diagonal skipped, only diagonal tiles masked",
         true, {DType::kFp32}, {32, 64, 128}, fp32_forward<stage06::forward>, stage06::forward_workspace_size},
        {7, "07_backward", "backward", "dQ, dK, dV by recomputing P from the stored lse: O(N) memory, no atomics", true,
         {DType::kFp32}, {32, 64, 128}, fp32_forward<stage07::forward>, stage07::forward_workspace_size,
         fp32_backward<stage07::backward>, stage07::backward_workspace_size},
        {8, "08_tensor_cores", "tensor cores",
         "fp16/bf16 on the tensor cores: mma.sync m16n8k16, ldmatrix, S and O in registers, P converted in registers",
         true, {DType::kBf16, DType::kFp16}, {32, 64, 128}, stage08::forward, stage08::forward_workspace_size},
        {9, "09_swizzle_pipeline", "swizzle pipeline",
         "XOR-swizzled shared memory (no bank conflicts) and a cp.async K/V pipeline one tile ahead", true,
         {DType::kBf16, DType::kFp16}, {32, 64, 128}, stage09::forward, stage09::forward_workspace_size},
        {10, "10_flash2", "flash2",
         "FlashAttention-2 tuning: exp2 with log2(e) folded in, a tile shape per head_dim, longest causal tiles first",
         true, {DType::kBf16, DType::kFp16}, {32, 64, 128}, stage10::forward, stage10::forward_workspace_size},
        // Stage 11 is a backward only: its forward is stage 10's, which writes the lse it reads (the
        // stage folder stays self-contained; the pairing is made here).
        {11, "11_backward_tc", "backward tc",
         "dQ, dK, dV on the tensor cores, parallel over K/V tiles; dQ by fp32 atomics, or a deterministic pass",
         true, {DType::kBf16, DType::kFp16}, {32, 64, 128}, stage10::forward, stage10::forward_workspace_size,
         stage11::backward, stage11::backward_workspace_size},
        {12, "12_hopper", "hopper",
         "Hopper: wgmma from shared memory, TMA loads on mbarriers, a producer warp and consumer warpgroups, "
         "setmaxnreg",
         true, {DType::kBf16, DType::kFp16}, {64, 128}, stage12::forward, stage12::forward_workspace_size},
        {13, "13_decoding", "decoding",
         "split-KV decoding: a few new queries against a long (and paged) KV cache, split across blocks, merged "
         "as in 03",
         true, {DType::kBf16, DType::kFp16}, {64, 128}, stage13::forward, stage13::forward_workspace_size},
        // Stage 14 is a backward only, as stage 11 is: its forward is stage 12's (stage 10's at head_dim
        // 32, which stage 12 does not take: hopper_backward_forward).
        {14, "14_hopper_backward", "hopper backward",
         "the backward on Hopper: K/V tiles resident, Q and dO streamed by TMA, S^T and dP^T by wgmma, dV and dK "
         "from registers, dQ added by the copy engine",
         true, {DType::kBf16, DType::kFp16}, {32, 64, 128}, hopper_backward_forward,
         hopper_backward_forward_workspace_size, stage14::backward, stage14::backward_workspace_size},
    };
    // The stages that choose their tiles from the GPU's shared memory per block.
    list[3].forward_tiles = stage04::forward_tiles;
    list[4].forward_tiles = stage05::forward_tiles;
    list[5].forward_tiles = stage06::forward_tiles;
    list[6].forward_tiles = stage07::forward_tiles;
    list[6].backward_tiles = stage07::backward_tiles;
    // The tensor-core stages, as their forward checks (mma.sync with bf16, ldmatrix, cp.async).
    for (Stage& s : list)
      if (s.number >= 8) s.min_compute_capability = 80;
    // Stages 11 and 14 sum dQ with atomics unless asked to be deterministic.
    for (Stage& s : list)
      if (s.number == 11 || s.number == 14) s.backward_atomic = true;
    // The Hopper stages: sm_90a code, which runs on compute capability 9.0 alone, and only in a build
    // that compiled it (stage12::check_gpu and stage14::check_gpu say which).
    for (Stage& s : list)
      if (s.number == 12 || s.number == 14) {
        s.min_compute_capability = s.max_compute_capability = 90;
        s.check_gpu = s.number == 12 ? stage12::check_gpu : stage14::check_gpu;
      }
    // The decoding stage: a few query rows, and a second entry point over a paged cache.
    for (Stage& s : list)
      if (s.number == 13) {
        s.max_seq_q = stage13::kMaxSeqQ;
        s.forward_paged = stage13::forward_paged;
        s.forward_paged_workspace_size = stage13::forward_paged_workspace_size;
      }
    return list;
  }();
  return all;
}

std::string stage_numbers() {
  std::string list;
  const std::vector<Stage>& all = stages();
  for (size_t i = 0; i < all.size(); ++i) {
    size_t last = i;  // the end of a run of consecutive numbers
    while (last + 1 < all.size() && all[last + 1].number == all[last].number + 1) ++last;
    list += (list.empty() ? "" : ", ") + std::to_string(all[i].number);
    if (last > i + 1) {
      list += " to " + std::to_string(all[last].number);
      i = last;
    }
  }
  return list;
}

const std::vector<Stage>& exercises() {
  // Stage `number`'s entry with the exercise's entry points and file in place of the stage's.
  auto exercise = [](int number, ForwardFn forward, WorkspaceFn workspace_size, const char* file,
                     TilesFn forward_tiles = nullptr) {
    Stage e = *find(number);
    e.forward = forward;
    e.forward_workspace_size = workspace_size;
    e.forward_tiles = forward_tiles;
    e.exercise_file = file;
    return e;
  };
  static const std::vector<Stage> all = [&] {
    std::vector<Stage> list = {
        exercise(1, fp32_forward<exercise01::forward>, exercise01::forward_workspace_size,
                 "exercises/01_naive/naive.cu"),
        exercise(2, fp32_forward<exercise02::forward>, exercise02::forward_workspace_size,
                 "exercises/02_safe_softmax/safe_softmax.cu"),
        exercise(3, fp32_forward<exercise03::forward>, exercise03::forward_workspace_size,
                 "exercises/03_online_softmax/online_softmax.cu"),
        exercise(4, fp32_forward<exercise04::forward>, exercise04::forward_workspace_size,
                 "exercises/04_tiled/tiled.cu", exercise04::forward_tiles),
        exercise(5, fp32_forward<exercise05::forward>, exercise05::forward_workspace_size,
                 "exercises/05_warp_shuffle/warp_shuffle.cu", exercise05::forward_tiles),
        exercise(6, fp32_forward<exercise06::forward>, exercise06::forward_workspace_size,
                 "exercises/06_causal/causal.cu", exercise06::forward_tiles),
        exercise(7, fp32_forward<stage07::forward>, stage07::forward_workspace_size,
                 "exercises/07_backward/backward.cu", stage07::forward_tiles),
    };
    list.back().backward = fp32_backward<exercise07::backward>;
    list.back().backward_workspace_size = exercise07::backward_workspace_size;
    list.back().backward_tiles = exercise07::backward_tiles;
    list.push_back(exercise(8, exercise08::forward, exercise08::forward_workspace_size,
                            "exercises/08_tensor_cores/tensor_cores.cu"));
    list.push_back(exercise(9, exercise09::forward, exercise09::forward_workspace_size,
                            "exercises/09_swizzle_pipeline/swizzle_pipeline.cu"));
    list.push_back(exercise(10, exercise10::forward, exercise10::forward_workspace_size,
                            "exercises/10_flash2/flash2_kernel.cuh"));
    list.push_back(exercise(11, stage10::forward, stage10::forward_workspace_size,
                            "exercises/11_backward_tc/backward_tc_kernel.cuh"));
    list.back().backward = exercise11::backward;
    list.back().backward_workspace_size = exercise11::backward_workspace_size;
    list.push_back(exercise(12, exercise12::forward, exercise12::forward_workspace_size,
                            "exercises/12_hopper/mainloop.cuh"));
    list.back().check_gpu = exercise12::check_gpu;
    list.push_back(exercise(13, exercise13::forward, exercise13::forward_workspace_size,
                            "exercises/13_decoding/decoding_kernel.cuh"));
    list.back().forward_paged = exercise13::forward_paged;
    list.back().forward_paged_workspace_size = exercise13::forward_paged_workspace_size;
    list.push_back(exercise(14, hopper_backward_forward, hopper_backward_forward_workspace_size,
                            "exercises/14_hopper_backward/mainloop.cuh"));
    list.back().backward = exercise14::backward;
    list.back().backward_workspace_size = exercise14::backward_workspace_size;
    list.back().check_gpu = exercise14::check_gpu;
    return list;
  }();
  return all;
}

const Stage* find_exercise(int number) {
  for (const Stage& s : exercises())
    if (s.number == number) return &s;
  return nullptr;
}

std::string Stage::label() const {
  return std::string(is_exercise() ? "exercise" : "stage") + (number < 10 ? "0" : "") + std::to_string(number);
}

bool Stage::supports(const harness::Problem& p) const {
  return (causal || !p.causal) && has_dtype(p.dtype) && (max_seq_q == 0 || p.seq_q <= max_seq_q) &&
         std::find(head_dims.begin(), head_dims.end(), p.head_dim) != head_dims.end();
}

bool Stage::runs_wherever(const Stage& other) const {
  const bool min_covered = other.min_compute_capability <= min_compute_capability;
  const bool max_covered = other.max_compute_capability == 0 ||
                           (max_compute_capability != 0 && max_compute_capability <= other.max_compute_capability);
  return min_covered && max_covered;
}

bool Stage::has_dtype(flash::DType dtype) const { return std::find(dtypes.begin(), dtypes.end(), dtype) != dtypes.end(); }

std::string Stage::dtype_list() const {
  std::string list;
  for (flash::DType d : dtypes) list += (list.empty() ? "" : ",") + std::string(flash::dtype_name(d));
  return list;
}

harness::Problem Stage::in_own_dtype(harness::Problem p) const {
  if (!has_dtype(p.dtype)) p.dtype = dtypes.front();
  return p;
}

size_t Stage::workspace_bytes(const harness::Problem& p) const {
  return forward_workspace_size(p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_kv, p.head_dim);
}

size_t Stage::backward_workspace_bytes(const harness::Problem& p) const {
  return backward_workspace_size(p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_kv, p.head_dim);
}

const Stage* find(int number) {
  for (const Stage& s : stages())
    if (s.number == number) return &s;
  return nullptr;
}

const Stage* previous(const Stage& stage, const harness::Problem& p) {
  const Stage* prev = nullptr;
  for (const Stage& s : stages())
    // A stage whose forward is the one before it (stage 11 runs stage 10's) adds no forward of its own.
    if (s.number < stage.number && s.supports(s.in_own_dtype(p)) && stage.runs_wherever(s) &&
        !(prev && prev->forward == s.forward))
      prev = &s;
  return prev;
}

ForwardResult run_forward(const Stage& stage, const harness::Problem& p, const harness::DeviceInputs& in) {
  if (in.dtype() != p.dtype) throw std::invalid_argument("run_forward: inputs are not in the problem's dtype");
  harness::DeviceTensor o(p.dtype, static_cast<size_t>(p.q_elems()));
  harness::DeviceBuffer<float> lse(p.rows());
  harness::DeviceBuffer<unsigned char> workspace(stage.workspace_bytes(p));
  o.poison();
  lse.poison();
  ForwardResult r;
  r.status = stage.forward(in.q.get(), in.k.get(), in.v.get(), o.get(), lse.get(), p.batch, p.heads_q, p.heads_kv,
                           p.seq_q, p.seq_kv, p.head_dim, p.softmax_scale(), p.causal, p.dtype, workspace.get(),
                           workspace.bytes(), nullptr);
  if (r.status.ok()) r.status = flash::cuda_status(cudaDeviceSynchronize());
  if (!r.status.ok()) return r;
  r.o = o.download();
  r.lse = lse.download();
  return r;
}

ForwardResult run_forward(const Stage& stage, const harness::Problem& p, const harness::HostInputs& in) {
  const harness::Problem own = stage.in_own_dtype(p);
  return run_forward(stage, own, harness::DeviceInputs(in, own.dtype));
}

BackwardResult run_backward(const Stage& stage, const harness::Problem& p, const harness::DeviceInputs& in,
                            float lse_offset, bool deterministic) {
  BackwardResult r;
  if (in.dtype() != p.dtype) throw std::invalid_argument("run_backward: inputs are not in the problem's dtype");
  const ForwardResult fwd = run_forward(stage, p, in);
  r.status = fwd.status;
  if (!r.status.ok()) return r;
  std::vector<float> lse = fwd.lse;
  for (float& x : lse) x += lse_offset;
  // O came back as floats; in a half dtype every one of them is a value of that dtype, so the upload
  // gives the backward exactly the forward's O.
  const harness::DeviceTensor o(p.dtype, fwd.o);
  const harness::DeviceBuffer<float> lse_dev(lse);
  harness::DeviceTensor dq(p.dtype, static_cast<size_t>(p.q_elems())), dk(p.dtype, static_cast<size_t>(p.kv_elems())),
      dv(p.dtype, static_cast<size_t>(p.kv_elems()));
  harness::DeviceBuffer<unsigned char> workspace(stage.backward_workspace_bytes(p));
  dq.poison();
  dk.poison();
  dv.poison();
  r.status = stage.backward(in.q.get(), in.k.get(), in.v.get(), o.get(), lse_dev.get(), in.d_out.get(), dq.get(),
                            dk.get(), dv.get(), p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_kv, p.head_dim,
                            p.softmax_scale(), p.causal, p.dtype, deterministic, workspace.get(), workspace.bytes(),
                            nullptr);
  if (r.status.ok()) r.status = flash::cuda_status(cudaDeviceSynchronize());
  if (!r.status.ok()) return r;
  r.dq = dq.download();
  r.dk = dk.download();
  r.dv = dv.download();
  return r;
}

}  // namespace registry
