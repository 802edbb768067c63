#!/bin/bash
# Builds, here, everything the GPU machine runs (it has no cargo) and stages it in .gpu/:
# the release binary and the fault build, the GPU test executables (kernels, prefill, drafter,
# DFlash on the GPU), and a tiny synthetic model.
# Then, on the GPU machine (the `device` tool, carrying `.gpu`): `tools/gpu/check.sh`.
# CARGO_TARGET_DIR is honoured (e.g. tools/gpu/stage-revs.sh's target/revs, to share its builds).
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${CARGO_TARGET_DIR:-target}
mkdir -p .gpu
cargo build --release -p fastdecode-cli --no-default-features  # the engine only: the arena stays here
cp "$target/release/fastdecode" .gpu/fastdecode
# The GPU tests (each `#[ignore]`d without a GPU): package:test-target pairs.
for pt in fastdecode-cuda:kernels fastdecode-cuda:prefill fastdecode-cuda:drafter fastdecode-engine:cuda_dflash; do
    p=${pt%%:*} t=${pt#*:}
    exe=$(cargo test -p "$p" --release --no-run --message-format=json 2>/dev/null \
        | python3 -c "import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get('reason')=='compiler-artifact' and m['target']['name']=='$t' and m.get('executable'): print(m['executable'])")
    cp "$exe" ".gpu/$t-test"
done
# The fault build (a slowed candidate for the clock's checks on the GPU).
cargo build --release -p fastdecode-cli --no-default-features --features fault-injection
cp "$target/release/fastdecode-faulty" .gpu/fastdecode-faulty
# Symbols stripped: what travels to the GPU machine is capped (64 MiB with the tree).
strip -s .gpu/fastdecode .gpu/fastdecode-faulty .gpu/*-test
[ -d .gpu/tiny ] || "$target/release/fastdecode" synth --preset tiny --seed 1 --out .gpu/tiny
du -sh .gpu
