#!/usr/bin/env bash
# CI for the course's documentation site and notebooks. Called by .ci/run; also runs on its
# own: bash .ci/docs_and_notebooks.sh [build-dir]
#
# 1. installs what it needs from Debian (Doxygen, MathJax, Chromium, NumPy, Matplotlib, Jupyter);
# 2. checks that every generated figure in the Markdown matches bench/results/ (make_tables.py --check);
# 3. builds the docs target with every Doxygen warning an error (FLASH_DOCS_WERROR=ON), in the
#    project's build dir when it is configured (default: build), else in build-docs from docs/ alone;
# 4. checks the site in headless Chromium from a local server (docs/check_site.py);
# 5. executes notebooks 1-3 and 5 (notebook 4 needs a GPU) and fails on any error.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
export DEBIAN_FRONTEND=noninteractive
if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi

packages=(cmake ninja-build doxygen libjs-mathjax chromium python3 python3-numpy python3-matplotlib
          jupyter-nbconvert python3-ipykernel)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "docs: installing ${missing[*]}"
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null 2>&1 ||
    { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
fi
echo "docs: packages ready ($((SECONDS - start)) s)"

# Debian's Python: the one with python3-numpy, python3-matplotlib and the Jupyter kernel.
PY=/usr/bin/python3

# Every generated table and inline figure of the Markdown pages matches bench/results/.
$PY scripts/docs/make_tables.py --check
$PY scripts/docs/make_diagrams.py --check   # the SVG diagrams match the kernels' constants

build=${1:-build}
if [ -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DFLASH_DOCS_WERROR=ON >/dev/null
  site=$build/docs/html
else
  build=build-docs
  cmake -S docs -B "$build" -G Ninja -DFLASH_DOCS_WERROR=ON -DPython3_EXECUTABLE=$PY >/dev/null
  site=$build/html
fi
cmake --build "$build" --target docs
echo "docs: site built in $site ($((SECONDS - start)) s)"

$PY docs/check_site.py "$site"
echo "docs: browser check passed ($((SECONDS - start)) s)"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
export PYDEVD_DISABLE_FILE_VALIDATION=1  # quiets the kernel's debugger notice
for nb in notebooks/01_*.ipynb notebooks/02_*.ipynb notebooks/03_*.ipynb notebooks/05_*.ipynb; do
  if ! $PY -m jupyter nbconvert --execute --to notebook --output-dir "$out" \
       --ExecutePreprocessor.timeout=300 "$nb" >"$out/log" 2>&1; then
    cat "$out/log"
    echo "docs: notebook $nb failed"
    exit 1
  fi
  echo "docs: executed $nb"
done
echo "docs: site and notebooks OK in $((SECONDS - start)) s"
