#!/bin/bash
# On the GPU machine: the arena staged by tools/gpu/arena-stage.sh, served here with one cuda
# runner, each staged submission followed to its verdict. Writes into $OUT the verdicts and where
# each stage's time went (arena-e2e.json, as tools/gpu/arena_report.py prints it) and the
# service's and runner's logs.
#
#   tools/gpu/arena-e2e.sh [SECONDS [WHICH ...]]   stop following after SECONDS (default 540);
#                                                  only the staged submissions WHICH names, each
#                                                  a track, a NAME or TRACK:NAME
set -uo pipefail
cd "$(dirname "$0")/../.."
budget=${1:-540}
shift || true
which=("$@")
staged=.gpu/arena
OUT=${OUT:-/tmp/arena-e2e}
mkdir -p "$OUT"
run=/tmp/arena-run
rm -rf "$run" && mkdir -p "$run"
fetch() { python3 -c 'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())' "$1"; }
unxz() { python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"; }
# The runner's sandbox: bubblewrap from the staged package where the machine has none.
command -v bwrap >/dev/null || for d in "$staged"/*.deb; do dpkg -x "$d" /; done
{
    bwrap --version
    command -v setpriv
    ls -l /dev/nvidia* | head -5
    nvidia-smi -L
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    ldconfig -p | grep -E "libcuda.so|libnvrtc.so" | head -4
} >"$OUT/machine.txt" 2>&1
cp -a "$staged/data" "$run/data"
for f in "$run"/data/artifacts/*.xz; do unxz "$f" "${f%.xz}" && rm "$f"; done
unxz "$staged/fastdecode.xz" "$run/fastdecode" && chmod 755 "$run/fastdecode"
bin=$run/fastdecode
cp -a "$staged/repo.git" "$run/repo.git"
token=$("$bin" arena admin runner add gpu-1 --kind cuda --data "$run/data")
url=http://127.0.0.1:8417
"$bin" arena serve --data "$run/data" --repo "$run/repo.git" --tracks "$staged/tracks" \
    --listen 127.0.0.1:8417 2>"$OUT/service.log" &
until grep -q "listening on" "$OUT/service.log" 2>/dev/null; do sleep 0.2; done
"$bin" arena runner --server "$url" --token "$token" --kind cuda --cache "$run/cache" \
    --poll-seconds 0.2 2>"$OUT/runner.log" &
ids=()
while IFS=: read -r id track name; do
    if [ ${#which[@]} -eq 0 ] || [[ " ${which[*]} " =~ \ ($track|$name|$track:$name)\  ]]; then
        ids+=("$id:$track:$name")
    else
        # Not this run's: out of the queue, so the runner takes only the ones asked for.
        "$bin" arena admin cancel "$id" --data "$run/data" >/dev/null
    fi
done <"$staged/submissions"
start=$(date +%s)
for e in "${ids[@]}"; do
    id=${e%%:*}
    while [ $(($(date +%s) - start)) -lt "$budget" ]; do
        fetch "$url/api/submissions/$id" >"$run/$id.json" 2>/dev/null &&
            python3 -c 'import json, sys; sys.exit(0 if json.load(open(sys.argv[1])).get("next_stage") is None else 1)' "$run/$id.json" &&
            break
        sleep 2
    done
    echo "e2e: $e after $(($(date +%s) - start)) s"
done
for e in "${ids[@]}"; do
    id=${e%%:*}
    fetch "$url/api/submissions/$id" >"$run/$id.json" 2>/dev/null || true
done
python3 tools/gpu/arena_report.py "$run" "${ids[@]}" | tee "$OUT/arena-e2e.txt"
# The private side of the failed stages (what the runner keeps from the candidate's own output).
python3 - "$run/data/arena.db" >"$OUT/private.txt" 2>&1 <<'PY'
import sqlite3, sys
for row in sqlite3.connect(sys.argv[1]).execute(
        "SELECT submission, stage, outcome, result FROM stages WHERE outcome != 'ok'"):
    print(*row, sep="\n  ")
PY
cp "$run/report.json" "$OUT/arena-e2e.json" 2>/dev/null || true
kill %1 %2 2>/dev/null
wait 2>/dev/null
exit 0
