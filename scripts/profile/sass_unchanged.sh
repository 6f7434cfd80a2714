#!/usr/bin/env bash
# Whether a change to the source left the device code as it was: each .cu FILE is compiled at commit BASE
# and in the working tree (nvcc -O3 -std=c++17 -arch=sm_90 -cubin, sm_90a for the Hopper stages, the
# include folders the build gives it), both cubins disassembled (cuobjdump -sass), and the instruction streams compared kernel by kernel
# with the addresses, offsets and encodings left out (opcodes and operands kept, branch targets too).
# A refactor that moves code between headers without changing what it does compiles to the same SASS,
# and scripts/checks/results_cited.py then keeps the results measured before it (its docstring says
# how it reads the record this writes).
#
# Prints, per FILE: the repository files it includes (at BASE and in the tree together: the files whose
# change the comparison covers), then per kernel its mangled name, the instruction count at BASE and in
# the tree, and identical, differs, or new (a kernel only the tree has, such as a new template instance:
# nothing measured at BASE ran it); last, "all identical" or how many kernels differ. Exit 1 if any
# differs, 2 if a tool is missing or a file does not compile. Host code is not compared: cuobjdump sees
# only the device code.
#
# Usage: scripts/profile/sass_unchanged.sh BASE FILE... [> bench/results/sass_unchanged_NAME.txt]
# Needs nvcc and cuobjdump (on PATH, or $CUOBJDUMP). No GPU needed.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)

if [ $# -lt 2 ]; then
  echo "usage: $0 BASE FILE..." >&2
  exit 2
fi
base=$1
shift

cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || true)}
if [ -z "$cuobjdump" ] || [ ! -x "$cuobjdump" ]; then
  echo "cuobjdump not found: put it on PATH or name it in \$CUOBJDUMP. It comes with the CUDA toolkit," >&2
  echo "or alone from PyPI: pip install nvidia-cuda-cuobjdump (then <site-packages>/nvidia/cu13/bin/cuobjdump)." >&2
  exit 2
fi
command -v nvcc > /dev/null || { echo "nvcc not found on PATH" >&2; exit 2; }
base_commit=$(git rev-parse --short "$base^{commit}")
tree_commit=$(git rev-parse --short HEAD)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/base" "$work/out"
mapfile -t folders < <(git ls-tree --name-only "$base_commit" -- common harness stages bench exercises)
git archive "$base_commit" -- "${folders[@]}" ':(exclude)bench/results' | tar -x -C "$work/base"

# The include folders the build gives FILE, below the tree root $1: common/ and harness/ for all, the
# file's own folder, and for the programs under bench/ what flash_registry passes on (every stage's
# folder, stages/, harness/) and bench/ itself.
flags() {
  local top=$1 file=$2
  local -a inc=(-I "$top/common" -I "$top/harness" -I "$top/$(dirname "$file")")
  # An exercise's header is its stage's (the build adds the stage's folder).
  if [[ $file == exercises/* ]]; then
    local folder=${file#exercises/}
    inc+=(-I "$top/stages/${folder%%/*}")
  fi
  if [[ $file == bench/* ]]; then
    inc+=(-I "$top/stages" -I "$top/bench")
    for dir in "$top"/stages/*/; do inc+=(-I "${dir%/}"); done
  fi
  # The Hopper stages, their exercises and stage 12's ladder are built for sm_90a with the definition
  # that turns their kernels on (CMakeLists.txt); compiled for plain sm_90 they would be the stubs that
  # refuse every call.
  local -a arch=(-arch=sm_90)
  case $file in
    stages/12_hopper/* | stages/14_hopper_backward/* | exercises/12_hopper/* | exercises/14_hopper_backward/* | \
      bench/stage12_ladder/*)
      arch=(-gencode arch=compute_90a,code=sm_90a -DFLASH_STAGE12_SM90A=1 -DFLASH_STAGE14_SM90A=1) ;;
  esac
  printf '%s\n' -O3 -std=c++17 "${arch[@]}" "${inc[@]}"
}

# The repository files FILE includes, relative to the tree root $1.
includes() {
  local top=$1 file=$2
  mapfile -t args < <(flags "$top" "$file")
  nvcc "${args[@]}" -M "$top/$file" 2> /dev/null | tr ' \\' '\n\n' | grep "^$top/" | sed "s|^$top/||" | sort -u
}

# One line per instruction, "kernel<TAB>opcode operands", for every kernel of the cubin $1.
normalized_sass() {
  # An anonymous namespace's mangled name carries a hash of the file's path: left out, since BASE is
  # compiled from another folder.
  "$cuobjdump" -sass "$1" | sed 's/_GLOBAL__N__[0-9a-f]\{8\}_/_GLOBAL__N__/g' | awk '
    /Function : / { name = $3; next }
    /^[[:space:]]*\/\*[0-9a-f]+\*\// {
      line = $0
      sub(/^[[:space:]]*\/\*[0-9a-f]+\*\/[[:space:]]*/, "", line)  # the offset
      sub(/[[:space:]]*\/\*.*$/, "", line)                         # the encoding
      sub(/[[:space:]]*;[[:space:]]*$/, "", line)
      gsub(/[[:space:]]+/, " ", line)
      if (line != "") print name "\t" line
    }'
}

declare -A included
for file in "$@"; do
  included[$file]=$( { includes "$work/base" "$file"; includes "$root" "$file"; } | sort -u | tr '\n' ' ')
done
# The tree is a commit only where the compiled files and what they include have no uncommitted change.
mapfile -t compiled < <(printf '%s\n' ${included[@]} | sort -u)
dirty=$(git status --short -- "${compiled[@]}" | awk '{print $NF}' | tr '\n' ' ')

echo "# command: scripts/profile/sass_unchanged.sh $base $*"
echo "# nvcc: $(nvcc --version | grep -i release)"
echo "# cuobjdump: $("$cuobjdump" --version | grep -i release)"
echo "base: $base_commit"
if [ -z "$dirty" ]; then
  echo "tree: $tree_commit (the compiled files and every file they include: no uncommitted changes)"
else
  echo "tree: $tree_commit with uncommitted changes to: $dirty"
fi

differ=0
kernels=0
for file in "$@"; do
  echo "file $file"
  echo "  includes: ${included[$file]}"
  for side in base tree; do
    top=$work/base
    [ "$side" = tree ] && top=$root
    mapfile -t args < <(flags "$top" "$file")
    if ! nvcc "${args[@]}" -cubin "$top/$file" -o "$work/out/$side.cubin" 2> "$work/out/$side.log"; then
      echo "  $file does not compile at $side:" >&2
      cat "$work/out/$side.log" >&2
      exit 2
    fi
    normalized_sass "$work/out/$side.cubin" > "$work/out/$side.sass"
  done
  # Per kernel: the instruction count at BASE and in the tree, and whether the two streams are equal.
  result=$(python3 - "$work/out/base.sass" "$work/out/tree.sass" << 'EOF'
import sys
from collections import defaultdict
streams = []
for path in sys.argv[1:]:
    kernels = defaultdict(list)
    for line in open(path):
        name, _, instruction = line.rstrip("\n").partition("\t")
        kernels[name].append(instruction)
    streams.append(kernels)
base, tree = streams
differ = new = 0
for name in sorted(set(base) | set(tree)):
    same = name in base and name in tree and base[name] == tree[name]
    added = name not in base  # a new instance: nothing measured at BASE ran it
    differ += not same and not added
    new += added
    verdict = "new" if added else "identical" if same else "differs"
    print(f"  {name} {len(base.get(name, []))} {len(tree.get(name, []))} {verdict}")
print(f"= {len(set(base) | set(tree))} {differ} {new}")
EOF
)
  echo "$result" | grep -v '^= '
  read -r _ count bad added <<< "$(echo "$result" | grep '^= ')"
  kernels=$((kernels + count))
  differ=$((differ + bad))
  if [ "$bad" -eq 0 ] && [ "$added" -gt 0 ]; then
    echo "  $file: identical ($((count - added)) kernels at base; $added new in the tree)"
  elif [ "$bad" -eq 0 ]; then
    echo "  $file: identical ($count kernels)"
  else
    echo "  $file: $bad of $count kernels differ"
  fi
done
if [ "$differ" -eq 0 ]; then
  echo "all identical ($kernels kernels)"
else
  echo "$differ of $kernels kernels differ"
  exit 1
fi
