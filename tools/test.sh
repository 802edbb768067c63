#!/usr/bin/env bash
# The project's one test command (README, .ci/run): starts what the tests need, installing the
# Debian packages when they are missing, then runs every test of the workspace.
#
# - bubblewrap: the arena's runners run candidates only inside its sandbox.
# - chromium and chromium-driver: the arena's pages are tested in headless Chromium
#   (crates/cli/tests/pages.rs starts chromedriver itself).
# - g++ and python3: the CUDA kernels' own code is run on the CPU (tools/emu,
#   crates/cuda/tests/emu.rs).
# - PostgreSQL: the arena's tests run on it as well as on SQLite. A private cluster is made in a
#   new temporary directory (owned by the `postgres` user when run as root: the server refuses
#   to run as root), listens on a free port of 127.0.0.1 only, and is stopped and removed on exit.
#   Its URL reaches the tests as FASTDECODE_TEST_POSTGRES; they fail, never skip, without it.
#
# Arguments, when given, replace `--workspace --features fastdecode-cli/fault-injection` as what
# `cargo test` is told, in one run (e.g. `tools/test.sh -p fastdecode-cli --test arena`).
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
-h | --help)
    # This file's own header is its help: nothing is installed or run for it.
    sed -n '2,/^$/{/^#/s/^# \{0,1\}//p}' "$0"
    exit 0
    ;;
esac

. tools/packages.sh
need bwrap bubblewrap
need chromedriver chromium chromium-driver
need g++ g++
need python3 python3
# The newest server's binaries: the client package alone (psql, on many machines) has the same
# directory without initdb or postgres.
pg_bin() {
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [ -x "$d/initdb" ] && [ -x "$d/postgres" ]; then
            echo "$d"
            return
        fi
    done
}
[ -n "$(pg_bin)" ] || install postgresql
PG=$(pg_bin)

dir=$(mktemp -d /tmp/fastdecode-pg.XXXXXX)
as_pg=()
if [ "$(id -u)" -eq 0 ]; then
    chown postgres:postgres "$dir"
    as_pg=(runuser -u postgres --)
fi
stop() {
    "${as_pg[@]}" "$PG/pg_ctl" -D "$dir/data" -m fast stop >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap stop EXIT
"${as_pg[@]}" "$PG/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 >"$dir/initdb.log" 2>&1 ||
    { cat "$dir/initdb.log" >&2; exit 1; }
started=
for _ in 1 2 3 4 5; do
    port=$((20000 + RANDOM % 30000))
    if "${as_pg[@]}" "$PG/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir" start >/dev/null 2>&1; then
        started=1
        break
    fi
done
if [ -z "$started" ]; then
    echo "tools/test.sh: PostgreSQL did not start:" >&2
    cat "$dir/server.log" >&2
    exit 1
fi
# The database is not made here: the arena creates the one its URL names on first use, and
# each test names one of its own on this server.
export FASTDECODE_TEST_POSTGRES="postgres://postgres@127.0.0.1:$port/arena"

# Every test binary runs through tools/ci/timed-runner.sh (each test's time in the log), and
# tools/ci/summary.py ends the run with where its time went and one line of counts (also kept
# in target/test-timings.json).
runner=CARGO_TARGET_$(rustc -vV | sed -n 's/^host: //p' | tr 'a-z-' 'A-Z_')_RUNNER
export "$runner=$PWD/tools/ci/timed-runner.sh"
summary=(python3 tools/ci/summary.py --json target/test-timings.json
    --stages target/tmp/arena-stages.jsonl)
mkdir -p target
# A failing test binary stops no other (`--no-fail-fast`): a red run still runs every binary,
# and the summary's counts and timings cover all of them.
if [ $# -gt 0 ]; then
    cargo test --no-fail-fast "$@" 2>&1 | "${summary[@]}"
    exit
fi

# The whole workspace: built once, then its test binaries in two lanes side by side
# (tools/ci/lanes.py), as jobs: each binary that takes minutes alone, longest first, then
# every other test target with the libraries' and binaries' own tests, then the doc tests.
# Most of a long binary's time is spent waiting on what it started (builds in the sandbox,
# pricings, a browser), so the two lanes keep both cores busy; every test holds under that
# load (issue 47: its bound is by construction or it does not depend on timing).
all=(--workspace --features fastdecode-cli/fault-injection)
long=(arena redteam faults pages)
rest=()
for t in $(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
names = {t["name"] for p in json.load(sys.stdin)["packages"] for t in p["targets"] if "test" in t["kind"]}
print("\n".join(sorted(names)))'); do
    case " ${long[*]} " in
    *" $t "*) ;;
    *) rest+=(--test "$t") ;;
    esac
done
jobs=()
for t in "${long[@]}"; do
    jobs+=("$t=cargo test --no-fail-fast ${all[*]} --test $t")
done
jobs+=("rest=cargo test --no-fail-fast ${all[*]} --lib --bins ${rest[*]}"
    "doc=cargo test --no-fail-fast ${all[*]} --doc")
{
    cargo test "${all[@]}" --no-run
    python3 tools/ci/lanes.py --lanes 2 "${jobs[@]}"
} 2>&1 | "${summary[@]}"
