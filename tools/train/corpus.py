#!/usr/bin/env python3
"""Build the training corpus for the small Laguna model (issue 3).

Everything comes from Debian 12 packages, fetched with `apt-get download` (no installation into the
system; the .deb files are unpacked with `dpkg-deb -x` under .cache/corpus/debs). Each package's exact
version, the sha256 of its .deb, and its licence are written to tools/train/SOURCES.md.

Documents are single files (or, for the Devil's Dictionary, one letter of the alphabet). A document's id is
`<package>:<path inside the package>`. The split is a pure function of the id:

    heldout  <=>  int(sha256(id)[:16], 16) % 1000 < HELDOUT_PER_MILLE

so held-out documents (and the prompts cut from them) are never trained on. Both splits are written in a
deterministic order (sorted by sha256 of the id, which interleaves the sources).

Outputs
  .cache/corpus/train.jsonl, .cache/corpus/heldout.jsonl   one {"id", "source", "text"} per line
  .cache/corpus/stats.json                                  sizes per source and split
  .cache/train-in/corpus-train.jsonl.gz, corpus-heldout.jsonl.gz   the same, gzip -9 with mtime 0 (these
                                                            are what run_all.sh carries to the GPU machine)
  tools/train/SOURCES.md                                    sources, versions, licences, sha256

Usage: python3 tools/train/corpus.py   (re-runnable; needs apt-get, i.e. root on Debian 12)
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "corpus"
DEBS = CACHE / "debs"
TRAIN_IN = ROOT / ".cache" / "train-in"
HELDOUT_PER_MILLE = 20  # 2 % of documents are held out
MAX_DOC_BYTES = 400_000  # skip generated tables and data blobs
MAX_LINE_CHARS = 400  # skip files whose longest line is longer (minified data, tables)

# (package, licence, description, selector) - the selector picks files inside the unpacked package.
PY = "usr/lib/python3.11/"
RUST = "usr/src/rustc-1.63.0/"
PACKAGES = [
    ("libpython3.11-minimal", "PSF-2.0", "CPython 3.11 standard library, core modules (.py)",
     lambda p: p.startswith(PY) and p.endswith(".py")),
    ("libpython3.11-stdlib", "PSF-2.0", "CPython 3.11 standard library (.py)",
     lambda p: p.startswith(PY) and p.endswith(".py")),
    ("libpython3.11-testsuite", "PSF-2.0", "CPython 3.11 regression test suite (.py)",
     lambda p: p.startswith(PY) and p.endswith(".py")),
    ("python3.11-doc", "PSF-2.0", "Python 3.11 documentation, reStructuredText sources (_sources/*.rst.txt)",
     lambda p: "/html/_sources/" in p and p.endswith(".rst.txt")),
    ("rust-src", "MIT OR Apache-2.0", "Rust 1.63 standard library sources (library/**/*.rs) and the Rust books "
     "and guides in Markdown (src/doc/**/*.md)",
     lambda p: (p.startswith(RUST + "library/") and p.endswith(".rs"))
     or (p.startswith(RUST + "src/doc/") and p.endswith(".md"))),
    ("dict-devil", "public domain (Ambrose Bierce, The Devil's Dictionary, 1911)",
     "The Devil's Dictionary, dictd format, one document per initial letter", None),
]


def sh(cmd: list[str], **kw) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def fetch_debs() -> dict[str, dict]:
    """apt-get download each package (candidate version) and unpack it. Returns metadata per package."""
    DEBS.mkdir(parents=True, exist_ok=True)
    if not any(DEBS.glob("*.deb")):
        subprocess.run(["apt-get", "update"], check=True, stdout=subprocess.DEVNULL)
    meta = {}
    for pkg, lic, desc, _ in PACKAGES:
        debs = sorted(DEBS.glob(f"{pkg}_*.deb"))
        if not debs:
            subprocess.run(["apt-get", "download", pkg], check=True, cwd=DEBS,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            debs = sorted(DEBS.glob(f"{pkg}_*.deb"))
        deb = debs[-1]
        out = DEBS / "x" / pkg
        if not out.exists():
            out.mkdir(parents=True)
            subprocess.run(["dpkg-deb", "-x", str(deb), str(out)], check=True)
        meta[pkg] = {
            "package": pkg,
            "version": sh(["dpkg-deb", "-f", str(deb), "Version"]).strip(),
            "deb": deb.name,
            "deb_sha256": hashlib.sha256(deb.read_bytes()).hexdigest(),
            "licence": lic,
            "description": desc,
            "dir": out,
        }
    return meta


def clean(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")


def file_docs(pkg: str, root: Path, select) -> list[tuple[str, str]]:
    docs = []
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        rel = path.relative_to(root).as_posix()
        if not select(rel):
            continue
        raw = path.read_bytes()
        if len(raw) > MAX_DOC_BYTES or len(raw) < 64:
            continue
        try:
            text = clean(raw.decode("utf-8"))
        except UnicodeDecodeError:
            continue
        if max((len(l) for l in text.split("\n")), default=0) > MAX_LINE_CHARS:
            continue
        docs.append((f"{pkg}:{rel}", text))
    return docs


def devil_docs(root: Path) -> list[tuple[str, str]]:
    dz = root / "usr/share/dictd/devil.dict.dz"
    text = clean(zlib.decompress(dz.read_bytes(), 16 + zlib.MAX_WBITS).decode("utf-8", "replace"))
    # entries start with an upper-case headword line followed by a comma or a space, e.g. "ABASEMENT, n."
    # Group the dictionary by initial letter; the preface (before "A") is its own document.
    parts: dict[str, list[str]] = {}
    cur = "preface"
    for line in text.split("\n"):
        m = re.match(r"^([A-Z])[A-Z'\-]+, ", line)
        if m:
            cur = m.group(1)
        parts.setdefault(cur, []).append(line)
    return [(f"dict-devil:{k}", "\n".join(v).strip() + "\n") for k, v in sorted(parts.items())]


def doc_hash(doc_id: str) -> str:
    return hashlib.sha256(doc_id.encode("utf-8")).hexdigest()


def is_heldout(doc_id: str) -> bool:
    return int(doc_hash(doc_id)[:16], 16) % 1000 < HELDOUT_PER_MILLE


def write_jsonl(path: Path, docs: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")


def gzip_det(src: Path, dst: Path) -> None:
    """gzip -9 with mtime 0 and no file name: same bytes every time."""
    with open(src, "rb") as f, open(dst, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=raw, mtime=0) as g:
            while chunk := f.read(1 << 20):
                g.write(chunk)


def write_sources_md(meta: dict, stats: dict) -> None:
    lines = [
        "# Training corpus sources",
        "",
        "Generated by `tools/train/corpus.py` (do not edit by hand). Every source is a Debian 12 (bookworm) package",
        "fetched with `apt-get download` at the version below; the sha256 is that of the `.deb` file. Licences are",
        "those stated in each package's `/usr/share/doc/<package>/copyright`.",
        "",
        "| package | version | licence | what is used | documents (train / held-out) | bytes (train / held-out) | .deb sha256 |",
        "|---|---|---|---|---|---|---|",
    ]
    for pkg, _, _, _ in PACKAGES:
        m = meta[pkg]
        s = stats["sources"][pkg]
        lines.append(
            f"| {pkg} | {m['version']} | {m['licence']} | {m['description']} | {s['train_docs']} / {s['heldout_docs']} "
            f"| {s['train_bytes']:,} / {s['heldout_bytes']:,} | `{m['deb_sha256']}` |")
    t = stats["total"]
    lines += [
        "",
        f"Total: {t['train_docs'] + t['heldout_docs']} documents, {t['train_bytes'] + t['heldout_bytes']:,} bytes of UTF-8 text "
        f"({t['train_bytes']:,} train, {t['heldout_bytes']:,} held out).",
        "",
        "Filters: files that are not valid UTF-8, shorter than 64 bytes, longer than "
        f"{MAX_DOC_BYTES:,} bytes, or with a line longer than {MAX_LINE_CHARS} characters are skipped;",
        "line endings are normalised to `\\n`.",
        "",
        "Split: document id = `<package>:<path in package>`; held out iff `int(sha256(id)[:16], 16) % 1000 < "
        f"{HELDOUT_PER_MILLE}`.",
        "",
    ]
    (ROOT / "tools/train/SOURCES.md").write_text("\n".join(lines))


def main() -> int:
    meta = fetch_debs()
    docs: list[tuple[str, str, str]] = []
    for pkg, _, _, select in PACKAGES:
        root = meta[pkg]["dir"]
        got = devil_docs(root) if select is None else file_docs(pkg, root, select)
        docs += [(pkg, i, t) for i, t in got]
    seen = set()
    train, heldout = [], []
    stats = {"sources": {p[0]: {"train_docs": 0, "heldout_docs": 0, "train_bytes": 0, "heldout_bytes": 0}
                         for p in PACKAGES}}
    for pkg, doc_id, text in sorted(docs, key=lambda d: doc_hash(d[1])):
        assert doc_id not in seen
        seen.add(doc_id)
        split = "heldout" if is_heldout(doc_id) else "train"
        (heldout if split == "heldout" else train).append({"id": doc_id, "source": pkg, "text": text})
        stats["sources"][pkg][f"{split}_docs"] += 1
        stats["sources"][pkg][f"{split}_bytes"] += len(text.encode("utf-8"))
    stats["total"] = {k: sum(s[k] for s in stats["sources"].values())
                      for k in ("train_docs", "heldout_docs", "train_bytes", "heldout_bytes")}
    CACHE.mkdir(parents=True, exist_ok=True)
    TRAIN_IN.mkdir(parents=True, exist_ok=True)
    write_jsonl(CACHE / "train.jsonl", train)
    write_jsonl(CACHE / "heldout.jsonl", heldout)
    for split in ("train", "heldout"):
        gzip_det(CACHE / f"{split}.jsonl", TRAIN_IN / f"corpus-{split}.jsonl.gz")
    stats["packages"] = {k: {kk: vv for kk, vv in v.items() if kk != "dir"} for k, v in meta.items()}
    (CACHE / "stats.json").write_text(json.dumps(stats, indent=1))
    write_sources_md(meta, stats)
    t = stats["total"]
    print(f"corpus: {t['train_docs']} train docs ({t['train_bytes']:,} B), "
          f"{t['heldout_docs']} held-out docs ({t['heldout_bytes']:,} B)")
    for split in ("train", "heldout"):
        p = TRAIN_IN / f"corpus-{split}.jsonl.gz"
        print(f"  {p.relative_to(ROOT)}: {p.stat().st_size:,} B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
