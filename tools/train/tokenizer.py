#!/usr/bin/env python3
"""Train the byte-level BPE tokenizer on the train split of the corpus (never on held-out documents).

Standard GPT-2 style byte-level BPE with HF `tokenizers`: ByteLevel pre-tokenizer (GPT-2 regex, no prefix
space) and ByteLevel decoder, no normaliser, no post-processor (scripts add <|bos|> themselves), so the file
loads in the Rust `tokenizers` crate built with `fancy-regex`.

Special tokens, in this order, get ids 0..3: <|bos|> <|eos|> <|pad|> <|mask|> (the mask token is the DFlash
drafter's). Vocabulary: 8192 including the specials and the 256 byte symbols.

Usage: python3 tools/train/tokenizer.py [--vocab 8192]
Reads  .cache/corpus/train.jsonl (from corpus.py)
Writes .cache/train-in/tokenizer.json (carried to the GPU machine) and prints a few statistics.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|mask|>"]
BOS, EOS, PAD, MASK = range(4)


def ensure_deps() -> None:
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        import subprocess
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "tokenizers"], check=True)


def iter_texts(path: Path):
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]


def train(train_jsonl: Path, vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(iter_texts(train_jsonl), trainer=trainer)
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return tok


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--train", type=Path, default=ROOT / ".cache/corpus/train.jsonl")
    ap.add_argument("--heldout", type=Path, default=ROOT / ".cache/corpus/heldout.jsonl")
    ap.add_argument("--out", type=Path, default=ROOT / ".cache/train-in/tokenizer.json")
    args = ap.parse_args()
    ensure_deps()
    tok = train(args.train, args.vocab)
    assert tok.get_vocab_size() == args.vocab, tok.get_vocab_size()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(args.out))
    # round trip and compression on held-out text
    n_bytes = n_tok = 0
    for text in iter_texts(args.heldout):
        ids = tok.encode(text).ids
        assert tok.decode(ids) == text
        n_bytes += len(text.encode("utf-8"))
        n_tok += len(ids)
    print(f"tokenizer: vocab {tok.get_vocab_size()}, held-out {n_bytes:,} bytes -> {n_tok:,} tokens "
          f"({n_bytes / max(n_tok, 1):.2f} bytes/token); wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
