// Stage 12 per-block phase trace (scripts/stage12_phase_trace/apply.py says how to build it): runs the
// registered stage 30 times on seeded inputs, then prints the medians of the phases of the last call.
#include "hopper.cu"
#include <cstdio>
#include <vector>
#include <algorithm>
#include <map>
#include <cuda_bf16.h>

__global__ void fill(__nv_bfloat16* x, size_t n, unsigned seed) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) { unsigned h = (unsigned)i * 2654435761u ^ seed; h ^= h >> 13; h *= 0x5bd1e995; h ^= h >> 15;
    x[i] = __float2bfloat16((h & 0xffff) / 65536.0f - 0.5f); }
}
static double med(std::vector<double> v) { if (v.empty()) return 0; std::sort(v.begin(), v.end()); return v[v.size()/2]; }

int main(int argc, char** argv) {
  int B = atoi(argv[1]), H = atoi(argv[2]), N = atoi(argv[3]), D = atoi(argv[4]); bool causal = atoi(argv[5]);
  size_t n = (size_t)B * H * N * D;
  __nv_bfloat16 *q, *k, *v, *o; float* lse;
  cudaMalloc(&q, n * 2); cudaMalloc(&k, n * 2); cudaMalloc(&v, n * 2); cudaMalloc(&o, n * 2); cudaMalloc(&lse, (size_t)B*H*N*4);
  fill<<<(n + 255) / 256, 256>>>(q, n, 1); fill<<<(n + 255) / 256, 256>>>(k, n, 2); fill<<<(n + 255) / 256, 256>>>(v, n, 3);
  float scale = 1.0f / sqrtf((float)D);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int it = 0; it < 30; ++it) {
    cudaEventRecord(e0);
    auto s = stage12::forward(q, k, v, o, lse, B, H, H, N, N, D, scale, causal, flash::DType::kBf16, nullptr, 0, 0);
    cudaEventRecord(e1); cudaEventSynchronize(e1);
    if (!s.ok()) { printf("forward failed\n"); return 1; }
    float t; cudaEventElapsedTime(&t, e0, e1); ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  int tiles = B * H * ((N + 127) / 128);
  std::vector<long long> tr((size_t)tiles * 12);
  cudaMemcpyFromSymbol(tr.data(), stage12::g_trace, tr.size() * 8);
  double flops = 4.0 * B * H * (double)N * N * D / (causal ? 2 : 1);
  printf("B%d H%d N%d d%d causal%d: median %.4f ms (%.1f TFLOP/s), %d CTAs\n", B, H, N, D, causal, ms[15], flops / ms[15] / 1e9, tiles);
  // phases in clocks
  std::vector<double> init, qwait, tile0, loop_per, drain, epi0, epi1, total;
  std::map<long long, std::vector<std::pair<long long,long long>>> per_sm;
  long long gmin = 1LL << 62, gmax = 0;
  for (int b = 0; b < tiles; ++b) {
    long long* t = &tr[(size_t)b * 12];
    int nt = (int)t[8];
    init.push_back(t[1] - t[0]); qwait.push_back(t[2] - t[1]); tile0.push_back(t[3] - t[2]);
    if (nt > 1) loop_per.push_back(double(t[4] - t[3]) / (nt - 1));
    drain.push_back(t[5] - t[4]); epi0.push_back(t[6] - t[5]); epi1.push_back(t[7] - t[5]); total.push_back(std::max(t[6], t[7]) - t[0]);
    per_sm[t[11]].push_back({t[9], t[10]}); gmin = std::min(gmin, t[9]); gmax = std::max(gmax, t[10]);
  }
  std::vector<double> gaps; double busy = 0;
  for (auto& kv : per_sm) { auto& v = kv.second; std::sort(v.begin(), v.end());
    for (size_t i = 0; i < v.size(); ++i) { busy += v[i].second - v[i].first; if (i) gaps.push_back(v[i].first - v[i-1].second); } }
  double span = gmax - gmin;
  long long clk_total = 0; double ns_total = 0;
  for (int b = 0; b < tiles; ++b) { long long* t = &tr[(size_t)b*12]; clk_total += std::max(t[6], t[7]) - t[0]; ns_total += t[10] - t[9]; }
  double ghz = clk_total / ns_total;
  printf("  clock %.3f GHz (clocks/ns over CTAs); span %.1f us, SMs %zu, busy fraction %.3f\n", ghz, span / 1e3, per_sm.size(), busy / (span * per_sm.size()));
  printf("  median per CTA (ns): init %.0f | q+k0 wait %.0f | tile0 S+softmax %.0f | per loop tile %.0f | last PV %.0f | epilogue c0 %.0f c1 %.0f | CTA total %.0f | gap between CTAs on an SM %.0f\n",
         med(init)/ghz, med(qwait)/ghz, med(tile0)/ghz, med(loop_per)/ghz, med(drain)/ghz, med(epi0)/ghz, med(epi1)/ghz, med(total)/ghz, med(gaps));
  return 0;
}
