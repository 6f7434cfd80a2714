#!/usr/bin/env bash
# CI: the README's "Copy a stage into your own project", run as written, in a scratch folder that
# holds only a copy of stages/ and common/ (what a learner's clone has there). The section's code
# blocks are taken from README.md itself, so the recipe cannot drift from what this checks:
#   1st sh block   make my_project/ and copy the stage and flash_stage.cuh into it;
#   cpp block      my_project/main.cpp;
#   2nd sh block   compile, link and run.
# Linking needs no GPU. Running does: without one the program must say so and exit 2.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

section=$(awk '/^## Copy a stage into your own project/ { on = 1; next } /^## / { on = 0 } on' "$repo/README.md")
# block LANG N: the body of the N-th fenced block of language LANG in the section.
block() {
  awk -v lang="$1" -v want="$2" '
    /^```/ { if (fence) { fence = 0; take = 0 } else { fence = 1; if ($0 == "```" lang && ++n == want) take = 1 }; next }
    take' <<<"$section"
}
copy=$(block sh 1)
main=$(block cpp 1)
build=$(block sh 2)
for part in copy main build; do
  [ -n "${!part}" ] || { echo "copy_stage: README's recipe has no '$part' block"; exit 1; }
done

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cp -r "$repo/stages" "$repo/common" "$scratch/"
cd "$scratch"

bash -euo pipefail -c "$copy"
printf '%s\n' "$main" > my_project/main.cpp
set +e
bash -euo pipefail -c "$build" > run.log 2>&1
rc=$?
set -e
cat run.log
if [ $rc -eq 0 ]; then
  grep -q "stage05::forward: success" run.log
elif [ $rc -eq 2 ] && [ -x my_project/attention_demo ] && grep -q "no GPU to run on" run.log; then
  echo "copy_stage: compiled and linked; no GPU here to run it"
else
  echo "copy_stage: the README's recipe failed (exit $rc)"
  exit 1
fi
echo "copy_stage: README recipe OK"
