#!/bin/bash
# On the GPU machine, after tools/gpu/stage.sh: the XS 2.1 bench of one staged binary under
# several settings (environment variables, e.g. FASTDECODE_NVRTC_DEFINES kernel variants or a
# launch knob), interleaved round by round so that drift of the machine hits all of them alike,
# then a table of medians. Each argument is NAME=SETTINGS, SETTINGS being VAR=VALUE pairs
# separated by ';' (values may hold spaces; "base=" for none):
#   tools/gpu/variants.sh base= nopdl=FASTDECODE_PDL=0 \
#       'both=FASTDECODE_NVRTC_DEFINES=-DFD_WEIGHT_LOAD=1 -DFD_GEMV_MINB=2;FASTDECODE_PDL=0'
# ROUNDS (default 2), DECODE_TOKENS (default 256) tune it; JSON of every run into $OUT when set.
set -o pipefail
cd "$(dirname "$0")/../.."
export FASTDECODE_HOME=${FASTDECODE_HOME:-/tmp/fdhome}
export LD_LIBRARY_PATH=${CUDA_HOME:-/usr/local/cuda}/lib64:${LD_LIBRARY_PATH:-}
out=${OUT:-/tmp}
bin=${FASTDECODE_BIN:-./.gpu/fastdecode}
if [ $# -lt 1 ]; then
    echo "usage: tools/gpu/variants.sh NAME=[VAR=VALUE[;VAR=VALUE ...]] ..." >&2
    exit 2
fi
names=()
status=0
for round in $(seq "${ROUNDS:-2}"); do
    for arg in "$@"; do
        name=${arg%%=*}
        settings=${arg#*=}
        [ "$round" = 1 ] && names+=("$name")
        # The settings apply to this run only.
        IFS=';' read -ra pairs <<< "$settings"
        timeout "${STEP_TIMEOUT:-300}" env "${pairs[@]}" "$bin" bench --backend cuda --synthetic xs2.1 --seed 0 --prompt-tokens 512 \
            --decode-tokens "${DECODE_TOKENS:-256}" --repeats 5 --json > "$out/variant-$name-$round.json" \
            || { echo "bench $name round $round failed"; status=1; }
    done
done
python3 tools/gpu/medians.py "$out" variant "${ROUNDS:-2}" variant "${names[@]}"
exit $status
