// The course runner's command line, tested by running the real binary: every bad option is refused
// before the runner looks for a GPU, with a message naming the option and its value and the exit
// code the usage text promises. CPU only; the last test hides any GPU so it runs the same anywhere.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace {

// What one run of the runner gave back.
struct Result {
  int exit_code = -1;
  std::string out;  // stdout, or stdout and stderr together when asked for
};

// Runs `env flash-stages args` through the shell. merge_stderr: stderr into out (the messages);
// otherwise stderr is dropped and out is what a script would parse.
Result runner(const std::string& args, bool merge_stderr = true, const std::string& env = "") {
  const std::string cmd = env + " \"" FLASH_RUNNER_PATH "\" " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  Result r;
  std::FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

constexpr int kExitNoGpu = 2;
constexpr int kExitUsage = 3;
constexpr int kExitCannotRun = 4;

// A refused command line: its exit code, and the text the message must contain (the option and
// the value it was given).
struct Refused {
  const char* args;
  int exit_code;
  const char* message;
};

// How GoogleTest prints a case in a failure message.
void PrintTo(const Refused& r, std::ostream* os) { *os << "flash-stages " << r.args; }

class RefusedArgs : public ::testing::TestWithParam<Refused> {};

TEST_P(RefusedArgs, NamesTheOptionAndValueAndExitsWithItsCode) {
  const Refused& c = GetParam();
  const Result r = runner(c.args);
  EXPECT_EQ(r.exit_code, c.exit_code) << r.out;
  EXPECT_NE(r.out.find(c.message), std::string::npos) << "expected \"" << c.message << "\" in:\n" << r.out;
  // Refused before any work: no table, no GPU check.
  EXPECT_EQ(r.out.find("stage name"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("NVIDIA"), std::string::npos) << r.out;
}

INSTANTIATE_TEST_SUITE_P(
    Runner, RefusedArgs,
    ::testing::Values(
        // Sizes: not numbers, zero, negative, past int (refused, not truncated).
        Refused{"--batch -1", kExitUsage, "--batch -1: out of range"},
        Refused{"--batch 0", kExitUsage, "--batch 0: out of range"},
        Refused{"--batch 99999999999", kExitUsage, "--batch 99999999999: out of range"},
        Refused{"--heads 2147483648", kExitUsage, "--heads 2147483648: out of range"},
        Refused{"--seq abc", kExitUsage, "--seq abc: not a whole number"},
        Refused{"--seq-q 12x", kExitUsage, "--seq-q 12x: not a whole number"},
        Refused{"--seq-kv ''", kExitUsage, "--seq-kv : not a whole number"},
        Refused{"--head-dim 1.5", kExitUsage, "--head-dim 1.5: not a whole number"},
        Refused{"--runs 0", kExitUsage, "--runs 0: out of range"},
        Refused{"--stage -3", kExitUsage, "--stage -3: out of range"},
        Refused{"--smem-limit 0", kExitUsage, "--smem-limit 0: out of range (1 to 2147483647)"},
        Refused{"--smem-limit -64", kExitUsage, "--smem-limit -64: out of range"},
        Refused{"--smem-limit 64k", kExitUsage, "--smem-limit 64k: not a whole number"},
        Refused{"--smem-limit 99999999999", kExitUsage, "--smem-limit 99999999999: out of range"},
        // Values that parse but mean nothing.
        Refused{"--stage 99", kExitUsage, "--stage 99: no such stage"},
        Refused{"--heads 16 --heads-kv 3", kExitUsage, "--heads-kv 3: must divide --heads 16"},
        Refused{"--heads 4 --heads-kv 8", kExitUsage, "--heads-kv 8: must divide --heads 4"},
        // The form of the command line.
        Refused{"--seq", kExitUsage, "--seq: needs a value"},
        Refused{"--dtype", kExitUsage, "--dtype: needs a value"},
        Refused{"--smem-limit", kExitUsage, "--smem-limit: needs a value"},
        Refused{"--frobnicate", kExitUsage, "unknown option '--frobnicate'"},
        Refused{"1024", kExitUsage, "unknown option '1024'"},
        // Well-formed, but no selected stage can run it.
        Refused{"--head-dim 48", kExitCannotRun, "--head-dim 48: no stage supports it"},
        Refused{"--stage 2 --head-dim 256", kExitCannotRun, "--head-dim 256: stage 2 does not support it"},
        Refused{"--stage 3 --causal", kExitCannotRun, "--causal: stage 3 has no causal mask"},
        // The decoding stage takes up to 16 query rows; the default problem has 1024.
        Refused{"--stage 13", kExitCannotRun, "--seq-q 1024: stage 13 takes at most 16 query rows"},
        Refused{"--stage 13 --seq-q 17 --seq-kv 4096", kExitCannotRun, "--seq-q 17: stage 13 takes at most 16"},
        Refused{"--stage 13 --seq-q 1 --head-dim 32", kExitCannotRun,
                "--head-dim 32: stage 13 does not support it (head_dim: 64, 128)"},
        Refused{"--stage 13 --seq-q 1 --dtype fp32", kExitCannotRun, "--dtype fp32: stage 13 does not have it"},
        Refused{"--dtype fp64", kExitUsage, "--dtype fp64: not fp32, fp16 or bf16"},
        Refused{"--dtype fp16 --stage 3", kExitCannotRun, "--dtype fp16: stage 3 does not have it"},
        Refused{"--dtype fp32 --stage 8", kExitCannotRun, "--dtype fp32: stage 8 does not have it"},
        Refused{"--batch 2147483647 --heads 2", kExitCannotRun, "more than the stages index"},
        // Exercises: one of the stages that have one, alone, held to what its stage accepts. The
        // tests' build compiles them into the registry (CMakeLists.txt: FLASH_EXERCISES_BUILT).
        Refused{"--exercise 0", kExitUsage, "--exercise 0: out of range"},
        Refused{"--exercise 15", kExitUsage, "--exercise 15: no such exercise (1 to "},
        Refused{"--exercise 3 --stage 2", kExitUsage, "--stage 2 --exercise 3: one or the other"},
        Refused{"--exercise 3 --causal", kExitCannotRun, "--causal: exercise 3 has no causal mask"},
        Refused{"--exercise 5 --head-dim 48", kExitCannotRun, "--head-dim 48: exercise 5 does not support it"},
        Refused{"--exercise 5 --dtype bf16", kExitCannotRun, "--dtype bf16: exercise 5 does not have it"}));

TEST(Runner, HelpDocumentsEveryOptionAndTheExitCodes) {
  const Result r = runner("--help", /*merge_stderr=*/false);
  EXPECT_EQ(r.exit_code, 0);
  for (const char* option : {"--stage", "--exercise", "--batch", "--heads", "--heads-kv", "--seq", "--seq-q", "--seq-kv",
                             "--head-dim", "--causal", "--dtype", "--runs", "--smem-limit", "--json", "--list",
                             "--help"})
    EXPECT_NE(r.out.find(option), std::string::npos) << option << " missing from --help:\n" << r.out;
  EXPECT_NE(r.out.find("Exit codes"), std::string::npos) << r.out;
}

TEST(Runner, ListNeedsNoGpu) {
  const Result r = runner("--list", /*merge_stderr=*/false);
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.rfind("01  naive", 0), 0u) << r.out;
  // Stages only, one per line: scripts/device/gpu_check.sh runs each number it lists with --stage.
  EXPECT_EQ(r.out.find("exercise"), std::string::npos) << r.out;
  // Each line names the stage's dtypes, its default first, and its head_dims.
  EXPECT_NE(r.out.find("\n03  online softmax   fp32       head_dim 32,64,128 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n12  hopper           bf16,fp16  head_dim 64,128 "), std::string::npos) << r.out;
}

TEST(Runner, RefusalsAreJsonWithJson) {
  // --json counts wherever it stands, also after the bad option.
  const Result r = runner("--batch -1 --json", /*merge_stderr=*/false);
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_EQ(r.out, "{\"error\": \"usage\", \"message\": \"--batch -1: out of range (1 to 2147483647)\", "
                   "\"exit_code\": 3}\n");
}

TEST(Runner, WithoutAGpuSaysWhatItFoundOnStderrAndInJson) {
  // CUDA_VISIBLE_DEVICES=-1 hides every GPU: on a GPU machine this is "no device", here it may be
  // "no driver"; either way exit 2 and the finding by name.
  const std::string hide = "CUDA_VISIBLE_DEVICES=-1";
  const Result text = runner("--seq 16", /*merge_stderr=*/true, hide);
  EXPECT_EQ(text.exit_code, kExitNoGpu) << text.out;
  EXPECT_TRUE(text.out.find("no NVIDIA driver") != std::string::npos ||
              text.out.find("no CUDA device") != std::string::npos)
      << text.out;
  EXPECT_EQ(text.out.find("insufficient"), std::string::npos) << "CUDA's own misleading message:\n" << text.out;

  const Result json = runner("--seq 16 --json", /*merge_stderr=*/false, hide);
  EXPECT_EQ(json.exit_code, kExitNoGpu);
  EXPECT_EQ(json.out.rfind("{\"error\": \"no_gpu\"", 0), 0u) << json.out;
  EXPECT_TRUE(json.out.find("\"result\": \"no_driver\"") != std::string::npos ||
              json.out.find("\"result\": \"no_device\"") != std::string::npos)
      << json.out;
  EXPECT_NE(json.out.find("\"runtime_version\": "), std::string::npos) << json.out;
}

}  // namespace
