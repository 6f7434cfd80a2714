#include "harness.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>

namespace harness {

void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

bool gpu_available(std::string* why) {
  const GpuCheck check = check_gpu();
  if (check.result == GpuCheck::Result::kOk) return true;
  if (why) *why = check.message;
  return false;
}

std::string cuda_version_string(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

const char* GpuCheck::result_name() const {
  switch (result) {
    case Result::kOk: return "ok";
    case Result::kNoDriver: return "no_driver";
    case Result::kNoDevice: return "no_device";
    case Result::kDriverTooOld: return "driver_too_old";
    case Result::kCudaError: return "cuda_error";
  }
  return "cuda_error";
}

GpuCheck check_gpu() {
  GpuCheck c;
  // Both only report versions: cudaDriverGetVersion gives 0 when no driver is installed, and
  // neither needs a device.
  cudaRuntimeGetVersion(&c.runtime_version);
  cudaDriverGetVersion(&c.driver_version);
  const cudaError_t err = cudaGetDeviceCount(&c.device_count);
  cudaGetLastError();  // clear the sticky error so later calls see a clean state
  if (err != cudaSuccess) c.device_count = 0;
  const std::string runtime = cuda_version_string(c.runtime_version);
  const std::string driver = cuda_version_string(c.driver_version);
  if (err == cudaSuccess && c.device_count > 0) {
    c.message = std::to_string(c.device_count) + " CUDA device(s), driver for CUDA " + driver + ", runtime " + runtime;
  } else if (c.driver_version == 0) {
    c.result = GpuCheck::Result::kNoDriver;
    c.message = "no NVIDIA driver (the CUDA driver library could not be loaded; this build's CUDA runtime is " +
                runtime + ")";
  } else if (err == cudaErrorInsufficientDriver) {
    c.result = GpuCheck::Result::kDriverTooOld;
    c.message = "NVIDIA driver too old: it supports CUDA " + driver + ", this build's runtime is CUDA " + runtime +
                " (update the driver)";
  } else if (err == cudaErrorNoDevice || err == cudaSuccess) {
    c.result = GpuCheck::Result::kNoDevice;
    c.message = "no CUDA device: the NVIDIA driver (CUDA " + driver + ") is installed but sees no GPU";
    // The usual reason on a machine that has a GPU: this process was told to see none.
    if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES"))
      c.message += std::string(" (CUDA_VISIBLE_DEVICES=") + visible + ")";
  } else {
    c.result = GpuCheck::Result::kCudaError;
    c.message = std::string("CUDA cannot use the GPU: ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err) +
                " (driver for CUDA " + driver + ", runtime " + runtime + ")";
  }
  return c;
}

float Problem::softmax_scale() const {
  return std::isnan(scale) ? 1.0f / std::sqrt(static_cast<float>(head_dim)) : scale;
}

std::string Problem::describe() const {
  std::ostringstream s;
  s << "batch=" << batch << " heads_q=" << heads_q << " heads_kv=" << heads_kv << " seq_q=" << seq_q
    << " seq_kv=" << seq_kv << " head_dim=" << head_dim << " causal=" << (causal ? 1 : 0)
    << " dtype=" << flash::dtype_name(dtype);
  return s.str();
}

double Problem::visible_pairs() const {
  const double all = static_cast<double>(seq_q) * seq_kv;
  if (!causal) return all;
  // Query i sees i + offset + 1 keys, clamped to [0, seq_kv], with offset = seq_kv - seq_q: a run of
  // rows that see nothing, a ramp that grows by one key per row, and rows that see everything.
  const long long offset = static_cast<long long>(seq_kv) - seq_q;
  const long long ramp_first = std::max(0LL, -offset);                      // first row that sees a key
  const long long ramp_end = std::min<long long>(seq_q, seq_kv - offset);  // first row that sees all
  double pairs = 0.0;
  if (ramp_end > ramp_first) {  // sum of (i + offset + 1) over [ramp_first, ramp_end)
    const double n = static_cast<double>(ramp_end - ramp_first);
    pairs += n * (ramp_first + offset + 1) + n * (n - 1) / 2.0;
  }
  pairs += static_cast<double>(seq_q - std::max(ramp_end, ramp_first)) * seq_kv;
  return pairs;
}

double forward_flops(const Problem& p) {
  return 4.0 * p.batch * p.heads_q * p.visible_pairs() * p.head_dim;
}

double forward_compulsory_bytes(const Problem& p) {
  const double elems = 2.0 * p.q_elems() + 2.0 * p.kv_elems();  // q, o, k, v
  return elems * flash::dtype_size(p.dtype) + p.rows() * sizeof(float);  // and lse
}

double agreement_tolerance(flash::DType a, flash::DType b) {
  if (a == flash::DType::kBf16 || b == flash::DType::kBf16) return 1e-2;
  if (a == flash::DType::kFp16 || b == flash::DType::kFp16) return 2e-3;
  return 1e-5;
}

float round_to(flash::DType dtype, float x) {
  switch (dtype) {
    case flash::DType::kFp16: return __half2float(__float2half_rn(x));
    case flash::DType::kBf16: return __bfloat162float(__float2bfloat16_rn(x));
    case flash::DType::kFp32: break;
  }
  return x;
}

std::vector<unsigned char> encode(const std::vector<float>& x, flash::DType dtype) {
  std::vector<unsigned char> bytes(x.size() * flash::dtype_size(dtype));
  for (size_t i = 0; i < x.size(); ++i) {
    if (dtype == flash::DType::kFp16) {
      const __half h = __float2half_rn(x[i]);
      std::memcpy(&bytes[2 * i], &h, 2);
    } else if (dtype == flash::DType::kBf16) {
      const __nv_bfloat16 h = __float2bfloat16_rn(x[i]);
      std::memcpy(&bytes[2 * i], &h, 2);
    } else {
      std::memcpy(&bytes[4 * i], &x[i], 4);
    }
  }
  return bytes;
}

std::vector<float> decode(const std::vector<unsigned char>& bytes, flash::DType dtype) {
  std::vector<float> x(bytes.size() / flash::dtype_size(dtype));
  for (size_t i = 0; i < x.size(); ++i) {
    if (dtype == flash::DType::kFp16) {
      __half h;
      std::memcpy(&h, &bytes[2 * i], 2);
      x[i] = __half2float(h);
    } else if (dtype == flash::DType::kBf16) {
      __nv_bfloat16 h;
      std::memcpy(&h, &bytes[2 * i], 2);
      x[i] = __bfloat162float(h);
    } else {
      std::memcpy(&x[i], &bytes[4 * i], 4);
    }
  }
  return x;
}

HostInputs make_inputs(const Problem& p, uint64_t seed, InputKind kind) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float qk_gain = kind == InputKind::kExtreme ? 10.0f : 1.0f;
  auto fill = [&](std::vector<float>& x, long long n, float gain) {
    x.resize(static_cast<size_t>(n));
    for (float& e : x) e = round_to(p.dtype, gain * normal(rng));
  };
  HostInputs in;
  fill(in.q, p.q_elems(), qk_gain);
  fill(in.k, p.kv_elems(), qk_gain);
  fill(in.v, p.kv_elems(), 1.0f);
  fill(in.d_out, p.q_elems(), 1.0f);
  return in;
}

std::string ErrorStats::describe() const {
  std::ostringstream s;
  s << "rel_l2=" << rel_l2 << " max_abs=" << max_abs << " nonfinite=" << nonfinite << " of " << count;
  return s.str();
}

namespace {
template <typename Ref>
ErrorStats compare_impl(const std::vector<float>& got, const std::vector<Ref>& ref) {
  if (got.size() != ref.size())
    throw std::invalid_argument("compare: sizes differ (" + std::to_string(got.size()) + " vs " +
                                std::to_string(ref.size()) + ")");
  ErrorStats e;
  e.count = got.size();
  double diff2 = 0.0, ref2 = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double x = got[i], r = static_cast<double>(ref[i]);
    if (!std::isfinite(r) || !std::isfinite(x)) {
      if (x != r) ++e.nonfinite;  // equal infinities (an lse of -inf for an empty row) agree
      continue;
    }
    const double d = x - r;
    e.max_abs = std::max(e.max_abs, std::abs(d));
    diff2 += d * d;
    ref2 += r * r;
  }
  e.rel_l2 = ref2 > 0.0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  return e;
}
}  // namespace

ErrorStats compare(const std::vector<float>& got, const std::vector<double>& ref) { return compare_impl(got, ref); }
ErrorStats compare(const std::vector<float>& got, const std::vector<float>& ref) { return compare_impl(got, ref); }

size_t count_nonfinite(const std::vector<float>& x) {
  return static_cast<size_t>(std::count_if(x.begin(), x.end(), [](float e) { return !std::isfinite(e); }));
}

std::vector<long long> sample_rows(long long num_rows, long long max_rows) {
  std::vector<long long> rows;
  if (num_rows <= max_rows) {
    for (long long r = 0; r < num_rows; ++r) rows.push_back(r);
    return rows;
  }
  for (long long i = 0; i < max_rows; ++i) rows.push_back(i * (num_rows - 1) / (max_rows - 1));
  return rows;
}

std::vector<float> gather_rows(const std::vector<float>& x, const std::vector<long long>& rows, int width) {
  std::vector<float> out;
  out.reserve(rows.size() * width);
  for (long long r : rows) {
    const size_t begin = static_cast<size_t>(r) * width;
    if (begin + width > x.size()) throw std::invalid_argument("gather_rows: row out of range");
    out.insert(out.end(), x.begin() + begin, x.begin() + begin + width);
  }
  return out;
}

Timing time_cuda(const std::function<void()>& launch, int warmup, int runs, cudaStream_t stream,
                 const std::function<void()>& before_each) {
  for (int i = 0; i < warmup; ++i) launch();
  cuda_check(cudaStreamSynchronize(stream), "warm-up");
  cudaEvent_t start, stop;
  cuda_check(cudaEventCreate(&start), "cudaEventCreate");
  cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> ms(runs);
  for (int i = 0; i < runs; ++i) {
    if (before_each) before_each();
    cuda_check(cudaEventRecord(start, stream), "cudaEventRecord");
    launch();
    cuda_check(cudaEventRecord(stop, stream), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float t = 0.0f;
    cuda_check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    ms[i] = t;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  Timing t;
  t.runs = runs;
  t.min_ms = ms.front();
  t.median_ms = runs % 2 ? ms[runs / 2] : 0.5 * (ms[runs / 2 - 1] + ms[runs / 2]);
  return t;
}

namespace {
// The seed of time_cuda_interleaved's orders: any fixed value does, so that a program's rounds come in
// the same orders in every run.
constexpr unsigned kInterleaveSeed = 2024;
}  // namespace

std::vector<Timing> time_cuda_interleaved(const std::vector<std::function<void()>>& launches, int warmup,
                                          int runs_per_round, int rounds, cudaStream_t stream) {
  std::vector<std::vector<double>> round_medians(launches.size());
  std::vector<Timing> out(launches.size());
  std::vector<size_t> order(launches.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::mt19937 rng(kInterleaveSeed);
  for (int round = 0; round < rounds; ++round) {
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i : order) {
      const Timing t = time_cuda(launches[i], warmup, runs_per_round, stream);
      round_medians[i].push_back(t.median_ms);
      out[i].min_ms = round == 0 ? t.min_ms : std::min(out[i].min_ms, t.min_ms);
      out[i].runs += t.runs;
    }
  }
  for (size_t i = 0; i < launches.size(); ++i) {
    std::vector<double>& m = round_medians[i];
    std::sort(m.begin(), m.end());
    out[i].median_ms = m.size() % 2 ? m[m.size() / 2] : 0.5 * (m[m.size() / 2 - 1] + m[m.size() / 2]);
  }
  return out;
}

}  // namespace harness
