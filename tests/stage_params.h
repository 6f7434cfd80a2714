// Parameterizing GoogleTest suites over the registry's stages, shared by the validation and GPU
// suites. Test names carry "stageNN" so that ctest's per-stage entries can filter on it.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "registry.h"

namespace stage_params {

// The registry's stages that `keep` accepts, in course order.
inline std::vector<registry::Stage> stages_where(bool (*keep)(const registry::Stage&)) {
  std::vector<registry::Stage> kept;
  for (const registry::Stage& s : registry::stages())
    if (keep(s)) kept.push_back(s);
  return kept;
}

// "stage05" for stage 5: the test-name suffix the per-stage ctest entries filter on.
inline std::string label(int number) { return std::string("stage") + (number < 10 ? "0" : "") + std::to_string(number); }

inline std::string stage_label(const ::testing::TestParamInfo<registry::Stage>& info) { return label(info.param.number); }

}  // namespace stage_params
