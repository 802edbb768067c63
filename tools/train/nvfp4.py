"""NVFP4 (group 16) fake quantisation exactly as docs/spec/laguna.md specifies.

A weight W [..., in] is split into groups of 16 consecutive inputs along its last axis (the input dim of every
HF expert tensor: `mlp.experts.gate_up_proj` [E, 2I, hidden], `mlp.experts.down_proj` [E, hidden, I] and the
shared expert's nn.Linear weights [out, in]).

Per group:  scale = E4M3 round-to-nearest-even of max|w| / 6   (bias 7, subnormals, saturate at 448;
            0x7F and 0xFF are NaN, as torch's float8_e4m3fn and the GPU read them);
            code  = nearest E2M1 magnitude {0, 0.5, 1, 1.5, 2, 3, 4, 6} of |w| / scale, ties to the even code
            index, clamped at 6; the sign goes to bit 3 (only for a non-zero magnitude, so -0 never appears);
            W' = scale * e2m1(code).
All arithmetic is float64, where every step here is exact (or correctly rounded once), so the result does not
depend on the device. A product scale * e2m1 has at most 6 significant bits, so W' is exact in bf16.

Idempotence: if a group's scale is a normal E4M3 number (max|w| >= 6 * 2^-6), its largest element gets code 6
and quantising W' again returns the same scale and codes. With a subnormal scale that can fail (e.g.
max|w|/6 = 1.5 * 2^-9 rounds up to 2^-8, the largest code is then 4, and re-quantising picks scale 2^-9 and
clips). `fixed_point` iterates W <- dequant(quant(W)) until nothing changes; its output always re-quantises
to itself, which is what the checkpoint stores so that `fastdecode transform` is lossless.
"""
from __future__ import annotations

import torch

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# midpoint between magnitude index i and i + 1; a tie goes to the even index
_MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E4M3_MAX = 448.0
GROUP = 16


def round_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round non-negative float64 values to the nearest E4M3 value (ties to even mantissa), saturating at 448."""
    assert x.dtype == torch.float64
    assert bool((x >= 0).all())
    x = torch.clamp(x, max=E4M3_MAX)
    _, e = torch.frexp(x)  # x = m * 2^e, m in [0.5, 1)
    e = torch.clamp(e - 1, min=-6)  # floor(log2 x); below 2^-6 the subnormal quantum 2^-9 applies
    q = torch.ldexp(torch.ones_like(x), e - 3)  # 3 mantissa bits
    return torch.round(x / q) * q  # torch.round is round-half-to-even; x / q is exact (power of two)


def decode_e4m3(b: torch.Tensor) -> torch.Tensor:
    """Byte (0..255) -> float64 value; 0x7F / 0xFF are NaN."""
    b = b.to(torch.int64)
    s = torch.where(b >= 128, -1.0, 1.0).to(torch.float64)
    e = (b >> 3) & 15
    m = (b & 7).to(torch.float64)
    sub = torch.ldexp(m / 8, torch.full_like(e, -6))
    nor = torch.ldexp(1 + m / 8, e - 7)
    v = s * torch.where(e == 0, sub, nor)
    return torch.where((b & 0x7F) == 0x7F, torch.nan, v)


def encode_e4m3(v: torch.Tensor) -> torch.Tensor:
    """Non-negative float64 E4M3 values (as returned by round_e4m3) -> bytes."""
    assert bool((round_e4m3(v) == v).all())
    _, e = torch.frexp(v)
    e = e - 1
    sub = v < 2.0 ** -6
    m_sub = torch.round(v * 2.0 ** 9).to(torch.int64)
    m_nor = torch.round((torch.ldexp(v, -e) - 1) * 8).to(torch.int64)
    byte = torch.where(sub, m_sub, ((e + 7).to(torch.int64) << 3) | m_nor)
    return byte.to(torch.uint8)


def e2m1_index(v: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 magnitude index (0..7) of non-negative float64 v, ties to the even index, clamp at 6."""
    idx = torch.zeros_like(v, dtype=torch.int64)
    for i, t in enumerate(_MIDS):
        up_on_tie = (i + 1) % 2 == 0
        idx += ((v > t) | ((v == t) & up_on_tie)).to(torch.int64)
    return idx


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W [..., in] (in % 16 == 0) -> (codes uint8 [..., in] in 0..15, scales float64 [..., in/16])."""
    shape = w.shape
    assert shape[-1] % GROUP == 0, shape
    g = w.detach().to(torch.float64).reshape(*shape[:-1], shape[-1] // GROUP, GROUP)
    amax = g.abs().amax(dim=-1)
    scale = round_e4m3(amax / 6)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    v = g.abs() / safe[..., None]
    idx = torch.where(scale[..., None] > 0, e2m1_index(v), torch.zeros_like(v, dtype=torch.int64))
    sign = ((g < 0) & (idx > 0)).to(torch.int64) << 3
    codes = (idx | sign).to(torch.uint8).reshape(shape)
    return codes, scale


def dequantize(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of quantize: float64 [..., in]."""
    shape = codes.shape
    c = codes.to(torch.int64).reshape(*shape[:-1], shape[-1] // GROUP, GROUP)
    mag = torch.tensor(E2M1, dtype=torch.float64, device=codes.device)[c & 7]
    val = torch.where((c & 8) != 0, -mag, mag) * scale[..., None]
    return val.reshape(shape)


def fake_quantize(w: torch.Tensor) -> torch.Tensor:
    """dequantize(quantize(w)) in float64."""
    return dequantize(*quantize(w))


def fixed_point(w: torch.Tensor, max_iter: int = 16) -> torch.Tensor:
    """Iterate w <- fake_quantize(w) until it no longer changes (float64 result, re-quantises to itself)."""
    cur = fake_quantize(w)
    for _ in range(max_iter):
        nxt = fake_quantize(cur)
        if torch.equal(nxt, cur):
            return cur
        cur = nxt
    raise RuntimeError("NVFP4 fake quantisation did not reach a fixed point")


class _STE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w):
        return fake_quantize(w).to(w.dtype)

    @staticmethod
    def backward(ctx, g):
        return g


def ste(w: torch.Tensor) -> torch.Tensor:
    """Quantisation-aware training: fake-quantised forward, identity (straight-through) backward."""
    return _STE.apply(w)


def pack_u32(codes: torch.Tensor) -> torch.Tensor:
    """Codes uint8 [..., in] -> runtime-layout words [..., in/8] (element j of a word in bits 4j..4j+3),
    returned as int64 holding the u32 value (for tests and tooling)."""
    shape = codes.shape
    c = codes.to(torch.int64).reshape(*shape[:-1], shape[-1] // 8, 8)
    shifts = torch.arange(8, device=codes.device, dtype=torch.int64) * 4
    return (c << shifts).sum(dim=-1)
