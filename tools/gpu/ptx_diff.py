#!/usr/bin/env python3
"""Compares the PTX of every kernel entry of crates/cuda/kernels at a git revision with the
working tree's, compiled as the CUDA backend compiles them at run time (nvrtc.rs: common.cuh
prepended to each module, `--std=c++17 -default-device --gpu-architecture=ARCH` and the defines
given, none by default as for an unset FASTDECODE_NVRTC_DEFINES). No GPU needed: a change meant to
leave the kernels alone (a host-side refactor, a removed variant) proves it here.

Prints, per module, the entries whose PTX is identical, changed, removed or added; exits 1 when
an entry that exists on both sides changed (or a module failed to compile), else 0. NVRTC varies
the PTX of a few entries from run to run: such an entry is compiled again (see RETRIES).

Needs NVRTC and the CUDA headers from PyPI in a virtual environment (nvrtc_pypi.py says how):
    /tmp/nvrtc-venv/bin/python tools/gpu/ptx_diff.py REV [--arch sm_90a] [-D...]
"""
import difflib
import glob
import os
import re
import subprocess
import sys

from nvrtc_pypi import ROOT as root, compile_source, take_arch

kdir = "crates/cuda/kernels"
args = sys.argv[1:]
arch = take_arch(args, "sm_90a")
defines = [a for a in args if a.startswith("-D")]
revs = [a for a in args if not a.startswith("-D")]
if len(revs) != 1:
    sys.exit(__doc__)
rev = revs[0]


def read(path, at):
    """The file's text at revision `at`, or in the working tree when `at` is None ('' if absent)."""
    if at is None:
        full = os.path.join(root, path)
        return open(full).read() if os.path.exists(full) else ""
    r = subprocess.run(["git", "-C", root, "show", f"{at}:{path}"], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else ""


def modules(at):
    if at is None:
        names = glob.glob(os.path.join(root, kdir, "*.cu"))
    else:
        ls = subprocess.run(["git", "-C", root, "ls-tree", "--name-only", at, kdir + "/"],
                            capture_output=True, text=True, check=True).stdout.split()
        names = [n for n in ls if n.endswith(".cu")]
    return sorted(os.path.basename(n)[:-3] for n in names)


def ptx(name, src):
    text, log = compile_source(src, name + ".cu", arch, defines)
    if text is None:
        print(f"== {name}: COMPILE FAILED\n{log}")
    return text


def entries(text):
    """Each `.entry`'s PTX text, from its `.visible .entry` line to its closing brace. Branch
    labels (`$L__BB<function>_<block>`) and local stack frames (`__local_depot<function>`) are
    numbered by the function's place in the module, so the function number is dropped: removing
    an entry renumbers every later one's."""
    text = re.sub(r"\$L__BB\d+_", "$L__BB_", text)
    text = re.sub(r"__local_depot\d+", "__local_depot", text)
    out, name, body = {}, None, []
    for line in text.splitlines():
        m = re.match(r"\.visible \.entry (\w+)\(", line)
        if m:
            name, body = m.group(1), []
        if name:
            body.append(line)
            if line == "}":
                out[name], name = "\n".join(body), None
    return out


def compiled(at, only=None):
    common = read(f"{kdir}/common.cuh", at)
    res = {}
    for m in modules(at):
        if only is None or m in only:
            p = ptx(m, common + "\n" + read(f"{kdir}/{m}.cu", at))
            res[m] = None if p is None else entries(p)
    return res


# NVRTC (12.9) does not always give the same PTX for the same source: the staged one-weight-row
# GEMV entries (gemv_bf16_Rs_g1) come out with other register numbers, offsets and instruction
# order from one compile to the next, in one process or in fresh ones. An entry that differs is
# compiled again on both sides, up to RETRIES more times: it is identical when one of its PTX
# texts appears on both sides, and "varies" (not compared, not a failure) when the revision's own
# compiles disagree; only an entry the revision compiles alike every time can fail.
RETRIES = 2
before, after = compiled(rev), compiled(None)
seen = {}  # (module, entry) -> ([before texts], [after texts])
for m in before:
    if before[m] and after.get(m):
        for k in before[m]:
            if k in after[m]:
                seen[(m, k)] = ([before[m][k]], [after[m][k]])


def differing():
    return sorted(mk for mk, (a, b) in seen.items() if not set(a) & set(b))


for attempt in range(RETRIES):
    mods = sorted({m for m, _ in differing()})
    if not mods:
        break
    print(f"(compiling {', '.join(mods)} again on both sides: try {attempt + 1} of {RETRIES})")
    again = (compiled(rev, mods), compiled(None, mods))
    for (m, k) in differing():
        for side, res in enumerate(again):
            if res.get(m) and k in res[m]:
                seen[(m, k)][side].append(res[m][k])

bad = False
for m in sorted(set(before) | set(after)):
    a, b = before.get(m), after.get(m)
    if a is None or b is None:
        print(f"== {m}: {'missing' if m not in before or m not in after else 'failed'} on one side")
        bad = bad or (m in before and m in after)
        continue
    unequal = [k for (mm, k) in differing() if mm == m]
    varied = sorted(k for k in unequal if len(set(seen[(m, k)][0])) > 1)
    changed = sorted(k for k in unequal if k not in varied)
    same = sorted(k for k in a if k in b and k not in unequal)
    removed = sorted(k for k in a if k not in b)
    added = sorted(k for k in b if k not in a)
    print(f"== {m}: {len(same)} identical, {len(changed)} changed, {len(removed)} removed, {len(added)} added, "
          f"{len(varied)} varying from compile to compile at {rev} itself")
    for label, ks in (("changed", changed), ("removed", removed), ("added", added), ("varies", varied)):
        for k in ks:
            print(f"  {label}: {k}")
            if label == "changed":
                diff = difflib.unified_diff(a[k].splitlines(), b[k].splitlines(), rev, "tree", n=0, lineterm="")
                print("\n".join("    " + l for l in list(diff)[:40]))
    bad = bad or bool(changed)
print(f"{rev} → working tree ({arch}{' ' + ' '.join(defines) if defines else ''}): "
      + ("entries differ" if bad else "every common entry's PTX identical"))
sys.exit(1 if bad else 0)
