#!/usr/bin/env bash
# cargo's target runner for the tests' binaries (tools/test.sh sets it): runs each binary with
# libtest's --report-time, so the log says how long every test took (tools/ci/summary.py lists
# the slowest). That option is unstable on a stable toolchain: RUSTC_BOOTSTRAP lets the test
# binary accept it, and is set here, for the binary alone, because cargo counts it in every
# crate's fingerprint and would rebuild the workspace if rustc saw it.
exec env RUSTC_BOOTSTRAP=1 "$1" -Zunstable-options --report-time "${@:2}"
