#!/bin/bash
# On the GPU machine, after tools/gpu/stage-revs.sh staged binaries in .gpu/revs/ here: the model
# check of each (bundled trained model), then the XS 2.1 bench of each, interleaved round by
# round so that drift of the machine hits all of them alike, and a table of medians. JSON of
# every run into $OUT when set. ROUNDS (default 3) and DECODE_TOKENS (default 256) tune it.
set -o pipefail
cd "$(dirname "$0")/../.."
export FASTDECODE_HOME=${FASTDECODE_HOME:-/tmp/fdhome}
export LD_LIBRARY_PATH=${CUDA_HOME:-/usr/local/cuda}/lib64:${LD_LIBRARY_PATH:-}
out=${OUT:-/tmp}
revs=$(ls .gpu/revs)
status=0
t="timeout ${STEP_TIMEOUT:-300}"  # a hanging run costs one step, not the whole call
for sha in $revs; do
    echo "== check $sha"
    $t ./.gpu/revs/$sha/fastdecode check --backend cuda --model assets/laguna-tiny 2>&1 | tail -3 || status=1
done
for round in $(seq "${ROUNDS:-3}"); do
    for sha in $revs; do
        $t ./.gpu/revs/$sha/fastdecode bench --backend cuda --synthetic xs2.1 --seed 0 --prompt-tokens 512 \
            --decode-tokens "${DECODE_TOKENS:-256}" --repeats 3 --json > "$out/compare-$sha-$round.json" \
            || { echo "bench $sha round $round failed"; status=1; }
    done
done
python3 tools/gpu/medians.py "$out" compare "${ROUNDS:-3}" rev $revs
exit $status
