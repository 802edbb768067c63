"""Runs a test file's `test_*` functions without pytest (`python3 tools/train/test_X.py`), as pytest
would find them: the training machines need no pytest for the checks in run_all.sh."""
from __future__ import annotations


def run_all(namespace: dict) -> None:
    """Calls every `test_*` function of `namespace` (a module's globals()) in name order; the first
    failure raises, as pytest would report it."""
    n = 0
    for name, fn in sorted(namespace.items()):
        if name.startswith("test_") and callable(fn):
            fn()
            n += 1
    print(f"{n} passed, 0 failed")
