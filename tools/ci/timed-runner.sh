#!/usr/bin/env bash
# cargo's target runner for the tests' binaries (tools/test.sh sets it): runs each binary with
# libtest's --report-time, so the log says how long every test took (tools/ci/summary.py lists
# the slowest). That option is unstable on a stable toolchain: RUSTC_BOOTSTRAP lets the test
# binary accept it, and is set here, for the binary alone, because cargo counts it in every
# crate's fingerprint and would rebuild the workspace if rustc saw it.
#
# Then one line (bash's `time`) of the CPU time the binary and every process it waited for used
# (its arenas' services, runners, sandboxed builds and workers, browsers), which the summary puts
# beside the binary's wall time: on CI's two busy cores, wall time hides what a test costs.
TIMEFORMAT='timed-runner: cpu user %U s, system %S s, wall %R s'
time env RUSTC_BOOTSTRAP=1 "$1" -Zunstable-options --report-time "${@:2}"
