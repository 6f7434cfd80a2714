// skip_summary: after every ctest run (CTEST_CUSTOM_POST_TEST, see tests/CMakeLists.txt), one line
// per skipped test saying why it was skipped.
//
// ctest reports a skipped test as "***Skipped" and keeps its output to itself unless run with -V,
// where the reason then comes once per test case: hundreds of identical lines for the GPU sweep.
// The reason is in ctest's log of the run, so this reads it back: for each test whose pass reason
// is "Skip regular expression found", the first line of its output that gives a reason. Host code
// only, standard library only; it must never fail the run, so it always exits 0.
//
//   skip_summary <build>/Testing/Temporary <stamp touched before the run>
//
// Which file holds this run's log: while the post-test command runs, ctest is still writing
// LastTest.log under a temporary name (LastTest.log.tmp in CMake 3.25) and renames it after. So the
// newest LastTest.log* file in the folder is read, and only when it was written after the stamp:
// ctest also runs the command when it ran no test (ctest -N), and then there is no log of this run.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The reason a test's output gives for skipping, or "" when it gives none we recognise. Three
// forms, one per kind of test in this project:
//   GoogleTest's GTEST_SKIP() << why:   "<file>:<line>: Skipped" and then `why` on the next line;
//   pytest -rs's short summary:         "SKIPPED [3] test_forward.py:21: why";
//   tests/python/run_pytest.py:         "flash_stages Python tests not run: why".
std::string reason_in(const std::vector<std::string>& output) {
  for (size_t i = 0; i < output.size(); ++i) {
    const std::string& line = output[i];
    if (ends_with(line, ": Skipped") && i + 1 < output.size() && !output[i + 1].empty()) return output[i + 1];
    if (starts_with(line, "SKIPPED [")) {
      // Past "SKIPPED [N] file:line: ", the reason itself.
      const size_t bracket = line.find("] ");
      const size_t colon = line.find(": ", bracket == std::string::npos ? 0 : bracket + 2);
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
    const std::string not_run = "Python tests not run: ";
    const size_t at = line.find(not_run);
    if (at != std::string::npos) return line.substr(at + not_run.size());
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: skip_summary <build>/Testing/Temporary <stamp>\n");
    return 0;
  }
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::file_time_type stamp_time = fs::last_write_time(argv[2], error);
  if (error) return 0;
  fs::path newest;
  fs::file_time_type newest_time = stamp_time;
  for (const fs::directory_entry& entry : fs::directory_iterator(argv[1], error)) {
    const std::string name = entry.path().filename().string();
    if (!starts_with(name, "LastTest.log") && !starts_with(name, "LastTest_")) continue;
    const fs::file_time_type t = entry.last_write_time(error);
    if (!error && t >= newest_time) {
      newest = entry.path();
      newest_time = t;
    }
  }
  if (newest.empty()) return 0;  // no log of this run: nothing to say
  std::ifstream log(newest);
  if (!log) return 0;

  // The log holds one block per test: "N/M Test: <name>", the command, "Output:", a rule, the
  // output, "<end of output>", then ctest's verdict, e.g. "Skip regular expression found in output".
  struct Skipped {
    std::string test, reason;
  };
  std::vector<Skipped> skipped;
  std::string line, test;
  std::vector<std::string> output;
  bool in_output = false;
  while (std::getline(log, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t test_at = line.find(" Test: ");
    if (!in_output && test_at != std::string::npos && line.find('/') < test_at) {
      test = line.substr(test_at + 7);
      output.clear();
    } else if (!in_output && line == "Output:") {
      in_output = true;
      std::getline(log, line);  // the rule under "Output:"
    } else if (in_output && line == "<end of output>") {
      in_output = false;
    } else if (in_output) {
      output.push_back(line);
    } else if (starts_with(line, "Skip regular expression found in output")) {
      skipped.push_back({test, reason_in(output)});
    }
  }
  if (skipped.empty()) return 0;

  size_t width = 0;
  for (const Skipped& s : skipped) width = s.test.size() > width ? s.test.size() : width;
  std::printf("\nWhy they were skipped:\n");
  for (const Skipped& s : skipped) {
    const std::string why = s.reason.empty() ? "(the output gives no reason; ctest -V -R " + s.test + " shows it all)"
                                             : s.reason;
    std::printf("  %-*s  %s\n", static_cast<int>(width), s.test.c_str(), why.c_str());
  }
  return 0;
}
