#!/usr/bin/env bash
# The GPU checks, as one prepared script for a machine with one GPU (an H200) and NO network.
#
#   tools/gpu_check.sh [all|tests|bench]     # default: all; run from anywhere
#   tools/gpu_check.sh --prepare             # HERE, with network: fill wheelhouse/
#
# Steps: (0) check the Python imports the server needs and print what is missing, installing
# it from wheelhouse/ when that folder exists; (a) tests/kernels and the triton-backend engine
# tests on the GPU (bf16 included); (b) tools/bench/gpu_bench.py: a Qwen3-0.6B-shaped random bf16
# model, 256 sequences with input and output lengths uniform in [100, 1024], ignore_eos,
# offline through the engine core in-process, then over HTTP (`izh-trio serve` + a concurrent
# client). The last line of (b) is one JSON line of figures (output tok/s offline and over HTTP,
# times, GPU name). Logs and the JSON go to $OUT (default /tmp/izh_gpu_check).
# Budget: (a) is capped at 150 s, (b) at 420 s; both together stay under 10 minutes.
#
# The machine there has Python 3.12 with torch and triton (and numpy, safetensors, tokenizers,
# httpx, jinja2, msgpack, attrs, prometheus_client, pytest...) but not all of this project's
# pure-Python needs (cattrs, llguidance, trio, hypercorn, quart, quart-trio, pytest-trio, ...).
# Prepare them here, where pip can reach the index, as wheels for that machine:
#
#   python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#       --platform manylinux2014_x86_64 -d wheelhouse \
#       attrs cattrs msgpack safetensors tokenizers llguidance trio hypercorn quart quart-trio \
#       prometheus_client httpx jinja2 numpy pytest pytest-trio
#
# (that is what --prepare runs; ~10 MB without numpy/tokenizers, which are usually there).
# Keep wheelhouse/ out of git (`echo /wheelhouse/ >> .git/info/exclude`) and carry it to the
# GPU machine with the checkout (the device tool: carry ["wheelhouse"]). There this script
# installs only what is missing, offline:
#
#   python3 -m pip install --no-index --find-links wheelhouse <missing distributions>
#
# The project itself is not installed there: PYTHONPATH=<checkout> makes izh_trio (and its kernels)
# importable, and `python3 -m izh_trio serve` stands in for the `izh-trio` console script.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
OUT="${OUT:-/tmp/izh_gpu_check}"
WHEELHOUSE="${WHEELHOUSE:-$ROOT/wheelhouse}"
WHAT="${1:-all}"
# distribution=module pairs the server, the tests and the benchmark import
NEEDS="attrs=attrs cattrs=cattrs msgpack=msgpack safetensors=safetensors tokenizers=tokenizers
llguidance=llguidance trio=trio hypercorn=hypercorn quart=quart quart-trio=quart_trio
prometheus_client=prometheus_client httpx=httpx jinja2=jinja2 numpy=numpy pytest=pytest
pytest-trio=pytest_trio"

if [[ "$WHAT" == "--prepare" ]]; then
    dists=$(for p in $NEEDS; do echo -n "${p%%=*} "; done)
    exec "$PY" -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$WHEELHOUSE" $dists
fi
mkdir -p "$OUT"

missing() {  # prints the distributions whose module does not import
    for p in $NEEDS; do
        "$PY" -c "import ${p#*=}" 2>/dev/null || echo -n "${p%%=*} "
    done
}

echo "== (0) environment"
miss="$(missing)"
if [[ -n "$miss" ]]; then
    echo "missing Python packages: $miss"
    if [[ -d "$WHEELHOUSE" ]]; then
        echo "installing them from $WHEELHOUSE (offline)"
        "$PY" -m pip install -q --no-index --find-links "$WHEELHOUSE" $miss
        miss="$(missing)"
    fi
    if [[ -n "$miss" ]]; then
        echo "still missing: $miss -- prepare wheelhouse/ (see this script's header)"
        exit 2
    fi
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi -L 2>/dev/null || true
"$PY" -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', \
torch.__version__, 'triton', triton.__version__, 'cuda', torch.cuda.is_available() and \
torch.cuda.get_device_name())" | tee "$OUT/env.txt"
BENCH_ARGS=()
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    # IZH_GPU_CHECK_CPU=1: rehearse the script on a CPU (interpreted kernels, --small bench).
    [[ "${IZH_GPU_CHECK_CPU:-0}" == 1 ]] || { echo "no CUDA device: nothing to check"; exit 2; }
    echo "no CUDA device: a CPU rehearsal (TRITON_INTERPRET, tools.bench.gpu_bench --small)"
    BENCH_ARGS=(--small)
fi

status=0
if [[ "$WHAT" == all || "$WHAT" == tests ]]; then
    echo "== (a) kernel and triton-backend tests on the GPU"
    xdist=()
    "$PY" -c "import xdist" 2>/dev/null && xdist=(-n 8)  # compiles kernels in parallel
    timeout 150 "$PY" -m pytest tests/kernels tests/engine/test_attention_triton.py -q \
        -p no:cacheprovider "${xdist[@]}" 2>&1 | tee "$OUT/tests.log"
    rc=${PIPESTATUS[0]}
    echo "tests: exit $rc"
    [[ $rc -eq 0 ]] || status=1
fi

if [[ "$WHAT" == all || "$WHAT" == bench ]]; then
    echo "== (b) throughput: offline engine core, then HTTP"
    timeout 420 "$PY" -m tools.bench.gpu_bench --work-dir /tmp/izh_gpu_bench "${BENCH_ARGS[@]}" \
        2> >(tee "$OUT/bench.log" >&2) | tee "$OUT/bench.json"
    rc=${PIPESTATUS[0]}
    echo "bench: exit $rc"
    [[ $rc -eq 0 ]] || status=1
    [[ -f /tmp/izh_gpu_bench/server.log ]] && tail -c 200000 /tmp/izh_gpu_bench/server.log \
        > "$OUT/server.log"
fi
exit $status
