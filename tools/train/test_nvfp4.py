"""Tests of the NVFP4 fake quantiser (tools/train/nvfp4.py). Run: python3 -m pytest tools/train/test_nvfp4.py
(or python3 tools/train/test_nvfp4.py without pytest)."""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nvfp4  # noqa: E402
import testing  # noqa: E402


def all_e4m3_positive():
    return nvfp4.decode_e4m3(torch.arange(127))


def test_e4m3_table():
    v = all_e4m3_positive()
    assert v[0] == 0
    assert v[1] == 2.0 ** -9  # smallest subnormal
    assert v[7] == 7 * 2.0 ** -9
    assert v[8] == 2.0 ** -6  # smallest normal
    assert v[0x7E] == 448  # the largest: 0x7F is NaN
    assert bool((v[1:] > v[:-1]).all())
    # every value is a fixed point of the rounding and encodes back to its byte
    assert torch.equal(nvfp4.round_e4m3(v), v)
    assert torch.equal(nvfp4.encode_e4m3(v).to(torch.int64), torch.arange(127))
    assert bool(nvfp4.decode_e4m3(torch.tensor([0x7F, 0xFF])).isnan().all())


def test_e4m3_rounding():
    r = lambda x: nvfp4.round_e4m3(torch.tensor([x], dtype=torch.float64))[0].item()  # noqa: E731
    assert r(1000.0) == 448 and r(481.0) == 448 and r(470.0) == 448 and r(464.0) == 448
    assert r(1.0625) == 1.0  # tie between 1.0 (m 0) and 1.125 (m 1) -> even
    assert r(1.1875) == 1.25  # tie between 1.125 (m 1) and 1.25 (m 2) -> even
    assert r(2.0 ** -10) == 0.0  # half the smallest subnormal: tie to 0
    assert r(1.5 * 2.0 ** -9) == 2 * 2.0 ** -9  # subnormal tie -> even mantissa 2
    assert r(2.5 * 2.0 ** -9) == 2 * 2.0 ** -9
    assert r(7.5 * 2.0 ** -9) == 2.0 ** -6  # subnormal rounds up into the normals
    # brute force against the table: nearest value, ties to even byte
    v = all_e4m3_positive()
    xs = torch.rand(20000, dtype=torch.float64) * 500
    xs = torch.cat([xs, torch.rand(20000, dtype=torch.float64) * 0.05, (v[:-1] + v[1:]) / 2])
    got = nvfp4.round_e4m3(xs)
    d = (xs[:, None] - v[None, :]).abs()
    best = d.min(dim=1).values
    cand = (d == best[:, None])
    # among equal distances pick the even byte index
    idx = torch.arange(127)
    choose = torch.where(cand, idx[None, :] % 2 == 0, torch.zeros_like(cand)).to(torch.int64)
    single = cand.sum(dim=1) == 1
    want_idx = torch.where(single, d.argmin(dim=1), choose.argmax(dim=1))
    want = v[want_idx]  # beyond 448 the nearest is 448: saturation
    assert torch.equal(got, want)


def test_e2m1_ties():
    v = torch.tensor([0, 0.25, 0.26, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.5, 6.0, 7.0, 100.0], dtype=torch.float64)
    idx = nvfp4.e2m1_index(v).tolist()
    assert idx == [0, 0, 1, 2, 2, 4, 4, 6, 6, 7, 7, 7, 7]


def test_group_example():
    w = torch.zeros(1, 32, dtype=torch.float64)
    w[0, :16] = torch.linspace(-3, 3, 16)
    codes, scale = nvfp4.quantize(w)
    assert scale[0, 0] == 0.5 and scale[0, 1] == 0  # max 3 / 6 = 0.5 exactly
    deq = nvfp4.dequantize(codes, scale)
    assert deq[0, 0] == -3 and deq[0, 15] == 3 and bool((deq[0, 16:] == 0).all())
    assert bool((codes[0, 16:] == 0).all())
    # -0.2 / 0.5 = -0.4 -> magnitude 0.5 (index 1), sign bit set
    c, s = nvfp4.quantize(torch.tensor([[-0.2] + [3.0] + [0.0] * 14], dtype=torch.float64))
    assert c[0, 0] == 0x9 and s[0, 0] == 0.5
    # a negative value that rounds to magnitude 0 gets code 0 (never -0)
    c, s = nvfp4.quantize(torch.tensor([[-0.1] + [3.0] + [0.0] * 14], dtype=torch.float64))
    assert c[0, 0] == 0


def test_idempotent_normal_scales():
    """Quantising dequantised values again gives the same codes and scales (normal E4M3 scales)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(64, 8, 256, generator=g, dtype=torch.float64) * 0.2
    w = w.to(torch.bfloat16).to(torch.float64)
    codes, scale = nvfp4.quantize(w)
    assert bool((scale >= 2.0 ** -6).all())
    deq = nvfp4.dequantize(codes, scale)
    assert torch.equal(deq.to(torch.bfloat16).to(torch.float64), deq)  # exact in bf16
    codes2, scale2 = nvfp4.quantize(deq)
    assert torch.equal(codes2, codes) and torch.equal(scale2, scale)


def test_fixed_point_any_scale():
    """fixed_point output re-quantises to the same codes and scales, also for subnormal scales."""
    g = torch.Generator().manual_seed(1)
    for std in (1e-4, 2e-3, 0.02, 0.3, 50.0, 5000.0):
        w = (torch.randn(32, 512, generator=g, dtype=torch.float64) * std).to(torch.bfloat16).to(torch.float64)
        fp = nvfp4.fixed_point(w)
        assert torch.equal(fp.to(torch.bfloat16).to(torch.float64), fp)
        codes, scale = nvfp4.quantize(fp)
        assert torch.equal(nvfp4.dequantize(codes, scale), fp)
        codes2, scale2 = nvfp4.quantize(nvfp4.dequantize(codes, scale))
        assert torch.equal(codes2, codes) and torch.equal(scale2, scale)
    # the documented non-idempotent case: max|w|/6 = 1.5 * 2^-9 (subnormal tie rounds up)
    w = torch.zeros(1, 16, dtype=torch.float64)
    w[0, 0] = 9 * 2.0 ** -9
    codes, scale = nvfp4.quantize(w)
    assert scale[0, 0] == 2.0 ** -8 and (codes[0, 0] & 7) == 6  # largest code is 4, not 6
    codes2, scale2 = nvfp4.quantize(nvfp4.dequantize(codes, scale))
    assert scale2[0, 0] != scale[0, 0]
    fp = nvfp4.fixed_point(w)
    assert torch.equal(nvfp4.fake_quantize(fp), fp)


def test_pack():
    codes = torch.arange(16, dtype=torch.uint8).reshape(1, 16)
    words = nvfp4.pack_u32(codes)
    assert words.tolist() == [[0x76543210, 0xFEDCBA98]]


def test_ste_grad():
    w = torch.randn(4, 32, dtype=torch.float32, requires_grad=True)
    y = nvfp4.ste(w)
    assert torch.equal(y.detach().double(), nvfp4.fake_quantize(w.detach()))
    y.sum().backward()
    assert torch.equal(w.grad, torch.ones_like(w))


if __name__ == "__main__":
    testing.run_all(globals())
