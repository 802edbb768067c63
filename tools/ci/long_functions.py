#!/usr/bin/env python3
"""Functions longer than 150 lines outside tests, which CI refuses (issue 48).

A newcomer reads a function whole: one that runs past a screen or three is split into named
phases. Counted: every `fn` with a body in the Rust files under `crates/*/src/` (`tests/`
folders are tests), from the line of its `fn` to the line of its closing brace, comments and
blank lines included (they are read too); a function inside another counts for both. Left out:
items under `#[cfg(test)]` (`mod tests { ... }`), the files such an item declares (`#[cfg(test)]
mod abuse_tests;`, and the folder below it), `#[test]` functions, and comments, strings and char
literals when finding the braces. Python: every `def` in the files under `tools/` but the
`test_*.py` files, by its syntax tree, from its `def` (not its decorators) to its last line.
The files are those git tracks and the new ones it does not ignore. CUDA (`crates/cuda/kernels/`) is not read. Each long function
is printed as `path:line: name is N lines`; the exit status is then 1.
"""

import ast
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# Comments, strings and char literals as import_loops.py finds them; its command line.
from import_loops import NOISE, command

LIMIT = 150

# A test-only item's attribute, or a function's head: its name, then its body or `;`.
ITEM = re.compile(r"#\s*\[\s*(?:cfg\s*\(\s*test\s*\)|test)\s*\]|\bfn\s+(\w+)")


def blanked(src: str) -> str:
    """The source with its comments, strings and char literals spaced out, lines kept."""
    return NOISE.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), src)


def past_close(text: str, i: int) -> int:
    """Index just past the bracket that closes the `{` or `[` at text[i]."""
    pair, depth = {"{": "{}", "[": "[]"}[text[i]], 0
    for j in range(i, len(text)):
        depth += {pair[0]: 1, pair[1]: -1}.get(text[j], 0)
        if depth == 0:
            return j + 1
    return len(text)


def body_start(text: str, i: int) -> int | None:
    """The index of the `{` that opens the body of the item whose head starts at text[i], or
    None for an item with none (`fn f();`, `mod x;`). Brackets in the head (a signature's
    parameters, an attribute's arguments, an array type) are skipped."""
    depth = 0
    for j in range(i, len(text)):
        c = text[j]
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(c, 0)
        if depth == 0 and c in ";{":
            return j if c == "{" else None
    return None


def rust_functions(src: str) -> tuple[list[tuple[str, int, int]], list[str]]:
    """(name, first line, lines) of each function outside test-only items, and the modules the
    file declares for tests only (`#[cfg(test)] mod x;`: a file of tests)."""
    text, found, test_mods, i = blanked(src), [], [], 0
    while m := ITEM.search(text, i):
        if m.group(1) is None:  # `#[cfg(test)]` or `#[test]`: the whole item after it skipped
            rest = m.end()
            while a := re.match(r"\s*#\s*\[", text[rest:]):  # its other attributes first
                rest = past_close(text, rest + a.end() - 1)
            start = body_start(text, rest)
            if start is None and (d := re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)",
                                                text[rest:])):
                test_mods.append(d.group(1))
            i = past_close(text, start) if start is not None else rest
            continue
        start = body_start(text, m.end())
        if start is not None:
            first = text.count("\n", 0, m.start()) + 1
            last = text.count("\n", 0, past_close(text, start) - 1) + 1
            found.append((m.group(1), first, last - first + 1))
        i = m.end()  # nested functions are counted on their own too
    return found, test_mods


def python_functions(src: str) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of each `def`, nested ones too."""
    return [(n.name, n.lineno, n.end_lineno - n.lineno + 1) for n in ast.walk(ast.parse(src))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def tracked(root: Path) -> list[str]:
    """The files under root that git tracks or would (untracked, not ignored) and that are
    there, or every file there when it is no checkout."""
    got = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                          "--exclude-standard"], capture_output=True)
    if got.returncode == 0:
        return [p for p in got.stdout.decode().split("\0") if p and (root / p).is_file()]
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]


def long_ones(root: Path) -> tuple[int, list[tuple[str, int, str, int]]]:
    """How many functions were read, and (path, line, name, lines) of those over LIMIT."""
    read, test_files = {}, []
    for rel in tracked(root):
        parts = Path(rel).parts
        if rel.endswith(".rs") and parts[0] == "crates" and parts[2:3] == ("src",):
            read[rel], mods = rust_functions((root / rel).read_text())
            # `x.rs` and `x/` beside a root or mod.rs, else in the folder named as the file
            here = str(Path(rel).parent if parts[-1] in ("lib.rs", "main.rs", "mod.rs")
                       else Path(rel).with_suffix(""))
            test_files += [f"{here}/{m}{end}" for m in mods for end in (".rs", "/")]
        elif rel.endswith(".py") and parts[0] == "tools" and not parts[-1].startswith("test_"):
            read[rel] = python_functions((root / rel).read_text())
    read = {rel: fns for rel, fns in read.items()
            if not any(rel.startswith(t) for t in test_files)}
    long = [(rel, line, name, n) for rel, fns in sorted(read.items())
            for name, line, n in fns if n > LIMIT]
    return sum(len(fns) for fns in read.values()), long


def check(root: Path, out=print) -> list[tuple[str, int, str, int]]:
    """Prints each long function; returns them."""
    count, long = long_ones(root)
    for rel, line, name, n in long:
        out(f"{rel}:{line}: {name} is {n} lines (at most {LIMIT})")
    verdict = f"{len(long)} over {LIMIT} lines" if long else f"none over {LIMIT} lines"
    out(f"long_functions.py: {count} functions, {verdict}")
    return long


LONG = "\n".join(["    let x = 1;"] * LIMIT)
FAKE = {  # `long` is LIMIT + 3 lines (the rest short), each test-only item long and left out
    "crates/fake/src/lib.rs":
        "//! fn doc() { (a doc comment: no function)\n"
        "pub fn short(a: [u8; 2]) -> u8 { a[0] }\n"
        "pub trait T { fn declared(&self); fn given(&self) { let _ = \"}\"; } }\n"
        f"#[inline]\npub fn long() {{\n{LONG}\n    fn inner() {{ let c = '{{'; }}\n}}\n"
        f"#[cfg(test)]\n#[allow(unused)]\nmod tests {{\n    fn helper() {{\n{LONG}\n    }}\n}}\n"
        f"#[test]\nfn a_test() {{\n{LONG}\n}}\n"
        "pub mod sub;\n#[cfg(test)]\npub(crate) mod more_tests;\n",
    "crates/fake/src/sub.rs": "#[cfg(test)]\nmod deep;\n",
    "crates/fake/src/sub/deep.rs": f"fn deep_test() {{\n{LONG}\n}}\n",
    "crates/fake/src/more_tests.rs": f"fn in_a_test_file() {{\n{LONG}\n}}\n",
    "crates/fake/src/more_tests/under.rs": f"fn under_it() {{\n{LONG}\n}}\n",
    "crates/fake/tests/it.rs": f"fn in_tests() {{\n{LONG}\n}}\n",
    "tools/x.py": "def short():\n    pass\n\n\n@staticmethod\ndef long():\n"
                  + "\n".join(["    x = 1"] * LIMIT) + "\n    def inner():\n        pass\n",
    "tools/test_x.py": "def test_long():\n" + "\n".join(["    x = 1"] * LIMIT) + "\n",
}


def self_test() -> int:
    """Checks the script on FAKE, in a temporary directory that is no checkout."""
    with tempfile.TemporaryDirectory() as tmp:
        for rel, text in FAKE.items():
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / rel).write_text(text)
        lines: list[str] = []
        assert len(check(Path(tmp), lines.append)) == 2, lines
        count, long = long_ones(Path(tmp))
        assert count == 7, count  # short, given, long, inner; short, long, inner
        assert long == [("crates/fake/src/lib.rs", 5, "long", LIMIT + 3),
                        ("tools/x.py", 6, "long", LIMIT + 3)], long
    print("\n".join(lines))
    print("long_functions.py: self-test passed")
    return 0


if __name__ == "__main__":
    sys.exit(command(__doc__, check, self_test))
