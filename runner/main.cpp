// flash-stages: the course runner. Runs every stage on one problem, checks each against the stage
// before it and against the fp64 reference, and prints what each idea bought.
//
//   flash-stages [--stage N | --exercise N] [--batch B] [--heads H] [--heads-kv H] [--seq N] [--seq-q N]
//                [--seq-kv N] [--head-dim D] [--causal] [--dtype fp32|fp16|bf16] [--runs R]
//                [--smem-limit K] [--json] [--list] [--help]
//
// --exercise N runs the learner's version of stage N (exercises/README.md) exactly as --stage N runs
// the stage: the same checks against the stage before it and the reference, the same timing. The
// exercises are compiled by the test command (-DFLASH_TESTS=ON) or -DFLASH_EXERCISES=ON; a build
// without them (FLASH_EXERCISES_BUILT=0: the README's first command) refuses --exercise, saying so.
// --smem-limit K runs the stages as a GPU that allows a block K KiB of shared memory would
// (flash::set_shared_memory_limit): on an H100, --smem-limit 64 runs the tiles a T4 runs.
//
// Every option is checked before anything else happens, GPU or not: a bad one is named with its
// value on stderr and the runner exits with kExitUsage or kExitCannotRun (with --json, the same as
// JSON on stdout).
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness.h"
#include "reference.h"
#include "registry.h"

// CMakeLists.txt sets it on flash_registry: 1 where the exercises are compiled into the registry.
#ifndef FLASH_EXERCISES_BUILT
#error "FLASH_EXERCISES_BUILT is not defined: build the runner with CMakeLists.txt"
#endif

namespace {

// Exit codes, each its own so that scripts can tell them apart. 1: a stage failed its check.
constexpr int kExitNoGpu = 2;      // no GPU to run on; the message says what was found
constexpr int kExitUsage = 3;      // an unknown option, a missing value, or a value out of its range
constexpr int kExitCannotRun = 4;  // well-formed options that no selected stage can run (--head-dim 48)
constexpr uint64_t kSeed = 2024;
// Relative L2 error a correct fp32 stage stays under against fp64 (rounding of N-term sums).
constexpr double kFp32Tolerance = 1e-5;
// The reference costs rows * seq_kv * head_dim * 4 flops in fp64 on the host; this many rows keep
// it to a second or two while still sampling every head.
constexpr long long kReferenceRows = 2048;

struct Options {
  harness::Problem problem;
  int stage = 0;  // 0: all
  int exercise = 0;  // not 0: that exercise alone, in place of the stages
  int runs = 20;
  int smem_limit_kib = 0;  // --smem-limit; 0: what the GPU allows
  bool json = false;
  bool dtype_given = false;  // false: each stage in its first dtype
  flash::DType dtype = flash::DType::kFp32;
};

// The dtype spelled as the registry spells it, or false.
bool parse_dtype(const std::string& name, flash::DType* dtype) {
  for (flash::DType d : {flash::DType::kFp32, flash::DType::kFp16, flash::DType::kBf16})
    if (name == flash::dtype_name(d)) {
      *dtype = d;
      return true;
    }
  return false;
}


// The exercises' numbers for a message: runs of three or more consecutive numbers joined, e.g.
// "1 to 7", as registry::stage_numbers() writes the stages'.
std::string exercise_numbers() {
  const std::vector<registry::Stage>& all = registry::exercises();
  std::string list;
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

// Why the runner refuses to go on: its exit code and a one-line message naming the option and value.
struct Refusal {
  int exit_code = 0;  // 0: nothing refused
  std::string message;
};

void usage(std::FILE* to) {
  std::fprintf(to,
               "usage: flash-stages [--stage N | --exercise N] [--batch B] [--heads H] [--heads-kv H] [--seq N]\n"
               "                    [--seq-q N] [--seq-kv N] [--head-dim D] [--causal] [--dtype fp32|fp16|bf16]\n"
               "                    [--runs R] [--smem-limit K] [--json] [--list] [--help]\n"
               "Runs every stage (or one) on one problem, checks it against the previous stage and an fp64\n"
               "reference, and prints time, TFLOP/s and errors.\n"
               "\n"
               "  --stage N      run stage N only (and the stage it is checked against); --list shows them\n"
               "  --exercise N   run your version of stage N from exercises/NN_name/, checked and timed as\n"
               "                 --stage N is; stages %s have one (exercises/README.md). Built by the\n"
               "                 test command (-DFLASH_TESTS=ON) or -DFLASH_EXERCISES=ON%s\n"
               "  --batch B      independent sequences (default 4)\n"
               "  --heads H      query heads (default 16)\n"
               "  --heads-kv H   key/value heads, a divisor of --heads: H for MHA, 1 for MQA (default --heads)\n"
               "  --seq N        query and key length (default 1024); --seq-q, --seq-kv set one of them.\n"
               "                 Stage 13 (decoding) takes up to 16 query rows: --stage 13 --seq-q 1 --seq-kv 4096\n"
               "  --head-dim D   width of a head: 32, 64 or 128 (default 64)\n"
               "  --causal       bottom-right aligned causal mask (the stages that have one)\n"
               "  --dtype T      element type, fp32, fp16 or bf16: only the stages that have it run (default: each\n"
               "                 stage in its first dtype, as --list shows)\n"
               "  --runs R       timed runs per stage; the median is reported (default 20)\n"
               "  --smem-limit K shared memory per block in KiB, as if the GPU allowed no more (64: a T4, 99: an\n"
               "                 RTX 30/40 card): the stages take smaller tiles, or say they cannot run (default:\n"
               "                 what this GPU allows)\n"
               "  --json         the results, or why there are none, as JSON on stdout\n"
               "  --list         the stages, one per line: number, name, dtypes (the first is the default),\n"
               "                 head_dims, the idea it adds\n"
               "  --help         this text\n"
               "Sizes are whole numbers from 1 to %d.\n"
               "Exit codes: 0 every stage that ran passed (a stage this GPU cannot run says why in its row); 1 a\n"
               "stage failed; 2 no GPU (what was found is on stderr); 3 a bad option or value; 4 valid options\n"
               "that no selected stage can run.\n",
               exercise_numbers().c_str(), FLASH_EXERCISES_BUILT ? "" : ": not in this build", INT_MAX);
}

// s with JSON's escapes, for a message inside a JSON string.
std::string json_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

// Says why the runner stops: the message on stderr and, with --json, a JSON object on stdout.
// gpu, when given, adds what the GPU check found. Returns the exit code.
int refuse(bool json, int exit_code, const char* error, const std::string& message,
           const harness::GpuCheck* gpu = nullptr) {
  std::fprintf(stderr, "flash-stages: %s\n", message.c_str());
  if (exit_code == kExitUsage) std::fprintf(stderr, "flash-stages --help lists the options\n");
  if (json) {
    std::printf("{\"error\": \"%s\", \"message\": \"%s\", \"exit_code\": %d", error, json_escape(message).c_str(),
                exit_code);
    if (gpu)
      std::printf(", \"gpu\": {\"result\": \"%s\", \"driver_version\": %d, \"runtime_version\": %d, "
                  "\"device_count\": %d}",
                  gpu->result_name(), gpu->driver_version, gpu->runtime_version, gpu->device_count);
    std::printf("}\n");
  }
  return exit_code;
}

// An int option's value: a whole decimal number from min to INT_MAX, read with strtoll so that a
// value past int's range is refused, not truncated.
Refusal read_int(const std::string& option, const char* text, long long min, int* out) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  const std::string named = option + " " + text;
  if (end == text || *end != '\0') return {kExitUsage, named + ": not a whole number"};
  if (errno == ERANGE || v < min || v > INT_MAX)
    return {kExitUsage, named + ": out of range (" + std::to_string(min) + " to " + std::to_string(INT_MAX) + ")"};
  *out = static_cast<int>(v);
  return {};
}

// Reads the command line into opt; --help and --list are answered here. Only the form of each
// value is checked; validate() checks what they mean together.
Refusal parse(int argc, char** argv, Options* opt) {
  harness::Problem& p = opt->problem;
  p.batch = 4;
  p.heads_q = 16;
  p.heads_kv = 0;  // 0: same as heads_q
  p.seq_q = p.seq_kv = 1024;
  p.head_dim = 64;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    auto value = [&](int* out) -> Refusal {
      if (!has_value) return {kExitUsage, a + ": needs a value"};
      return read_int(a, argv[++i], 1, out);
    };
    Refusal r;
    if (a == "--stage") r = value(&opt->stage);
    else if (a == "--exercise") r = value(&opt->exercise);
    else if (a == "--batch") r = value(&p.batch);
    else if (a == "--heads") r = value(&p.heads_q);
    else if (a == "--heads-kv") r = value(&p.heads_kv);
    else if (a == "--seq") { r = value(&p.seq_q); p.seq_kv = p.seq_q; }
    else if (a == "--seq-q") r = value(&p.seq_q);
    else if (a == "--seq-kv") r = value(&p.seq_kv);
    else if (a == "--head-dim") r = value(&p.head_dim);
    else if (a == "--runs") r = value(&opt->runs);
    else if (a == "--smem-limit") r = value(&opt->smem_limit_kib);
    else if (a == "--causal") p.causal = true;
    else if (a == "--json") opt->json = true;
    else if (a == "--dtype") {
      if (!has_value) r = {kExitUsage, a + ": needs a value"};
      else if (!parse_dtype(argv[++i], &opt->dtype)) r = {kExitUsage, a + " " + argv[i] + ": not fp32, fp16 or bf16"};
      opt->dtype_given = true;
    }
    else if (a == "--list") {
      // The number and name lead each line: scripts/device/gpu_check.sh reads them.
      for (const registry::Stage& s : registry::stages()) {
        std::string dims;
        for (int d : s.head_dims) dims += (dims.empty() ? "" : ",") + std::to_string(d);
        std::printf("%02d  %-16s %-10s head_dim %-10s %s\n", s.number, s.name, s.dtype_list().c_str(), dims.c_str(),
                    s.lesson);
      }
      std::exit(0);
    }
    else if (a == "--help" || a == "-h") { usage(stdout); std::exit(0); }
    else r = {kExitUsage, "unknown option '" + a + "'"};
    if (r.exit_code) return r;
  }
  if (p.heads_kv == 0) p.heads_kv = p.heads_q;
  return {};
}

// The values together: a stage that exists, heads that divide, sizes the stages can index, a dtype
// the runner has, and a problem at least one selected stage supports.
Refusal validate(const Options& opt) {
  harness::Problem p = opt.problem;
  if (opt.dtype_given) p.dtype = opt.dtype;
  const std::vector<registry::Stage>& all = opt.exercise != 0 ? registry::exercises() : registry::stages();
  // What the messages call the selection: "stage 3" or "exercise 3".
  const std::string selected = opt.exercise != 0 ? "exercise " + std::to_string(opt.exercise)
                                                 : "stage " + std::to_string(opt.stage);
  const int number = opt.exercise != 0 ? opt.exercise : opt.stage;
  if (opt.exercise != 0 && opt.stage != 0)
    return {kExitUsage, "--stage " + std::to_string(opt.stage) + " --exercise " + std::to_string(opt.exercise) +
                            ": one or the other"};
  if (opt.stage != 0 && !registry::find(opt.stage))
    return {kExitUsage, "--stage " + std::to_string(opt.stage) + ": no such stage (" + registry::stage_numbers() +
                            "; --list shows them)"};
  if (opt.exercise != 0 && !FLASH_EXERCISES_BUILT)
    return {kExitCannotRun, "--exercise " + std::to_string(opt.exercise) +
                                ": the exercises are not in this build; configure it with -DFLASH_TESTS=ON "
                                "(the tests) or -DFLASH_EXERCISES=ON and build again"};
  if (opt.exercise != 0 && !registry::find_exercise(opt.exercise))
    return {kExitUsage, "--exercise " + std::to_string(opt.exercise) + ": no such exercise (" + exercise_numbers() +
                            "; exercises/README.md lists them)"};
  if (p.heads_q % p.heads_kv != 0)
    return {kExitUsage, "--heads-kv " + std::to_string(p.heads_kv) + ": must divide --heads " +
                            std::to_string(p.heads_q)};
  const long long rows_q = static_cast<long long>(p.batch) * p.heads_q * p.seq_q;
  const long long rows_kv = static_cast<long long>(p.batch) * p.heads_kv * p.seq_kv;
  if (std::max(rows_q, rows_kv) > flash::kMaxDim)
    return {kExitCannotRun, "--batch " + std::to_string(p.batch) + " --heads " + std::to_string(p.heads_q) +
                                " --seq-q " + std::to_string(p.seq_q) + " --seq-kv " + std::to_string(p.seq_kv) +
                                ": " + std::to_string(std::max(rows_q, rows_kv)) +
                                " rows, more than the stages index (" + std::to_string(flash::kMaxDim) + ")"};

  // The problem against the stages that would run: one stage (or exercise) when it is named, else any.
  std::vector<int> head_dims;
  const registry::Stage* decoding = nullptr;  // a stage that would run it with fewer query rows
  for (const registry::Stage& s : all) {
    if (number != 0 && s.number != number) continue;
    const harness::Problem own = opt.dtype_given ? p : s.in_own_dtype(p);
    if (s.supports(own)) return {};
    if (opt.dtype_given && !s.has_dtype(opt.dtype)) continue;  // named below if no stage is left
    for (int d : s.head_dims)
      if (std::find(head_dims.begin(), head_dims.end(), d) == head_dims.end()) head_dims.push_back(d);
    harness::Problem one_row = own;
    one_row.seq_q = 1;
    if (s.max_seq_q != 0 && p.seq_q > s.max_seq_q && s.supports(one_row)) decoding = &s;
  }
  if (head_dims.empty())
    return {kExitCannotRun, std::string("--dtype ") + flash::dtype_name(opt.dtype) + ": " +
                                (number != 0 ? selected + " does not have it" : std::string("no stage has it"))};
  std::sort(head_dims.begin(), head_dims.end());
  if (std::find(head_dims.begin(), head_dims.end(), p.head_dim) == head_dims.end()) {
    std::string list;
    for (int d : head_dims) list += (list.empty() ? "" : ", ") + std::to_string(d);
    const std::string who = number != 0 ? selected + " does not support it" : std::string("no stage supports it");
    return {kExitCannotRun, "--head-dim " + std::to_string(p.head_dim) + ": " + who + " (head_dim: " + list + ")"};
  }
  if (decoding)
    return {kExitCannotRun, "--seq-q " + std::to_string(p.seq_q) + ": " + selected + " takes at most " +
                                std::to_string(decoding->max_seq_q) +
                                " query rows, it is a decoding stage (try --seq-q 1 --seq-kv 4096)"};
  // The head_dim and seq_q are fine, so --causal is what the stage lacks.
  std::string causal_stages;
  for (const registry::Stage& s : all)
    if (s.causal) causal_stages += (causal_stages.empty() ? "" : ", ") + std::to_string(s.number);
  return {kExitCannotRun, "--causal: " + selected + " has no causal mask (stages with one: " + causal_stages + ")"};
}

// Why a stage does not run the problem when it does not, or "" when it does: the dtype, head_dim or
// causal mask it lacks, or the query rows past a decoding stage's limit.
std::string skip_reason(const registry::Stage& s, const harness::Problem& p) {
  if (s.supports(p)) return "";
  harness::Problem one_row = p;
  one_row.seq_q = 1;
  if (s.max_seq_q != 0 && p.seq_q > s.max_seq_q && s.supports(one_row))
    return "not run: seq_q " + std::to_string(p.seq_q) + " > " + std::to_string(s.max_seq_q) +
           ", a decoding stage (flash-stages --stage " + std::to_string(s.number) + " --seq-q 1 --seq-kv 4096)";
  return "not supported";
}

struct Row {
  const registry::Stage* stage = nullptr;
  bool skipped = false;       // the stage does not take this problem (status says why)
  std::string status = "ok";  // "ok", or why it did not run
  double ms = 0, min_ms = 0, tflops = 0, speedup = 0;  // ms: median; min_ms shows the spread
  harness::ErrorStats vs_prev, vs_ref;
  int prev = 0;
  flash::DType dtype = flash::DType::kFp32;
  size_t workspace = 0;
  bool pass = false;
  bool gpu_cannot_run = false;  // refused for this GPU (too old, too little shared memory): said, not failed
};

}  // namespace

// Runs the stages on the checked options and prints the table or the JSON. Returns 0 when every
// selected stage that ran passed, else 1.
static int run(const Options& opt) {
  const harness::Problem& p = opt.problem;
  // The tensors must fit on the GPU: q, k, v and d_out, and o and lse twice (checked, timed).
  size_t gpu_free = 0, gpu_total = 0;
  harness::cuda_check(cudaMemGetInfo(&gpu_free, &gpu_total), "cudaMemGetInfo");
  const double tensor_bytes = sizeof(float) * (4.0 * p.q_elems() + 2.0 * p.kv_elems() + 2.0 * p.rows());
  if (tensor_bytes > static_cast<double>(gpu_free)) {
    char msg[256];
    std::snprintf(msg, sizeof msg, "%s: its tensors need %.1f GiB of GPU memory, %.1f GiB are free",
                  p.describe().c_str(), tensor_bytes / (1 << 30), static_cast<double>(gpu_free) / (1 << 30));
    return refuse(opt.json, kExitCannotRun, "cannot_run", msg);
  }
  // Inputs, device copies and reference rows per dtype: a half stage reads inputs rounded to its
  // dtype, and the stage before it and the reference see exactly those numbers.
  struct DtypeData {
    harness::Problem problem;
    harness::HostInputs host;
    std::unique_ptr<harness::DeviceInputs> dev;
  };
  std::map<flash::DType, DtypeData> by_dtype;
  auto data_for = [&](flash::DType dtype) -> DtypeData& {
    auto it = by_dtype.find(dtype);
    if (it != by_dtype.end()) return it->second;
    DtypeData d;
    d.problem = opt.problem;
    d.problem.dtype = dtype;
    d.host = harness::make_inputs(d.problem, kSeed);
    d.dev = std::make_unique<harness::DeviceInputs>(d.host, dtype);
    return by_dtype.emplace(dtype, std::move(d)).first->second;
  };
  const std::vector<long long> ref_rows = harness::sample_rows(opt.problem.rows(), kReferenceRows);

  std::vector<Row> rows;
  double baseline_ms = 0;
  bool all_pass = true;
  const std::vector<registry::Stage>& entries = opt.exercise != 0 ? registry::exercises() : registry::stages();
  const int number = opt.exercise != 0 ? opt.exercise : opt.stage;
  for (const registry::Stage& s : entries) {
    const bool selected = number == 0 || s.number == number;
    if (!selected) continue;
    const flash::DType dtype = opt.dtype_given ? opt.dtype : s.dtypes.front();
    Row row;
    row.stage = &s;
    row.dtype = dtype;
    DtypeData& data = data_for(dtype);
    const harness::Problem& p = data.problem;
    row.workspace = s.workspace_bytes(p);
    if (!s.supports(p)) {
      row.status = skip_reason(s, p);
      row.skipped = true;
    } else {
      size_t free_bytes = 0, total_bytes = 0;
      harness::cuda_check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
      if (row.workspace > free_bytes / 2) {
        row.status = "workspace does not fit";
      } else {
        const registry::ForwardResult r = registry::run_forward(s, p, *data.dev);
        if (!r.status.ok()) {
          row.status = flash::to_string(r.status);
          row.gpu_cannot_run = r.status.code == flash::StatusCode::kArchNotSupported ||
                               r.status.code == flash::StatusCode::kSharedMemoryTooSmall;
        } else {
          const std::vector<float> got = harness::gather_rows(r.o, ref_rows, p.head_dim);
          bool ref_ok = false;
          if (dtype == flash::DType::kFp32) {
            row.vs_ref = harness::compare(got, reference::forward_rows(p, data.host, ref_rows).o);
            ref_ok = row.vs_ref.within(kFp32Tolerance);
          } else {
            const reference::HalfPrecisionCheck check = reference::check_half_precision(p, data.host, ref_rows, got);
            row.vs_ref = check.error;
            ref_ok = check.passes();
          }
          double prev_tolerance = kFp32Tolerance;
          if (const registry::Stage* prev = registry::previous(s, p)) {
            // The previous stage on the same rounded inputs, in its own dtype when it lacks this one.
            const registry::ForwardResult before = registry::run_forward(*prev, p, data.host);
            if (before.status.ok()) {
              row.prev = prev->number;
              row.vs_prev = harness::compare(r.o, before.o);
              prev_tolerance = harness::agreement_tolerance(dtype, prev->in_own_dtype(p).dtype);
            }
          }
          harness::DeviceTensor o(dtype, static_cast<size_t>(p.q_elems()));
          harness::DeviceBuffer<float> lse(p.rows());
          harness::DeviceBuffer<unsigned char> ws(row.workspace);
          const harness::DeviceInputs& dev = *data.dev;
          const harness::Timing t = harness::time_cuda(
              [&] {
                s.forward(dev.q.get(), dev.k.get(), dev.v.get(), o.get(), lse.get(), p.batch, p.heads_q, p.heads_kv,
                          p.seq_q, p.seq_kv, p.head_dim, p.softmax_scale(), p.causal, p.dtype, ws.get(), ws.bytes(),
                          nullptr);
              },
              /*warmup=*/3, opt.runs);
          row.ms = t.median_ms;
          row.min_ms = t.min_ms;
          row.tflops = harness::forward_flops(p) / (t.median_ms * 1e-3) / 1e12;
          if (s.number == 1 && !s.is_exercise()) baseline_ms = t.median_ms;
          row.speedup = baseline_ms > 0 ? baseline_ms / t.median_ms : 0;
          row.pass = ref_ok && (row.prev == 0 || row.vs_prev.within(prev_tolerance));
        }
      }
    }
    if (row.status == "ok" && !row.pass) all_pass = false;
    if (row.status != "ok" && !row.skipped && row.status != "workspace does not fit" && !row.gpu_cannot_run)
      all_pass = false;
    rows.push_back(row);
  }

  if (opt.json) {
    std::printf("{\"problem\": {\"batch\": %d, \"heads_q\": %d, \"heads_kv\": %d, \"seq_q\": %d, \"seq_kv\": %d, "
                "\"head_dim\": %d, \"causal\": %s},\n \"smem_limit_kib\": %d,\n \"stages\": [\n",
                p.batch, p.heads_q, p.heads_kv, p.seq_q, p.seq_kv, p.head_dim, p.causal ? "true" : "false",
                opt.smem_limit_kib);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf("  {\"stage\": %d, \"exercise\": %s, \"name\": \"%s\", \"dtype\": \"%s\", \"status\": \"%s\", \"ms\": %.6g, \"min_ms\": %.6g, "
                  "\"runs\": %d, \"tflops\": %.6g, "
                  "\"speedup_vs_01\": %.6g, \"previous\": %d, \"rel_l2_vs_previous\": %.6g, "
                  "\"rel_l2_vs_reference\": %.6g, \"max_abs_vs_reference\": %.6g, \"workspace_bytes\": %zu, "
                  "\"pass\": %s}%s\n",
                  r.stage->number, r.stage->is_exercise() ? "true" : "false", r.stage->name, flash::dtype_name(r.dtype), json_escape(r.status).c_str(), r.ms, r.min_ms, opt.runs, r.tflops, r.speedup, r.prev,
                  r.vs_prev.rel_l2, r.vs_ref.rel_l2, r.vs_ref.max_abs, r.workspace, r.pass ? "true" : "false",
                  i + 1 < rows.size() ? "," : "");
    }
    std::printf(" ]}\n");
  } else {
    cudaDeviceProp prop;
    harness::cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    std::string described = p.describe();  // the dtype is per stage, in its own column
    described = described.substr(0, described.rfind(" dtype="));
    std::printf("%s | %s | reference rows checked: %zu of %lld", prop.name, described.c_str(), ref_rows.size(),
                p.rows());
    if (opt.smem_limit_kib != 0) std::printf(" | shared memory per block: %d KiB (--smem-limit)", opt.smem_limit_kib);
    std::printf("\n\n");
    std::printf("%-5s %-16s %-5s %10s %9s %9s %-18s %-12s %14s  %s\n", "stage", "name", "dtype", "time_ms", "TFLOP/s",
                "speedup", "err_vs_prev", "err_vs_ref", "workspace_B", "check");
    for (const Row& r : rows) {
      // The first column: the stage's number, or "ex05" for an exercise.
      char number[8];
      std::snprintf(number, sizeof number, r.stage->is_exercise() ? "ex%02d" : "%d", r.stage->number);
      if (r.status != "ok") {
        std::printf("%-5s %-16s %-5s %s\n", number, r.stage->name, flash::dtype_name(r.dtype), r.status.c_str());
        continue;
      }
      char prev[32] = "-";
      if (r.prev) std::snprintf(prev, sizeof prev, "%.1e (vs %02d)", r.vs_prev.rel_l2, r.prev);
      char speedup[16] = "-";  // stage 01 did not run (--stage N)
      if (r.speedup > 0) std::snprintf(speedup, sizeof speedup, "%.1fx", r.speedup);
      std::printf("%-5s %-16s %-5s %10.3f %9.2f %9s %-18s %-12.1e %14zu  %s\n", number, r.stage->name,
                  flash::dtype_name(r.dtype), r.ms, r.tflops, speedup, prev, r.vs_ref.rel_l2, r.workspace, r.pass ? "PASS" : "FAIL");
    }
    // An exercise: what its result means and where to go next.
    for (const Row& r : rows) {
      const registry::Stage& e = *r.stage;
      if (!e.is_exercise() || r.status != "ok") continue;
      if (!r.pass)
        std::printf("\nexercise %02d: FAIL: fill in the TODO(exercise) lines of %s (lesson: stages/%s/README.md);\n"
                    "ctest --test-dir build -L exercise%02d --output-on-failure says where it differs\n",
                    e.number, e.exercise_file, e.folder, e.number);
      else if (e.backward) {
        // The stage whose forward this is: the first with it (07's own; 10's for 11, 12's for 14).
        int forward_stage = e.number;
        for (const registry::Stage& s : registry::stages())
          if (s.forward == e.forward) {
            forward_stage = s.number;
            break;
          }
        std::printf("\nexercise %02d: this checks the forward only, which is stage %02d's; your backward in %s is\n"
                    "checked by ctest --test-dir build -L exercise%02d\n",
                    e.number, forward_stage, e.exercise_file, e.number);
      }
      else if (e.causal && !p.causal)
        std::printf("\nexercise %02d: PASS without the causal mask your lines are about; run it with --causal\n",
                    e.number);
      else
        std::printf("\nexercise %02d: PASS; compare its time with flash-stages --stage %d, then run\n"
                    "ctest --test-dir build -L exercise%02d for the whole test sweep\n",
                    e.number, e.number, e.number);
    }
  }
  return all_pass ? 0 : 1;
}

int main(int argc, char** argv) {
  // --json decides how a refusal is written, wherever it stands on the command line.
  bool json = false;
  for (int i = 1; i < argc; ++i) json = json || std::strcmp(argv[i], "--json") == 0;
  Options opt;
  Refusal r = parse(argc, argv, &opt);
  if (!r.exit_code) r = validate(opt);
  if (r.exit_code) return refuse(json, r.exit_code, r.exit_code == kExitUsage ? "usage" : "cannot_run", r.message);
  const harness::GpuCheck gpu = harness::check_gpu();
  if (gpu.result != harness::GpuCheck::Result::kOk)
    return refuse(json, kExitNoGpu, "no_gpu", gpu.message + "; the stages need an NVIDIA GPU to run", &gpu);
  if (opt.smem_limit_kib != 0) flash::set_shared_memory_limit(static_cast<size_t>(opt.smem_limit_kib) * 1024);
  try {
    return run(opt);
  } catch (const std::exception& e) {
    // What the checks cannot foresee: host memory for a very large problem, a CUDA failure outside
    // a stage. Said in one line, not as an uncaught exception.
    std::fprintf(stderr, "flash-stages: %s\n", e.what());
    return 1;
  }
}
