#!/usr/bin/env python3
"""Import loops between the files (modules) of each crate, which CI refuses.

A newcomer should find no circular dependencies between a crate's files: each reads with the
files it uses below it (the arena's service core was moved into `service/mod.rs` and
`service/state.rs` for this). In each `crates/*/src`, `foo.rs` and `foo/mod.rs` are module
`foo`, `foo/bar.rs` is `foo::bar` (`foo/bar/baz.rs` `foo::bar::baz`, at any depth); module A
depends on B when A's code names B through `crate::` (a `use`, grouped or not, or an inline
path) or `super::`, counted for the longest prefix that is a module (`crate::runner::gate::X` is
`runner::gate`, else `runner`). Left out: the crate roots (lib.rs, main.rs, Cargo.toml's
[lib]/[[bin]] paths: they declare and re-export all), src/bin/, files declared under
`#[cfg(test)]`, any item under `#[cfg(test)]` (`mod tests { ... }`), comments, strings, and
edges between a module and its own ancestors or descendants (`runner` and `runner::gate`).
`#[path]` is not followed. A loop is a strongly connected component (Tarjan) of several modules,
printed with its edges (`a -> b: names`); the exit status is then 1.

The same is asked of a crate's top-level modules, each folder taken whole (`runner::gate` counts
as `runner`): a crate's folders show its parts and depend one way (the arena's service <- record
<- server <- client), so `service::lease` using `record::verdict` while `record::notes` uses
`service::db` is a loop between folders even where no two modules loop.
"""

import argparse
import re
import sys
import tempfile
import tomllib
from collections import defaultdict
from pathlib import Path

# Comments, strings and char literals (not lifetimes), matched left to right so that a `//`
# inside a string or a `"` inside a comment is taken for what it is. Block comments: not nested.
NOISE = re.compile(
    r"""//[^\n]*|/\*.*?\*/
      |(?<!\w)[bc]?r(\#*)".*?"\1
      |(?<!\w)[bc]?"(?:\\.|[^"\\])*"
      |(?<!\w)b?'(?:\\.[^'\n]*|[^\\'\n])'""",
    re.S | re.X,
)
TOKEN = re.compile(r"[A-Za-z_]\w*|::|\S")
IDENT = re.compile(r"[A-Za-z_]\w*")
CFG_TEST = ["#", "[", "cfg", "(", "test", ")", "]"]


def tokens(src: str) -> list[str]:
    return TOKEN.findall(NOISE.sub(" ", src))


def past_brace(toks: list[str], i: int) -> int:
    """Index just past the `}` matching the `{` at toks[i]."""
    depth = 0
    for j in range(i, len(toks)):
        depth += {"{": 1, "}": -1}.get(toks[j], 0)
        if depth == 0:
            return j + 1
    return len(toks)


def past_item(toks: list[str], i: int) -> int:
    """Index just past the item starting at toks[i] (its attributes first): at its `;`, past
    its `{...}` body, or at the `}` that closes the block around it."""
    depth = 0  # of () and [], as in `#[attr(...)]` or `[u8; 4]`
    for j in range(i, len(toks)):
        depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(toks[j], 0)
        if depth == 0 and toks[j] in (";", "{", "}"):
            return {";": j + 1, "{": past_brace(toks, j), "}": j}[toks[j]]
    return len(toks)


def use_tree(toks: list[str], i: int) -> tuple[list[list[str]], int]:
    """The paths of the path or use tree at toks[i] (`a::b::{c, d::{e as f}, *}`), and the
    index past it. In an expression (`crate::a::f(x)`) it stops at the first non-path token."""
    segs: list[str] = []
    while i < len(toks):
        if toks[i] == "{":  # a group: each member is a tree of its own under segs
            paths, i = [], i + 1
            while i < len(toks) and toks[i] != "}":
                sub, j = use_tree(toks, i)
                paths += [segs + s for s in sub if s]
                i = j + (toks[j:j + 1] == [","]) if j > i else i + 1
            return paths, i + 1
        if toks[i] == "*":
            return [segs + ["*"]], i + 1
        if not IDENT.fullmatch(toks[i]):
            break
        segs.append(toks[i])
        i += 1
        if toks[i:i + 1] != ["::"]:
            break
        i += 1
    if toks[i:i + 1] == ["as"]:
        i += 2
    return [segs], i


def resolve(path: list[str], here: list[str]) -> list[str]:
    """A path made absolute (without `crate`): `super` climbs from `here`, `self` is dropped."""
    base, rest = ([], path[1:]) if path[0] == "crate" else (list(here), path)
    while rest and rest[0] == "super":
        base, rest = base[:-1], rest[1:]
    return base + [s for s in rest if s != "self"]


def scan(toks: list[str], here: list[str]) -> tuple[list[list[str]], list[str]]:
    """The absolute paths the file's non-test code names through `crate::`/`super::`, and the
    modules it declares only for tests. `here` is the file's module path; inline `mod x { }`
    blocks extend it so that `super::` inside them resolves as rustc would."""
    refs, test_mods, i = [], [], 0
    inline: list[tuple[str, int]] = []  # open inline modules: (name, index of their `}`)
    while i < len(toks):
        while inline and i >= inline[-1][1]:
            inline.pop()
        at = here + [name for name, _ in inline]
        if toks[i:i + 7] == CFG_TEST:  # skip the item; a `mod x;` there is a test-only file
            j = past_item(toks, i + 7)
            item = toks[i + 7:j]
            if item[-1:] == [";"] and "mod" in item:
                test_mods.append("::".join(at + [item[item.index("mod") + 1]]))
            i = j
        elif toks[i] == "mod" and toks[i + 2:i + 3] == ["{"] and IDENT.fullmatch(toks[i + 1]):
            inline.append((toks[i + 1], past_brace(toks, i + 2) - 1))
            i += 3
        elif toks[i] in ("crate", "super") and toks[i + 1:i + 2] == ["::"] \
                and toks[i - 1:i] != ["::"]:
            paths, i = use_tree(toks, i)
            refs += [resolve(p, at) for p in paths]
        else:
            i += 1
    return refs, test_mods


def crate_roots(crate: Path) -> set[Path]:
    """The files under src/ that are a crate root: lib.rs, main.rs, Cargo.toml's own paths."""
    manifest = tomllib.loads((crate / "Cargo.toml").read_text())
    paths = [t.get("path") for t in [manifest.get("lib", {})] + manifest.get("bin", [])]
    roots = {crate / p for p in paths if p} | {crate / "src/lib.rs", crate / "src/main.rs"}
    return {r.resolve() for r in roots if r.exists()}


def module_name(rel: Path) -> str:
    """`runner/gate.rs` is `runner::gate`, `runner/mod.rs` is `runner`."""
    parts = list(rel.with_suffix("").parts)
    return "::".join(parts[:-1] if parts[-1] == "mod" else parts)


def related(a: str, b: str) -> bool:
    """Whether a and b are the same module or one contains the other."""
    return a == b or a.startswith(b + "::") or b.startswith(a + "::")


def crate_graph(crate: Path) -> tuple[set[str], dict[tuple[str, str], set[str]]]:
    """The crate's modules and its edges, (from, to) -> the names `from` takes from `to`."""
    src, roots = crate / "src", crate_roots(crate)
    files = {f: ("" if f.resolve() in roots else module_name(f.relative_to(src)))
             for f in sorted(src.rglob("*.rs")) if "bin" not in f.relative_to(src).parts[:-1]}
    modules = {m for m in files.values() if m}
    edges: dict[tuple[str, str], set[str]] = defaultdict(set)
    test_only: list[str] = []
    for f, mod in files.items():
        refs, tests = scan(tokens(f.read_text()), mod.split("::") if mod else [])
        test_only += tests
        for path in refs:
            hit = next((k for k in range(len(path), 0, -1) if "::".join(path[:k]) in modules), 0)
            target = "::".join(path[:hit])
            if hit and mod and not related(mod, target):
                edges[mod, target].add(path[hit] if hit < len(path) else path[-1])
    dropped = {m for m in modules if any(m == t or m.startswith(t + "::") for t in test_only)}
    edges = {e: n for e, n in edges.items() if not dropped & set(e)}
    return modules - dropped, edges


def tarjan(nodes: set[str], edges) -> list[list[str]]:
    """The strongly connected components of the graph, each sorted."""
    succ = defaultdict(list)
    for a, b in sorted(edges):
        succ[a].append(b)
    index, low, stack, comps = {}, {}, [], []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
            comps.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return comps


def check(root: Path, out=print) -> tuple[int, int, list[list[str]]]:
    """Prints each crate's loops; returns (crates, modules, loops)."""
    manifests = root.glob("crates/*/Cargo.toml")
    crates = sorted(m.parent for m in manifests if m.with_name("src").is_dir())
    count, loops = 0, []
    for crate in crates:
        modules, edges = crate_graph(crate)
        count += len(modules)
        folders, folder_edges = {m.split("::")[0] for m in modules}, defaultdict(set)
        for (a, b), names in edges.items():
            if a.split("::")[0] != b.split("::")[0]:
                folder_edges[a.split("::")[0], b.split("::")[0]] |= {f"{a} -> {b}"}
        for kind, nodes, graph in (("modules", modules, edges), ("folders", folders, folder_edges)):
            for comp in (c for c in tarjan(nodes, graph) if len(c) > 1):
                loops.append(comp)
                out(f"{crate.name}: import loop between {len(comp)} {kind}: {', '.join(comp)}")
                for (a, b), names in sorted(graph.items()):
                    if a in comp and b in comp:
                        out(f"  {a} -> {b}: {', '.join(sorted(names))}")
    verdict = f"{len(loops)} loop{'s' * (len(loops) != 1)}" if loops else "no import loop"
    out(f"import_loops.py: {len(crates)} crates, {count} modules, {verdict}")
    return len(crates), count, loops


FAKE = {  # a loop top::a -> top::b -> top::c -> top::a, what must not join it, and a loop
    # between the folders top and solo (solo -> top, top::d::e -> solo) with no module loop
    "Cargo.toml": '[package]\nname = "fake"\n',
    "src/lib.rs": "pub mod top;\npub mod solo;\n#[cfg(test)]\nmod testonly;\n",
    "src/top/mod.rs": "pub mod a;\npub mod b;\npub mod c;\npub mod d;\n"
                      "pub use crate::top::a::A;\npub struct S;\n",
    "src/top/a.rs": "//! Used by crate::solo (a doc comment: no edge).\n"
                    "use super::{b::{B, f}, S};\n"
                    'pub struct A;\npub fn g() -> &\'static str { "crate::solo::X" }\n'
                    "#[cfg(test)]\nmod tests {\n    use crate::solo;\n    use crate::top::c;\n}\n",
    "src/top/b.rs": "use crate::top::c::{self as see, C};\npub struct B;\npub fn f() {}\n",
    "src/top/c.rs": "use crate::top::a::g;\npub struct C;\n",
    "src/top/d.rs": "pub mod e;\n",  # a folder beside its file, two deep: top::d::e
    "src/top/d/e.rs": "use crate::solo::s;\nuse super::super::b::B;\n",
    "src/solo.rs": "use crate::top::S;\npub fn s() { crate::top::a::g(); }\n"
                   "use crate::testonly::T;\n",
    "src/testonly.rs": "use crate::solo::*;\npub struct T;\n",
}


def self_test() -> int:
    """Checks the script on FAKE, a tiny crate in a temporary directory."""
    with tempfile.TemporaryDirectory() as tmp:
        crate = Path(tmp, "crates/fake")
        for rel, text in FAKE.items():
            (crate / rel).parent.mkdir(parents=True, exist_ok=True)
            (crate / rel).write_text(text)
        modules, edges = crate_graph(crate)
        assert modules == {"top", "top::a", "top::b", "top::c", "top::d", "top::d::e",
                           "solo"}, modules
        assert edges == {("top::a", "top::b"): {"B", "f"}, ("top::b", "top::c"): {"c", "C"},
                         ("top::c", "top::a"): {"g"}, ("solo", "top::a"): {"g"},
                         ("top::d::e", "solo"): {"s"}, ("top::d::e", "top::b"): {"B"},
                         ("solo", "top"): {"S"}}, edges
        lines: list[str] = []
        assert check(Path(tmp), lines.append) == (
            1, 7, [["top::a", "top::b", "top::c"], ["solo", "top"]]), lines
    print("\n".join(lines))
    print("import_loops.py: self-test passed")
    return 0


def command(doc: str, found, self_test) -> int:
    """The command line of a CI check (this one's and long_functions.py's): `--self-test` runs
    `self_test()`, else the exit status is 1 when `found(root)` is not empty."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2],
                        help="the workspace (default: this script's, two folders up)")
    parser.add_argument("--self-test", action="store_true", help="check the script itself")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    return 1 if found(args.root) else 0


if __name__ == "__main__":
    sys.exit(command(__doc__, lambda root: check(root)[2], self_test))
