// registry.h: the stages in course order, what each can do, and how to call it. Adding a stage to
// the course is one folder plus one entry in registry.cpp. The exercises (exercises/README.md) are
// entries of the same kind in a list of their own, so that everything that runs a stage runs them.
#pragma once

#include <cstddef>
#include <ostream>
#include <string>
#include <vector>

#include "flash_stage.cuh"
#include "harness.h"

namespace registry {

// A stage's forward with its tensors untyped and their dtype named: the signature of the half
// stages (stage08::forward and on); the fp32 stages' forward(const float*, ...) is wrapped into it
// by registry.cpp, refusing any dtype but fp32.
using ForwardFn = flash::Status (*)(const void* q, const void* k, const void* v, void* o, float* lse, int batch,
                                    int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim, float scale,
                                    bool causal, flash::DType dtype, void* workspace, size_t workspace_bytes,
                                    cudaStream_t stream);
// The workspace bytes a stage's forward or backward needs for these sizes.
using WorkspaceFn = size_t (*)(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim);
// The tiles a stage's forward or backward launches at head_dim when a block may use shared_limit bytes
// of shared memory (stage04::forward_tiles, ...); no CUDA call.
using TilesFn = flash::Status (*)(int head_dim, size_t shared_limit, flash::TileShape* tiles);
// The forward over a paged K/V cache (stage 13): K and V in pages [num_pages, page_size, heads_kv,
// head_dim], page_table [batch, max_pages_per_seq] and cache_lens [batch] int32 on the device.
using PagedForwardFn = flash::Status (*)(const void* q, const void* k_pages, const void* v_pages,
                                         const int* page_table, const int* cache_lens, void* o, float* lse,
                                         int batch, int heads_q, int heads_kv, int seq_q, int head_dim,
                                         int page_size, int num_pages, int max_pages_per_seq, float scale,
                                         bool causal, flash::DType dtype, void* workspace, size_t workspace_bytes,
                                         cudaStream_t stream);
// A stage's own check of this GPU and this build, before it runs (stage12::check_gpu): success, or
// kArchNotSupported saying why not, or the CUDA error that kept it from asking.
using GpuCheckFn = flash::Status (*)();
// The workspace bytes of PagedForwardFn for these sizes.
using PagedWorkspaceFn = size_t (*)(int batch, int heads_q, int heads_kv, int seq_q, int head_dim, int page_size,
                                    int max_pages_per_seq);
// dQ, dK, dV from dO, given the forward's O and lse (stage 07 on), with the tensors untyped and their
// dtype named, as ForwardFn: stage 11's signature; stage 07's backward(const float*, ...) is wrapped
// into it by registry.cpp, refusing any dtype but fp32. deterministic = true asks for the same bits
// from the same inputs; a stage whose backward never uses atomics (07) is deterministic either way
// (Stage::backward_atomic says which).
using BackwardFn = flash::Status (*)(const void* q, const void* k, const void* v, const void* o, const float* lse,
                                     const void* d_o, void* dq, void* dk, void* dv, int batch, int heads_q,
                                     int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal,
                                     flash::DType dtype, bool deterministic, void* workspace, size_t workspace_bytes,
                                     cudaStream_t stream);

// One stage of the course: what it is, what it accepts and its entry points.
struct Stage {
  int number;          // its place in the course, from 1; the NN of its folder
  const char* folder;  // under stages/
  const char* name;    // short name for tables and messages, e.g. "online softmax"
  const char* lesson;  // the one idea this stage adds
  bool causal;         // accepts causal = true
  std::vector<flash::DType> dtypes;    // element types of its tensors, the first its default
  std::vector<int> head_dims;          // the head_dim values it accepts
  ForwardFn forward;                   // never null
  WorkspaceFn forward_workspace_size;  // the bytes forward needs; never null
  BackwardFn backward = nullptr;  // null: the stage has no backward
  WorkspaceFn backward_workspace_size = nullptr;  // null exactly when backward is
  // True where the backward's default mode (deterministic = false) sums a gradient with atomic adds,
  // so that two runs on the same inputs may differ in the last bits (stage 11's dQ); false where
  // every gradient element has one writer whatever the flag (stage 07).
  bool backward_atomic = false;
  // Stages 04-07, whose tiles depend on the GPU's shared memory per block: the tiles forward launches
  // for a head_dim and limit. Null for a stage with one configuration, whatever the GPU.
  TilesFn forward_tiles = nullptr;
  TilesFn backward_tiles = nullptr;  // the same for backward; null where forward_tiles is, or backward
  // The oldest GPU it runs on, as 10 * major + minor compute capability (80: the tensor-core stages,
  // which refuse an older GPU with kArchNotSupported); 0: any GPU CUDA 13 supports (7.5 on).
  int min_compute_capability = 0;
  // The newest GPU it runs on, the same way; 0: no limit. Stage 12's sm_90a code runs on 9.0 only
  // (90 here and in min_compute_capability).
  int max_compute_capability = 0;
  // Where compute capability is not the whole story (stage 12: a build without sm_90a code refuses
  // every GPU), the stage's own check; null: min_compute_capability and max_compute_capability say it all.
  GpuCheckFn check_gpu = nullptr;
  // Exercises only: the file with the TODO(exercise) lines, from the repository root, e.g.
  // "exercises/05_warp_shuffle/warp_shuffle.cu". Null for a stage.
  const char* exercise_file = nullptr;
  // The most query rows per head it takes; 0: any. A decoding stage (13) takes a few new queries
  // against a long cache: the runner, the tests and the benchmark give it decode shapes of their own.
  int max_seq_q = 0;
  // A second entry point over a paged K/V cache; null for the stages without one.
  PagedForwardFn forward_paged = nullptr;
  PagedWorkspaceFn forward_paged_workspace_size = nullptr;  // null exactly when forward_paged is

  // Whether this is an entry of exercises(): a learner's copy of stage `number`.
  bool is_exercise() const { return exercise_file != nullptr; }
  // "stage05", or "exercise05" for an exercise: test names, ctest labels, benchmark names.
  std::string label() const;

  // Whether forward accepts p: causal only where the stage has it, one of its head_dims and dtypes,
  // seq_q up to max_seq_q where the stage has a limit.
  bool supports(const harness::Problem& p) const;
  // Whether every GPU this stage runs on (by compute capability) is one `other` runs on too: a stage
  // is compared only with earlier stages that run wherever it does (stage 13 with 10, not with the
  // Hopper-only 12).
  bool runs_wherever(const Stage& other) const;
  // Whether p's dtype is one of dtypes.
  bool has_dtype(flash::DType dtype) const;
  // The dtypes joined by commas, e.g. "fp16,bf16".
  std::string dtype_list() const;
  // p in the dtype this stage runs it in: p.dtype when the stage has it, else the stage's first.
  harness::Problem in_own_dtype(harness::Problem p) const;
  // forward_workspace_size for p's sizes.
  size_t workspace_bytes(const harness::Problem& p) const;
  // backward_workspace_size for p's sizes; only for a stage with a backward.
  size_t backward_workspace_bytes(const harness::Problem& p) const;
};

// Every stage in course order, built on first use; the references stay valid until the program ends.
const std::vector<Stage>& stages();
// The stage numbers for a message: runs of three or more consecutive numbers joined, e.g.
// "1 to 13".
std::string stage_numbers();
// The stage with that number, or null when there is none.
const Stage* find(int number);
// The exercises, one for each of stages 01-14 and in that order: each is its stage's entry with the
// forward (and backward) compiled from exercises/NN_name/ in place of the stage's, exercise_file set.
const std::vector<Stage>& exercises();
// The exercise of stage `number`, or null when there is none.
const Stage* find_exercise(int number);
// The nearest earlier stage that supports the same problem in some dtype (stage 08 in bf16 is
// compared with stage 07 in fp32 on the same rounded inputs) and runs on every GPU `stage` runs on
// (Stage::runs_wherever: stage 13 is compared with stage 10, not with the Hopper-only stage 12),
// or null for the first. A stage that reuses the forward of the stage before it (11, a backward
// only, runs 10's) is passed over.
const Stage* previous(const Stage& stage, const harness::Problem& p);

// What run_forward brings back to the host.
struct ForwardResult {
  flash::Status status;    // the forward's, or the synchronize's; o and lse are empty unless it is ok
  std::vector<float> o;    // [batch, heads_q, seq_q, head_dim]
  std::vector<float> lse;  // [batch, heads_q, seq_q]
};
// One forward run with p's sizes, scale, causal and dtype (in's dtype must be p's), into fresh
// outputs poisoned with NaN, synchronized, copied back as floats. Allocation or copy failures
// throw (harness::cuda_check).
ForwardResult run_forward(const Stage& stage, const harness::Problem& p, const harness::DeviceInputs& in);
// The same from host inputs, uploaded in stage.in_own_dtype(p)'s dtype.
ForwardResult run_forward(const Stage& stage, const harness::Problem& p, const harness::HostInputs& in);

// What run_backward brings back to the host.
struct BackwardResult {
  flash::Status status;           // the first failure of forward, backward or synchronize, else ok
  std::vector<float> dq, dk, dv;  // shaped like q, k, v; empty unless status is ok
};
// The stage's forward (for O and lse), then its backward with the inputs' d_out, in p's dtype (in's
// dtype must be p's); gradients are poisoned with NaN first and come back as floats. lse_offset is
// added to the forward's lse before the backward: tests use it to show the backward really reads
// lse. deterministic is passed to the backward. Only for a stage with a backward.
BackwardResult run_backward(const Stage& stage, const harness::Problem& p, const harness::DeviceInputs& in,
                            float lse_offset = 0.0f, bool deterministic = false);

// How GoogleTest prints a stage in a failure message.
inline void PrintTo(const Stage& s, std::ostream* os) {
  *os << (s.is_exercise() ? "exercise " : "stage ") << s.number << " (" << s.name << ")";
}

}  // namespace registry
