#!/usr/bin/env bash
# CI guard (issue 48): docs/ holds text a person reads and git diffs, no binary files (the
# browser test writes its screenshots under target/screenshots/, not here). Prints each binary
# file git tracks under docs/ and exits 1; exits 0 when there is none.
set -euo pipefail
cd "$(dirname "$0")/../.."
bad=0
while IFS= read -r -d '' f; do
    # grep -I treats a file with a NUL byte as binary and finds no line in it.
    if [ -s "$f" ] && ! grep -qI '' "$f"; then
        echo "docs-text: $f is binary: keep it out of docs/" >&2
        bad=1
    fi
done < <(git ls-files -z docs)
exit $bad
