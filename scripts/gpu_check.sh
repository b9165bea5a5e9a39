#!/usr/bin/env bash
# The GPU checks, as one script for a lent GPU machine (docs/cuda_graphs.md, "On a GPU").
# Run from the project root there, after installing the carried wheels
# (bash ../shared/gpu/prepare.sh here, then the command it prints), with OUT set to a folder
# whose files come back:
#
#   bash scripts/gpu_check.sh [seconds for the suite under torchrun, default 150] [test paths]
#
# 1. the tests that need CUDA (CUDA graphs, attention, grouped_mm and dropout on CUDA);
# 2. benchmarks/host_overhead.py on the GPU at world size 1 without a process group, and
#    the stream-loop programs with a one-rank NCCL group (torchrun);
# 3. where a repeated call spends its host time on the GPU (benchmarks/host_profile.py);
# 4. the suite (or the test paths given) under `torchrun --nproc-per-node 1` (NCCL, CUDA
#    tensors), for as long as the budget allows, each failure listed. Known to fail there
#    for want of what the GPU machine lacks, not of hostir: tests/test_package_map.py
#    (grimp), lint-imports, `hostir plan` (the project is on PYTHONPATH, not installed, so
#    no entry points) and `hostir viz` to SVG (no graphviz `dot`).
# Every step runs under its own timeout and the script goes on after a failure: what ran
# is in $OUT.
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
SUITE_S=${1:-150}
SUITE_PATHS=${2:-tests}
export PYTHONUNBUFFERED=1
{
    nvidia-smi -L
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version())"
    git log --oneline -1 2>/dev/null || true
} >"$OUT/env.txt" 2>&1

step() {  # step NAME SECONDS COMMAND...: runs COMMAND, its output in $OUT/NAME.txt
    local name=$1 seconds=$2
    shift 2
    local start=$SECONDS
    timeout "$seconds" "$@" >"$OUT/$name.txt" 2>&1
    local rc=$?
    echo "$name: rc=$rc in $((SECONDS - start)) s" | tee -a "$OUT/steps.txt"
    tail -5 "$OUT/$name.txt"
}

step cuda_tests 120 python3 -m pytest -q -rs -p no:cacheprovider \
    tests/hostir/test_cuda_graphs.py tests/frontend/test_attention_ops.py \
    tests/frontend/test_attention_dropout.py
step host_ws1 120 python3 benchmarks/host_overhead.py --device cuda --runs 7
step host_nccl1 90 torchrun --nproc-per-node 1 benchmarks/host_overhead.py --device cuda \
    --runs 7 --programs row-parallel,column-permute,column-broadcast
step profile 90 python3 benchmarks/host_profile.py --device cuda --size small --calls 3000
# shellcheck disable=SC2086  # the paths are words
step suite_nccl1 "$SUITE_S" torchrun --nproc-per-node 1 -m pytest -q -rfE -p no:cacheprovider \
    --ignore=tests/test_package_map.py $SUITE_PATHS
