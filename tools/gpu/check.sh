#!/bin/bash
# On the GPU machine, from the repository root, after tools/gpu/stage.sh staged .gpu/ here:
# the CUDA kernel tests against their CPU twins, the model check against the CPU reference on the
# bundled and a synthetic model, and the XS 2.1 benchmark (JSON into $OUT when set); with TRACE=1
# also a per-kernel timeline of the decode step (table on stderr, waterfall SVG into $OUT).
set -o pipefail
cd "$(dirname "$0")/../.."
export FASTDECODE_HOME=${FASTDECODE_HOME:-/tmp/fdhome}
# cuBLAS (the prefill GEMMs) lives next to the toolkit.
export LD_LIBRARY_PATH=${CUDA_HOME:-/usr/local/cuda}/lib64:${LD_LIBRARY_PATH:-}
out=${OUT:-/tmp}
status=0
# Each step is cut off after STEP_TIMEOUT seconds (default 300): a kernel that hangs (blocks
# waiting on each other) then costs one step, not the whole call.
t="timeout ${STEP_TIMEOUT:-300}"
echo "== kernel tests"; $t ./.gpu/kernels-test --ignored --test-threads 1 || status=1
echo "== prefill tests"; $t ./.gpu/prefill-test --ignored --test-threads 1 --skip timing || status=1
echo "== drafter tests"; $t ./.gpu/drafter-test --ignored --test-threads 1 || status=1
echo "== DFlash on the GPU"; $t ./.gpu/cuda_dflash-test --ignored --test-threads 1 --nocapture || status=1
echo "== check: bundled model"; $t ./.gpu/fastdecode check --backend cuda --model assets/laguna-tiny || status=1
echo "== check: tiny synthetic"; $t ./.gpu/fastdecode check --backend cuda --model .gpu/tiny || status=1
echo "== bench: XS 2.1"
$t ./.gpu/fastdecode bench --backend cuda --synthetic xs2.1 --seed 0 --prompt-tokens 512 \
    --decode-tokens 512 --repeats 5 --profile --json > "$out/bench-xs2.1.json" || status=1
grep -A3 '"decode_ms_per_token\|"prefill_ms\|"fraction_of_roofline' "$out/bench-xs2.1.json"
if [ -n "${TRACE:-}" ]; then
    # A timeline of two decode steps in the graph, per kernel (README: bench --trace).
    echo "== trace: XS 2.1 decode step"
    FASTDECODE_NVRTC_DEFINES=-DFD_TRACE $t ./.gpu/fastdecode bench --backend cuda --synthetic xs2.1 --seed 0 \
        --prompt-tokens 512 --decode-tokens 32 --trace "$out/trace.csv" > /dev/null || status=1
    ./.gpu/fastdecode timeline "$out/trace.csv" --svg "$out/timeline.svg" > /dev/null || status=1
    gzip -f "$out/trace.csv"
fi
exit $status
