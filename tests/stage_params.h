// Parameterizing GoogleTest suites over the registry's stages and exercises, shared by the
// validation and GPU suites. Test names carry "stageNN" (an exercise: "exerciseNN") so that ctest's
// per-stage and per-exercise entries can filter on it.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "registry.h"

namespace stage_params {

// Which sweep the GPU tests run, decided when the tests are registered: the exhaustive one where the
// environment has FLASH_TEST_SWEEP=full (the gpu_stageNN_*_full ctest entries set it, tests/CMakeLists.txt),
// else the default one, shapes chosen to reach each stage's code paths in minutes for the whole course.
// Test names are the same in both, the default's cases a subset of the full sweep's.
inline bool full_sweep() {
  const char* sweep = std::getenv("FLASH_TEST_SWEEP");
  return sweep != nullptr && std::strcmp(sweep, "full") == 0;
}

// Every entry the tests run: the stages in course order, then the exercises.
inline std::vector<const registry::Stage*> stages_and_exercises() {
  std::vector<const registry::Stage*> all;
  for (const registry::Stage& s : registry::stages()) all.push_back(&s);
  for (const registry::Stage& s : registry::exercises()) all.push_back(&s);
  return all;
}

// The registry's stages and exercises that `keep` accepts, in that order.
inline std::vector<registry::Stage> stages_where(bool (*keep)(const registry::Stage&)) {
  std::vector<registry::Stage> kept;
  for (const registry::Stage* s : stages_and_exercises())
    if (keep(*s)) kept.push_back(*s);
  return kept;
}

// "stage05" for stage 5: the test-name suffix the per-stage ctest entries filter on.
inline std::string label(int number) { return std::string("stage") + (number < 10 ? "0" : "") + std::to_string(number); }

inline std::string stage_label(const ::testing::TestParamInfo<registry::Stage>& info) { return info.param.label(); }

// For an exercise, where a failure sends the learner: " - see TODO(exercise) in <its file>". Empty for a stage.
inline std::string see_todo(const registry::Stage& s) {
  return s.is_exercise() ? std::string(" - see TODO(exercise) in ") + s.exercise_file : std::string();
}

// For an exercise, what a failure message starts with: "exercise 05: ". Empty for a stage.
inline std::string exercise_prefix(const registry::Stage& s) {
  return s.is_exercise() ? "exercise " + std::string(s.number < 10 ? "0" : "") + std::to_string(s.number) + ": "
                         : std::string();
}

}  // namespace stage_params
