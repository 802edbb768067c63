"""Checks of what the training scripts assume about transformers' Laguna (random weights, CPU, float32).
Run: python3 -m pytest tools/train/test_hf.py (or python3 tools/train/test_hf.py)."""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import testing  # noqa: E402


def model(impl="eager"):
    torch.manual_seed(0)
    m = common.build_model(common.TARGET_CONFIG, experts_impl=impl, attn_impl="eager").eval()
    with torch.no_grad():
        for layer in common.sparse_layers(m):
            layer.mlp.gate.e_score_correction_bias.normal_(0, 0.05)
    return m


def test_dense_train_experts_match_eager():
    a, b = model("eager"), model("dense_train")
    b.load_state_dict(a.state_dict())
    x = torch.randint(4, 8192, (2, 90))
    with torch.no_grad():
        la, lb = a(input_ids=x).logits, b(input_ids=x).logits
    assert (la - lb).abs().max() < 1e-4


def test_tap_hooks_and_hidden_states():
    m = model()
    x = torch.randint(4, 8192, (1, 80))
    store = {}
    hooks = common.tap_hooks(m, [1, 4], store)
    with torch.no_grad():
        out = m(input_ids=x, output_hidden_states=True)
    for h in hooks:
        h.remove()
    hs = out.hidden_states
    assert len(hs) == 6
    assert torch.equal(hs[2], store[1])  # hidden_states[j + 1] is decoder layer j's output ...
    # ... except for the last layer: transformers replaces hidden_states[-1] by the final-normed state
    assert not torch.allclose(hs[5], store[4])
    assert torch.allclose(hs[5], m.model.norm(store[4]))


def test_kv_cache_greedy_matches_full_forward():
    """Greedy with transformers' KV cache (sliding window 64 crossed) equals recomputing the whole sequence."""
    m = model()
    x = torch.randint(4, 8192, (1, 50))
    with torch.no_grad():
        res = m(input_ids=x, use_cache=True)
        past, nxt = res.past_key_values, res.logits[:, -1].argmax(-1)
        cached = [nxt.item()]
        seq = torch.cat([x, nxt[:, None]], 1)
        for _ in range(40):
            res = m(input_ids=nxt[:, None], past_key_values=past, use_cache=True)
            past, nxt = res.past_key_values, res.logits[:, -1].argmax(-1)
            cached.append(nxt.item())
        full, seq = [], x
        for _ in range(41):
            nxt_full = m(input_ids=seq).logits[0, -1].argmax().item()
            full.append(nxt_full)
            seq = torch.cat([seq, torch.tensor([[nxt_full]])], 1)
    assert cached == full


if __name__ == "__main__":
    testing.run_all(globals())
