#include "registry.h"

#include <algorithm>

#include "01_naive/naive.h"
#include "02_safe_softmax/safe_softmax.h"
#include "03_online_softmax/online_softmax.h"
#include "04_tiled/tiled.h"
#include "05_warp_shuffle/warp_shuffle.h"
#include "06_causal/causal.h"
#include "07_backward/backward.h"

namespace registry {

const std::vector<Stage>& stages() {
  static const std::vector<Stage> all = {
      {1, "01_naive", "naive", "S = QK^T in memory, softmax as exp(s)/sum exp(s), O = PV: O(N^2) memory, overflows",
       false, "fp32", {32, 64, 128}, stage01::forward, stage01::forward_workspace_size},
      {2, "02_safe_softmax", "safe softmax", "subtract the row max before exp: no overflow, still O(N^2) memory",
       false, "fp32", {32, 64, 128}, stage02::forward, stage02::forward_workspace_size},
      {3, "03_online_softmax", "online softmax",
       "one fused pass with a running max and sum: O(N) memory, no workspace", false, "fp32", {32, 64, 128},
       stage03::forward, stage03::forward_workspace_size},
      {4, "04_tiled", "tiled", "K/V tiles in shared memory, shared by a block of query rows (FA2 loop order)", false,
       "fp32", {32, 64, 128}, stage04::forward, stage04::forward_workspace_size},
      {5, "05_warp_shuffle", "warp shuffle",
       "warps own rows; scores and O in registers; row max/sum by __shfl_xor_sync butterflies", false, "fp32",
       {32, 64, 128}, stage05::forward, stage05::forward_workspace_size},
      {6, "06_causal", "causal", "causal masking: K/V tiles above the diagonal skipped, only diagonal tiles masked",
       true, "fp32", {32, 64, 128}, stage06::forward, stage06::forward_workspace_size},
      {7, "07_backward", "backward", "dQ, dK, dV by recomputing P from the stored lse: O(N) memory, no atomics", true,
       "fp32", {32, 64, 128}, stage07::forward, stage07::forward_workspace_size, stage07::backward,
       stage07::backward_workspace_size},
  };
  return all;
}

bool Stage::supports(const harness::Problem& p) const {
  return (causal || !p.causal) && std::find(head_dims.begin(), head_dims.end(), p.head_dim) != head_dims.end();
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
    if (s.number < stage.number && s.supports(p)) prev = &s;
  return prev;
}

ForwardResult run_forward(const Stage& stage, const harness::Problem& p, const harness::DeviceInputs& in) {
  harness::DeviceBuffer<float> o(p.q_elems()), lse(p.rows());
  harness::DeviceBuffer<unsigned char> workspace(stage.workspace_bytes(p));
  o.poison();
  lse.poison();
  ForwardResult r;
  r.status = stage.forward(in.q.get(), in.k.get(), in.v.get(), o.get(), lse.get(), p.batch, p.heads_q, p.heads_kv,
                           p.seq_q, p.seq_kv, p.head_dim, p.softmax_scale(), p.causal, workspace.get(),
                           workspace.bytes(), nullptr);
  if (r.status.ok()) r.status = flash::cuda_status(cudaDeviceSynchronize());
  if (!r.status.ok()) return r;
  r.o = o.download();
  r.lse = lse.download();
  return r;
}

BackwardResult run_backward(const Stage& stage, const harness::Problem& p, const harness::DeviceInputs& in,
                            float lse_offset) {
  BackwardResult r;
  const ForwardResult fwd = run_forward(stage, p, in);
  r.status = fwd.status;
  if (!r.status.ok()) return r;
  std::vector<float> lse = fwd.lse;
  for (float& x : lse) x += lse_offset;
  const harness::DeviceBuffer<float> o(fwd.o), lse_dev(lse);
  harness::DeviceBuffer<float> dq(p.q_elems()), dk(p.kv_elems()), dv(p.kv_elems());
  harness::DeviceBuffer<unsigned char> workspace(stage.backward_workspace_bytes(p));
  dq.poison();
  dk.poison();
  dv.poison();
  r.status = stage.backward(in.q.get(), in.k.get(), in.v.get(), o.get(), lse_dev.get(), in.d_out.get(), dq.get(),
                            dk.get(), dv.get(), p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_kv, p.head_dim,
                            p.softmax_scale(), p.causal, workspace.get(), workspace.bytes(), nullptr);
  if (r.status.ok()) r.status = flash::cuda_status(cudaDeviceSynchronize());
  if (!r.status.ok()) return r;
  r.dq = dq.download();
  r.dk = dk.download();
  r.dv = dv.download();
  return r;
}

}  // namespace registry
