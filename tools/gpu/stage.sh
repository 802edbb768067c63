#!/bin/bash
# Builds, here, everything the GPU machine runs (it has no cargo) and stages it in .gpu/:
# the release binary, the CUDA kernel and prefill test executables, and a tiny synthetic model.
# Then, on the GPU machine (the `device` tool, carrying `.gpu`): `tools/gpu/check.sh`.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu
cargo build --release
cp target/release/fastdecode .gpu/fastdecode
for t in kernels prefill; do
    exe=$(cargo test -p fastdecode-cuda --release --no-run --message-format=json 2>/dev/null \
        | python3 -c "import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get('reason')=='compiler-artifact' and m['target']['name']=='$t' and m.get('executable'): print(m['executable'])")
    cp "$exe" ".gpu/$t-test"
done
[ -d .gpu/tiny ] || ./target/release/fastdecode synth --preset tiny --seed 1 --out .gpu/tiny
du -sh .gpu
