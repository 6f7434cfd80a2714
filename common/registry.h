// registry.h: the stages in course order, what each can do, and how to call it. Adding a stage to
// the course is one folder plus one entry in registry.cpp.
#pragma once

#include <cstddef>
#include <ostream>
#include <string>
#include <vector>

#include "flash_stage.cuh"
#include "harness.h"

namespace registry {

using ForwardFn = flash::Status (*)(const float* q, const float* k, const float* v, float* o, float* lse, int batch,
                                    int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim, float scale,
                                    bool causal, void* workspace, size_t workspace_bytes, cudaStream_t stream);
using WorkspaceFn = size_t (*)(int batch, int heads_q, int heads_kv, int seq_q, int seq_kv, int head_dim);
// dQ, dK, dV from dO, given the forward's O and lse (stage 07 on).
using BackwardFn = flash::Status (*)(const float* q, const float* k, const float* v, const float* o, const float* lse,
                                     const float* d_o, float* dq, float* dk, float* dv, int batch, int heads_q,
                                     int heads_kv, int seq_q, int seq_kv, int head_dim, float scale, bool causal,
                                     void* workspace, size_t workspace_bytes, cudaStream_t stream);

struct Stage {
  int number;
  const char* folder;  // under stages/
  const char* name;
  const char* lesson;  // the one idea this stage adds
  bool causal;         // accepts causal = true
  const char* dtype;
  std::vector<int> head_dims;
  ForwardFn forward;
  WorkspaceFn forward_workspace_size;
  BackwardFn backward = nullptr;  // null: the stage has no backward
  WorkspaceFn backward_workspace_size = nullptr;

  bool supports(const harness::Problem& p) const;
  size_t workspace_bytes(const harness::Problem& p) const;
  size_t backward_workspace_bytes(const harness::Problem& p) const;
};

const std::vector<Stage>& stages();
const Stage* find(int number);
// The nearest earlier stage that supports the same problem, or null for the first.
const Stage* previous(const Stage& stage, const harness::Problem& p);

// One forward run with fresh outputs poisoned with NaN, synchronized, copied back.
struct ForwardResult {
  flash::Status status;
  std::vector<float> o;
  std::vector<float> lse;
};
ForwardResult run_forward(const Stage& stage, const harness::Problem& p, const harness::DeviceInputs& in);

// The stage's forward (for O and lse), then its backward with the inputs' d_out; gradients are
// poisoned with NaN first. lse_offset is added to the forward's lse before the backward: tests use
// it to show the backward really reads lse.
struct BackwardResult {
  flash::Status status;
  std::vector<float> dq, dk, dv;
};
BackwardResult run_backward(const Stage& stage, const harness::Problem& p, const harness::DeviceInputs& in,
                            float lse_offset = 0.0f);

// How GoogleTest prints a stage in a failure message.
inline void PrintTo(const Stage& s, std::ostream* os) { *os << "stage " << s.number << " (" << s.name << ")"; }

}  // namespace registry
