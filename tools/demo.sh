#!/usr/bin/env bash
# The README's main command: the whole challenge on this machine (`fastdecode arena demo`: a
# local arena on SQLite, one CPU runner, the bundled model, three example submissions), after
# installing bubblewrap when it is missing (the runner runs candidates only inside its sandbox).
# Arguments go to `arena demo` (see `cargo run --release -- arena demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/packages.sh
need bwrap bubblewrap
cargo run --release -- arena demo "$@"
