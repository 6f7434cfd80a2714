#!/usr/bin/env bash
# CI: docs/copy_a_stage.md's recipes, run as written. Every "## " section of the page that has
# ```sh blocks is one recipe: its sh blocks, in order, run by one bash from the clone's root (so that
# a variable set in one block is there in the next), as a reader pastes them. The recipes make their
# project folders with mktemp -d; TMPDIR points those into a scratch folder this script removes.
# A recipe ends by running its program: with a GPU it must print "stageNN::forward: success"; without
# one it must exit 2 after saying what it found ("no NVIDIA driver" or "no CUDA device"), and the
# program must have been built.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
page="$repo/docs/copy_a_stage.md"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# The page's sections that hold sh blocks, by heading.
mapfile -t headings < <(awk '/^## / { heading = $0 }
                              /^```sh$/ && heading != "" { print heading; heading = "" }' "$page")
[ ${#headings[@]} -ge 2 ] || { echo "copy_stage: $page has fewer than two recipes"; exit 1; }

for heading in "${headings[@]}"; do
  # The sh blocks of this section, concatenated.
  recipe=$(awk -v want="$heading" '
    /^## / { on = ($0 == want); next }
    /^```/ { if (fence) { fence = 0; take = 0 } else { fence = 1; take = on && $0 == "```sh" }; next }
    take' "$page")
  echo "copy_stage: ${heading#\#\# }"
  mkdir -p "$scratch/tmp"
  set +e
  (cd "$repo" && TMPDIR="$scratch/tmp" bash -euo pipefail -c "$recipe") >"$scratch/run.log" 2>&1
  rc=$?
  set -e
  tail -n 5 "$scratch/run.log"
  if [ $rc -eq 0 ] && grep -q "^stage[0-9][0-9]::forward: success$" "$scratch/run.log"; then
    echo "copy_stage: built and ran"
  elif [ $rc -eq 2 ] && grep -qE "^attention: (no NVIDIA driver|no CUDA device)" "$scratch/run.log" &&
       find "$scratch/tmp" -type f -name attention -perm -u+x | grep -q .; then
    echo "copy_stage: built; no GPU here to run it, and the program said so"
  else
    cat "$scratch/run.log"
    echo "copy_stage: the recipe '${heading#\#\# }' of docs/copy_a_stage.md failed (exit $rc)"
    exit 1
  fi
  rm -rf "$scratch/tmp"
done
echo "copy_stage: docs/copy_a_stage.md's ${#headings[@]} recipes OK"
