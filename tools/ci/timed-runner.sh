#!/usr/bin/env bash
# cargo's target runner for the tests' binaries (tools/test.sh sets it): runs each binary with
# libtest's --report-time, so the log says how long every test took (tools/ci/summary.py lists
# the slowest). That option is unstable on a stable toolchain: RUSTC_BOOTSTRAP lets the test
# binary accept it, and is set here, for the binary alone, because cargo counts it in every
# crate's fingerprint and would rebuild the workspace if rustc saw it.
#
# Then one line of the CPU time the binary and everything it started used (its arenas'
# services, runners, sandboxed builds and workers, browsers), which the summary puts beside the
# binary's wall time: on CI's two busy cores, wall time hides what a test costs. It is read
# from a cgroup of the binary's own (cgroup v1's cpuacct or v2), because a parent's rusage
# misses what runs in bubblewrap's PID namespace; where none can be made, there is no line.
cg=
for dir in /sys/fs/cgroup/cpuacct /sys/fs/cgroup/unified /sys/fs/cgroup; do
    if [ -f "$dir/cpuacct.usage" ] || [ -f "$dir/cpu.stat" ]; then
        if mkdir "$dir/fastdecode-test-$$" 2>/dev/null; then
            cg=$dir/fastdecode-test-$$
            echo $$ >"$cg/cgroup.procs" 2>/dev/null || { rmdir "$cg"; cg=; }
        fi
        [ -n "$cg" ] && break
    fi
done
env RUSTC_BOOTSTRAP=1 "$1" -Zunstable-options --report-time "${@:2}"
rc=$?
if [ -n "$cg" ]; then
    if [ -f "$cg/cpuacct.usage" ]; then
        ns=$(cat "$cg/cpuacct.usage")
    else
        ns=$(($(sed -n 's/^usage_usec //p' "$cg/cpu.stat") * 1000))
    fi
    echo "timed-runner: cpu $((ns / 1000000)) ms" >&2
    # Back to the parent's group; the binary's own is removed once nothing is left in it.
    echo $$ >"${cg%/*}/cgroup.procs" 2>/dev/null
    rmdir "$cg" 2>/dev/null
fi
exit $rc
