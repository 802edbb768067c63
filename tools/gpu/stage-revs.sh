#!/bin/bash
# Builds, here, the release binary of each given revision and stages it stripped as
# .gpu/revs/<short sha>/fastdecode, so that one call on the GPU machine (which has no cargo) can
# time several candidates against each other with tools/gpu/compare.sh. The revisions build in
# throw-away worktrees sharing target/revs, so each rebuilds only what it changes.
#   tools/gpu/stage-revs.sh main next/unvalidated~4 next/unvalidated
# Built without the arena (`--no-default-features`: the GPU machine runs the engine only), about
# 8 MB a revision: the device tool carries at most 64 MiB with the tracked files (~38 MB), so
# carry only .gpu/revs and stage three or so revisions per call.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
if [ $# -lt 1 ]; then
    echo "usage: tools/gpu/stage-revs.sh REV..." >&2
    exit 2
fi
# The staged set is exactly the revisions given.
rm -rf .gpu/revs
mkdir -p .gpu/revs
for rev in "$@"; do
    sha=$(git rev-parse --short "$rev^{commit}")
    wt=$(mktemp -d)
    git worktree add -q --detach "$wt" "$sha"
    (cd "$wt" && CARGO_TARGET_DIR="$root/target/revs" cargo build --release --quiet -p fastdecode-cli --no-default-features)
    git worktree remove --force "$wt"
    mkdir -p ".gpu/revs/$sha"
    cp "$root/target/revs/release/fastdecode" ".gpu/revs/$sha/fastdecode.tmp"
    strip ".gpu/revs/$sha/fastdecode.tmp"
    mv ".gpu/revs/$sha/fastdecode.tmp" ".gpu/revs/$sha/fastdecode"
    echo "$rev -> .gpu/revs/$sha"
done
du -sh .gpu
