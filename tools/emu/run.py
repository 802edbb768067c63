#!/usr/bin/env python3
"""Runs a kernel module's code on the CPU (no GPU): common.cuh and MODULE.cu, with the device
functions that are inline PTX replaced by shim.h's host versions, compiled by g++ with a driver
program that launches kernels through shim.h's thread-per-CUDA-thread emulation and checks them.
A check of a kernel's indexing, barriers and reduction order (batch invariance, agreement with a
double-precision reference) before a GPU call, not of its speed or of the GPU's own bits.

    tools/emu/run.py MODULE DRIVER.cpp [-DNAME=VALUE ...]     e.g. tools/emu/run.py dense tools/emu/gemv_bf16.cpp

MODULE `none` compiles the driver with shim.h alone (tools/emu/selftest.cpp checks the emulator);
A+B compiles modules A and B together (tools/emu/prefill.cpp takes prefill+moe+dense); a module
named by a path ending .cu (from the repository root) is that file, after common.cuh as ever
(tools/emu/persistent.cpp takes tools/emu/persistent_toy.cu).
"""
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
KERNELS = os.path.join(ROOT, "crates", "cuda", "kernels")
OUT = os.path.join(ROOT, ".cache", "emu")
TIMEOUT_S = 1200

# Device functions made of inline PTX: shim.h has a host version of each, and the kernel
# source's definition is dropped.
DROPPED = ["after_wait", "block_arrives_last", "warp_arrives_last", "mma_bf16", "mma_f16", "cluster_rank",
           "cluster_barrier", "cluster_load", "e4m3_pair_x128", "pf_cp16", "pf_cp16w", "pf_cp8", "pf_cp16z",
           "pf_cp_commit", "pf_cp_wait", "pf_ldsm4", "pf_ldsm4t", "counter_acquire_load", "counter_release_add",
           "page_flag_acquire_load", "page_flag_release_add", "wait_backoff", "page_barrier_init",
           "page_barrier_arrive_expect_bytes", "page_barrier_arrive", "page_barrier_try_wait_parity", "page_bulk_load"]


def drop_functions(src):
    """src without the DROPPED functions' definitions (and their template lines)."""
    for name in DROPPED:
        m = re.search(r"^(template <[^\n]*>\n)?__device__ __forceinline__ [^\n(]*\b" + name + r"\(", src, re.M)
        if not m:
            continue
        i = src.index("{", m.end())
        depth = 0
        for j in range(i, len(src)):
            depth += {"{": 1, "}": -1}.get(src[j], 0)
            if depth == 0:
                break
        src = src[: m.start()] + src[j + 1:]
    return src


DECL_IDS = iter(range(1 << 30))


def shared_decl(m):
    """A function's `__shared__ TYPE a[..], b;` as references into the running block's arena."""
    indent, body = m.group(1), m.group(2)
    t = re.match(r"((?:unsigned |const |long )*\w+) ", body)
    names, out = body[t.end():], []
    depth, cur = 0, ""
    for ch in names + ",":
        if ch == "," and depth == 0:
            d = re.match(r"\s*(\w+)(.*)", cur)
            out.append(f"auto& {d.group(1)} = emu_shared<{t.group(1)}{d.group(2).strip()}>({next(DECL_IDS)}, "
                       f"\"{d.group(1)}\");")
            cur = ""
            continue
        depth += ch in "([" and 1 or ch in ")]" and -1 or 0
        cur += ch
    return indent + " ".join(out)


def source(module):
    if module == "none":
        return ""
    text = open(os.path.join(KERNELS, "common.cuh")).read()
    for m in module.split("+"):  # several modules as A+B; a path ending .cu (from the root) is a module too
        path = os.path.join(ROOT, m) if m.endswith(".cu") else os.path.join(KERNELS, m + ".cu")
        text += "\n" + open(path).read()
    text = re.sub(r"^#include <cuda_(bf16|fp16)\.h>\n", "", text, flags=re.M)
    text = drop_functions(text)
    # Dynamic shared memory: a pointer into the block's buffer.
    text = re.sub(r"extern __shared__ (?:__align__\(\d+\) )?(\w[\w ]*?) (\w+)\[\];",
                  r"\1* \2 = reinterpret_cast<\1*>(emu_dyn_shared());", text)
    text = re.sub(r"^( *)__shared__ (?:__align__\(\d+\) )?([^;\n]*);", shared_decl, text, flags=re.M)
    return text


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    module, driver, defines = sys.argv[1], sys.argv[2], sys.argv[3:]
    os.makedirs(OUT, exist_ok=True)
    stem = "_".join(os.path.basename(m).removesuffix(".cu") for m in module.split("+"))
    stem += "_" + os.path.splitext(os.path.basename(driver))[0]
    tu = os.path.join(OUT, stem + ".cpp")
    with open(tu, "w") as f:
        f.write('#include "' + os.path.join(ROOT, "tools", "emu", "shim.h") + '"\n')
        f.write(source(module))
        f.write('\n#include "' + os.path.abspath(driver) + '"\n')
    exe = os.path.join(OUT, stem)
    # FD_WEIGHT_LOAD=2: the weights' plain __ldg flavour (the default is a PTX load). No
    # _FORTIFY_SOURCE: its longjmp check refuses the jumps between fiber stacks (shim.h). Stack
    # clash protection touches every page of a large frame, so a fiber's overflow reaches its
    # stack's guard page and faults there rather than writing past it.
    cmd = ["g++", "-std=c++20", "-O1", "-mfma", "-ffp-contract=fast", "-w", "-U_FORTIFY_SOURCE",
           "-fstack-clash-protection", "-DFD_WEIGHT_LOAD=2",
           *defines, "-o", exe, tu]
    subprocess.run(cmd, check=True)
    # A barrier that some thread never reaches is reported by shim.h; a loop that never ends is not.
    try:
        sys.exit(subprocess.run([exe], timeout=TIMEOUT_S).returncode)
    except subprocess.TimeoutExpired:
        sys.exit(f"{exe}: no end after {TIMEOUT_S} s (a loop that never ends?)")


if __name__ == "__main__":
    main()
