// Stage 12's work-tile boundary, timed: built against a folder that copies.py writes (its docstring has the
// commands). Runs the copy's registered launch 40 times on seeded bf16 inputs and prints the median time and a
// checksum of O and lse (copies that change no arithmetic must agree bit for bit); with the traced copy, then the
// trace of one more launch: each block's span, and per consumer and K/V-tile count the median cycles between the
// boundary's events (clock64 of thread 0 of the consumer warpgroup; each event itself costs about 100 cycles).
//   BIN B H N D CAUSAL
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>

#include "hopper.cu"
#include "launch.inc"

// Every CUDA call of main() checked: the message names the call.
#define CHECK(call)                                       \
  do {                                                    \
    const cudaError_t err = (call);                       \
    if (err != cudaSuccess) {                             \
      printf("%s: %s\n", #call, cudaGetErrorString(err)); \
      return 1;                                           \
    }                                                     \
  } while (0)

__global__ void fill(__nv_bfloat16* x, size_t n, unsigned seed) {
  size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
  if (i < n) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995;
    h ^= h >> 15;
    x[i] = __float2bfloat16((h & 0xffff) / 32768.0f - 1.0f);
  }
}
static double med(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
static double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

int main(int argc, char** argv) {
  int B = atoi(argv[1]), H = atoi(argv[2]), N = atoi(argv[3]), D = atoi(argv[4]);
  bool causal = atoi(argv[5]);
  size_t n = (size_t)B * H * N * D;
  __nv_bfloat16 *q, *k, *v, *o;
  float* lse;
  CHECK(cudaMalloc(&q, n * 2));
  CHECK(cudaMalloc(&k, n * 2));
  CHECK(cudaMalloc(&v, n * 2));
  CHECK(cudaMalloc(&o, n * 2));
  CHECK(cudaMalloc(&lse, (size_t)B * H * N * 4));
  fill<<<(n + 255) / 256, 256>>>(q, n, 1);
  fill<<<(n + 255) / 256, 256>>>(k, n, 2);
  fill<<<(n + 255) / 256, 256>>>(v, n, 3);
  CHECK(cudaGetLastError());
  float scale = 1.0f / sqrtf((float)D);
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  auto run = [&] { return run_stage12(q, k, v, o, lse, B, H, N, D, scale, causal); };
  for (int it = 0; it < 40; ++it) {
    CHECK(cudaEventRecord(e0));
    auto s = run();
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    if (!s.ok()) {
      printf("forward failed: %s\n", flash::to_string(s).c_str());
      return 1;
    }
    float t;
    CHECK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  {
    std::vector<unsigned short> ho(n);
    std::vector<float> hl((size_t)B * H * N);
    CHECK(cudaMemcpy(ho.data(), o, n * 2, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hl.data(), lse, hl.size() * 4, cudaMemcpyDeviceToHost));
    unsigned long long h1 = 1469598103934665603ull, h2 = h1;
    for (unsigned short x : ho) h1 = (h1 ^ x) * 1099511628211ull;
    for (float x : hl) {
      unsigned u;
      memcpy(&u, &x, 4);
      h2 = (h2 ^ u) * 1099511628211ull;
    }
    printf("checksum O %016llx lse %016llx\n", h1, h2);
  }
  static long long tr[stage12::kTraceBlocks][stage12::kTraceSteps][2][stage12::kTraceEvents];
  static long long bn[stage12::kTraceBlocks][3];
  std::vector<long long> zero(sizeof(tr) / 8, 0);
  CHECK(cudaMemcpyToSymbol(stage12::g_trace, zero.data(), sizeof(tr)));
  if (!run().ok()) return 1;
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaMemcpyFromSymbol(tr, stage12::g_trace, sizeof(tr)));
  CHECK(cudaMemcpyFromSymbol(bn, stage12::g_block_ns, sizeof(bn)));
  double flops = 4.0 * B * H * (double)N * N * D / (causal ? 2 : 1);
  printf("== B%d H%d N%d d%d causal%d: median %.4f ms (%.1f TFLOP/s), min %.4f\n", B, H, N, D, causal,
         ms[ms.size() / 2], flops / ms[ms.size() / 2] / 1e9, ms[0]);
  // block spans
  long long gmin = 1LL << 62, gmax = 0;
  std::vector<double> ends, busy;
  for (int b = 0; b < stage12::kTraceBlocks; ++b) {
    gmin = std::min(gmin, bn[b][0]);
  }
  for (int b = 0; b < stage12::kTraceBlocks; ++b) {
    long long e = std::max(bn[b][1], bn[b][2]);
    gmax = std::max(gmax, e);
    ends.push_back(double(e - gmin));
    busy.push_back(double(e - bn[b][0]));
  }
  std::sort(ends.begin(), ends.end());
  double span = double(gmax - gmin);
  printf("  blocks: span %.1f us; block end min %.1f median %.1f max %.1f us; mean busy/span %.4f\n", span / 1e3,
         ends[0] / 1e3, ends[ends.size() / 2] / 1e3, ends.back() / 1e3, mean(busy) / span);
  // Per consumer and K/V-tile count, the median cycles between consecutive events, in the order ev lists them
  // (event 7 closes the K/V loops: that span is divided by their steps).
  {
    const int ev[] = {-1, 19, 0, 12, 1, 2, 3, 13, 14, 15, 16, 17, 18, 4, 5, 6, 7, 8, 9, 10};
    const char* nm[] = {"",         "loop top", "search",          "to q wait",     "q wait",  "k0 wait", "turn",
                        "S0 issue", "pass",     "STS+lse",         "fence",         "wg sync", "TMA",     "ret",
                        "S0 rest",  "softmax0", "loop (per step)", "v+finish+turn", "last PV", "round"};
    for (int c = 0; c < 2; ++c) {
      std::map<int, std::vector<std::vector<double>>> by_n;
      for (int b = 0; b < stage12::kTraceBlocks; ++b) {
        long long prev10 = -1;
        for (int s = 0; s < stage12::kTraceSteps; ++s) {
          long long* t = tr[b][s][c];
          if (t[0] == 0 || t[10] == 0) continue;
          int nt = (int)t[11];
          if (prev10 > 0 && t[15] > 0) {
            auto& L = by_n[nt];
            if (L.empty()) L.resize(20);
            long long prev = prev10;
            for (int e = 1; e < 20; ++e) {
              double d = double(t[ev[e]] - prev);
              if (ev[e] == 7) d = nt > 1 ? d / (nt - 1) : 0.0;
              L[e].push_back(d);
              prev = t[ev[e]];
            }
          }
          prev10 = t[10];
        }
      }
      printf("  consumer %d chain (median cycles):\n    %4s", c, "n");
      for (int e = 1; e < 20; ++e) printf(" %9.9s", nm[e]);
      printf("\n");
      for (auto& kv : by_n) {
        if (kv.second[1].size() < 20) continue;
        printf("    %4d", kv.first);
        for (int e = 1; e < 20; ++e) printf(" %9.0f", med(kv.second[e]));
        printf("\n");
      }
    }
  }
  return 0;
}
