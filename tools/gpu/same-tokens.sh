#!/bin/bash
# On the GPU machine, after tools/gpu/stage-revs.sh staged binaries in .gpu/revs/ here: whether
# every staged revision decodes the same tokens on the GPU, serially and with DFlash, on the
# bundled trained model and the staged tiny synthetic one (.gpu/tiny, tools/gpu/stage.sh). A
# change that means to keep the kernels' bits (a refactor, a knob removed) must show `same` on
# every row; a token that moves says which revision, model and mode. JSON of each run into $OUT
# when set. NEW_TOKENS (default 256) sets the length of each decoding; BACKEND=cpu tries the
# script where there is no GPU.
set -o pipefail
cd "$(dirname "$0")/../.."
export FASTDECODE_HOME=${FASTDECODE_HOME:-/tmp/fdhome}
export LD_LIBRARY_PATH=${CUDA_HOME:-/usr/local/cuda}/lib64:${LD_LIBRARY_PATH:-}
out=${OUT:-/tmp}
revs=$(ls .gpu/revs)
status=0
t="timeout ${STEP_TIMEOUT:-300}"
prompt=1,17,300,42,7,99,511,5,64,12,3,250,8,77,31,2  # inside every model's vocabulary
for model in assets/laguna-tiny .gpu/tiny; do
    [ -d "$model" ] || { echo "no model $model (tools/gpu/stage.sh stages .gpu/tiny)"; status=1; continue; }
    # Serial, DFlash with the model's drafter where it has one, and DFlash on oracle drafts.
    for mode in "--block-size 1" "--block-size 4" "--block-size 8 --draft oracle:0.85"; do
        [ -d "$model/drafter" ] || [ "$mode" != "--block-size 4" ] || continue
        first=
        for sha in $revs; do
            name=$(echo "$sha-$(basename "$model")-$mode" | tr -c 'a-zA-Z0-9.\n-' '_')
            $t ./.gpu/revs/$sha/fastdecode generate --backend "${BACKEND:-cuda}" --model "$model" --prompt-ids "$prompt" \
                --max-new-tokens "${NEW_TOKENS:-256}" --ignore-eos $mode --json > "$out/$name.json" \
                || { echo "FAILED $sha $model $mode"; status=1; continue; }
            tokens=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['tokens'])" "$out/$name.json")
            if [ -z "$first" ]; then
                first=$tokens
                echo "$(basename "$model") [$mode] $sha: the first ($(python3 -c "import sys; print(len(eval(sys.argv[1])))" "$tokens") tokens)"
            elif [ "$tokens" = "$first" ]; then
                echo "$(basename "$model") [$mode] $sha: same"
            else
                echo "$(basename "$model") [$mode] $sha: DIFFERENT"
                status=1
            fi
        done
    done
done
exit $status
