#!/usr/bin/env bash
# FlashAttention-4 (PyPI flash-attn-4, written in the CuTe DSL) for bench/compare.py's fa4 column, on a GPU
# machine with no network whose calls carry at most 64 MiB with the working tree (about 11 MB of it).
# Its wheels, without the ones such a machine has (PyTorch, the CUDA bindings, protobuf), come to about
# 111 MB, most of it the CUDA 13 library of the DSL: packed into one tar here and split in two halves,
# each carried by a call of its own to the same machine (which keeps an ignored folder between calls while
# it is held); once both are there, `install` joins them and installs with pip --target.
#
#   scripts/device/fa4_wheels.sh pack [DIR]      # a machine with network: DIR/p1/part_aa, DIR/p2/part_ab
#   scripts/device/fa4_wheels.sh install [DIR]   # the GPU machine, once both halves are there: /tmp/fa4lib
#
# DIR defaults to build-fa4 (ignored by git). The DSL puts its packages on sys.path from a .pth file,
# which Python reads only in site directories, so compare.py runs with both folders on PYTHONPATH:
#   PYTHONPATH=/tmp/fa4lib/nvidia_cutlass_dsl/dsl_packages:/tmp/fa4lib:build/python \
#     python3 bench/compare.py --dtype bfloat16 --budget-ms 150 --out-dir $OUT
set -euo pipefail
mode=${1:?pack or install}
dir=${2:-build-fa4}
wheels=(flash-attn-4==4.0.0b36 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
        nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 quack-kernels==0.6.5
        apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 einops==0.8.2)
case $mode in
  pack)
    work=$(mktemp -d)
    pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
      --platform manylinux_2_24_x86_64 --platform any -d "$work/wheels" "${wheels[@]}"
    tar cf "$work/wheels.tar" -C "$work/wheels" .
    size=$(stat -c %s "$work/wheels.tar")
    split -b $(((size + 1) / 2)) "$work/wheels.tar" "$work/part_"
    rm -rf "$dir" && mkdir -p "$dir/p1" "$dir/p2"
    mv "$work/part_aa" "$dir/p1/" && mv "$work/part_ab" "$dir/p2/"
    rm -rf "$work"
    ls -l "$dir"/p1 "$dir"/p2
    echo "carry $dir/p1 in one call and $dir/p2 in the next (nothing else carried: each call is then just under 64 MiB)"
    ;;
  install)
    work=$(mktemp -d)
    cat "$dir/p1/part_aa" "$dir/p2/part_ab" | tar x -C "$work"
    pip install --no-deps --no-index --target /tmp/fa4lib "$work"/*.whl
    rm -rf "$work"
    PYTHONPATH=/tmp/fa4lib/nvidia_cutlass_dsl/dsl_packages:/tmp/fa4lib python3 -c \
      "import flash_attn.cute, importlib.metadata as m; print('flash-attn-4', m.version('flash-attn-4'))"
    ;;
  *) echo "usage: $0 pack|install [DIR]" >&2; exit 2 ;;
esac
