#!/usr/bin/env bash
# Section 7 of BENCHMARKS.md, and the engine on CUDA with bf16 and fp16, on a lent GPU machine.
#
# The machine the `device` tool lends (an H200) has no uv and no network. Its `python3`
# (3.12) holds torch, numpy, pyarrow, safetensors, accelerate and attrs, but not cattrs
# or zlib-ng, which lr needs. So the session that gets one:
#
#   1. here:  bash tools/bench/gpu_device.sh fetch
#             downloads those wheels for Python 3.12 into .whl/ (git-ignored; about 1 MB)
#   2. there: device run, carry [".whl"], timeout_s 600, command:
#             LR_BENCH_COMMIT=<git rev-parse --short HEAD> bash tools/bench/gpu_device.sh run
#             (the copy there has no git; the section records that commit)
#   3. here:  copy section 7 from the returned BENCHMARKS.md into BENCHMARKS.md;
#             engine.log says whether the CUDA checks passed.
#
# `run` takes about 5 minutes of the machine: `tools/bench/gpu_throughput.py` (its section goes
# to $OUT/BENCHMARKS.md), then `lr-engine train` on CUDA (bf16 autocast with checkpoints and a
# resume from one, fp16 with the loss scaler; $OUT/engine.log). The machine has one GPU and
# the engine runs one process there without a process group, so NCCL is not exercised (two
# NCCL ranks cannot share a GPU). `run` also works on a CPU, as a dry check of the script
# (tiny sizes, into $OUT only): `LR_GPU_DEVICE=cpu PYTHON=.venv/bin/python bash tools/bench/gpu_device.sh run`.
set -euo pipefail
cd "$(dirname "$0")/../.."

# what the machine's python3 lacks (cattrs' own needs too, in versions it accepts), as uv.lock pins them
PINNED="cattrs attrs typing-extensions zlib-ng"

fetch() {
    mkdir -p .whl
    grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl $(python3 -c 'import sys, tomllib
lock = {p["name"]: p["version"] for p in tomllib.load(open("uv.lock", "rb"))["package"]}
print(" ".join(f"{name}=={lock[name]}" for name in sys.argv[1:]))' $PINNED)
    ls -l .whl
}

engine_checks() {  # python, runs folder, then the policy flags
    local py=$1 runs=$2
    shift 2
    local act=("$@")
    echo "== bf16 autocast, 20 steps, checkpoints at 10 and 20"
    timeout 60 "$py" -m lr_engine.cli train "${act[@]}" --accelerator.mixed_precision=bf16 --steps=20 --save_freq=10 \
        --output_dir=$runs/bf16
    echo "== resumed from step 10 (its losses after step 10 are compared below with the uninterrupted run's)"
    timeout 60 "$py" -m lr_engine.cli train --resume=true --config_path=$runs/bf16/checkpoints/000010 --output_dir=$runs/resumed
    "$py" - "$runs" <<'EOF'
import json, sys
from pathlib import Path
runs = Path(sys.argv[1])
def losses(run):
    lines = (runs / run / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines)}
a, b = losses("bf16"), losses("resumed")
pairs = {s: (a[s], b[s]) for s in sorted(b) if s in a and s > 10}
assert pairs, f"no common logged step after 10: {sorted(a)} / {sorted(b)}"
print("losses after step 10, uninterrupted vs resumed:", pairs)
print("identical:", all(x == y for x, y in pairs.values()), "(CUDA kernels need not be deterministic: reported, not judged)")
EOF
    echo "== fp16 autocast with the loss scaler, 20 steps"
    timeout 60 "$py" -m lr_engine.cli train "${act[@]}" --accelerator.mixed_precision=fp16 --steps=20 --save_checkpoint=false \
        --output_dir=$runs/fp16
    echo "engine checks: passed"
}

run() {
    local out=${OUT:-/tmp/lr-gpu-out} device=${LR_GPU_DEVICE:-cuda} py=${PYTHON:-python3}
    mkdir -p "$out"
    local wheels=${LR_GPU_WHEELS:-.whl}  # what `fetch` downloaded (none: the packages are there already)
    if compgen -G "$wheels/*.whl" > /dev/null; then
        "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/lr-site "$wheels"/*.whl
        export PYTHONPATH=/tmp/lr-site
    fi
    local src
    for src in packages/*/src; do PYTHONPATH="$PWD/$src${PYTHONPATH:+:$PYTHONPATH}"; done
    export PYTHONPATH PYTHONUNBUFFERED=1 LR_NO_PROGRESS=1 LR_CACHE_DIR=${LR_CACHE_DIR:-/tmp/lr-cache}
    export LR_BENCH_VIA="bash tools/bench/gpu_device.sh run"  # the command the section shows
    { nvidia-smi -L || true; "$py" -c 'import sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.version.cuda)'
    } 2>&1 | tee "$out/machine.log"

    # 1. section 7 (first: it is what the machine was lent for); the timeouts leave the whole
    #    command inside the device tool's 600 s
    local bench=(--out="$out/BENCHMARKS.md")
    if [ "$device" = cuda ]; then
        cp BENCHMARKS.md "$out/BENCHMARKS.md"
    else
        bench+=(--device=cpu --smoke)
    fi
    if [ -n "${LR_GPU_SKIP_THROUGHPUT:-}" ]; then  # the engine checks alone (tests of the script's own logic)
        echo "gpu_throughput: skipped (LR_GPU_SKIP_THROUGHPUT)" | tee "$out/gpu_throughput.log"
    else
        timeout 330 "$py" tools/bench/gpu_throughput.py "${bench[@]}" 2>&1 | tee "$out/gpu_throughput.log" \
            || echo "gpu_throughput: FAILED" | tee -a "$out/gpu_throughput.log"
    fi

    # 2. lr-engine train on the device
    local log=$out/engine.log runs=${LR_GPU_RUNS:-/tmp/lr-gpu-runs}
    rm -rf "$runs"
    # the benchmarks' ACT (_act.py: about 10M parameters; its smoke size for the CPU dry check)
    local smoke=False batch=64 act
    [ "$device" = cuda ] || { smoke=True; batch=8; }
    mapfile -t act < <("$py" -c "import sys; sys.path.insert(0, 'tools/bench'); import _act; print('\n'.join(_act.act_flags($smoke)))")
    [ "${#act[@]}" -gt 0 ] || { echo "gpu_device.sh: no policy flags from tools/bench/_act.py" >&2; return 1; }
    act+=("--policy.device=$device" "--batch_size=$batch" --log_freq=10)
    # not `{ ...; } | tee || ...`: a list after || runs with `set -e` off, so a failed command
    # inside would not stop the checks and "passed" would still be printed
    set +e
    (set -e; engine_checks "$py" "$runs" "${act[@]}") 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    set -e
    [ "$rc" = 0 ] || echo "engine checks: FAILED (exit $rc)" | tee -a "$log"
    ! grep -q ": FAILED" "$log" "$out/gpu_throughput.log"
}

case "${1:-}" in
    fetch) fetch ;;
    run) run ;;
    *) echo "usage: bash tools/bench/gpu_device.sh fetch|run" >&2; exit 2 ;;
esac
