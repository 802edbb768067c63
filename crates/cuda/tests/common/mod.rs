//! Helpers shared by the GPU test files: opening the GPU, random inputs, bf16 and NVFP4 copies
//! of them, and the relative error the comparisons use.

use fastdecode_cuda::ops::{DevNvfp4, MoeWeights};
use fastdecode_cuda::Gpu;
use fastdecode_model::nvfp4::{dequantize_row, quantize_row};
use half::bf16;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

pub fn gpu() -> Gpu {
    Gpu::open(0).expect("these tests need a GPU")
}

pub fn rand_vec(rng: &mut ChaCha8Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| rng.random_range(-1.0f32..1.0) * scale)
        .collect()
}

pub fn to_bf16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

/// Largest |a - b| relative to the largest |b|.
pub fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-20);
    a.iter()
        .zip(b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs() / scale))
}

/// One MoE layer's random NVFP4 experts, drawn in this order: routed gate `[e·inter, hid]`, up
/// (the same), down `[e·hid, inter]`, then the shared gate `[sh, hid]`, up and down `[hid, sh]`;
/// the device copies and the dequantised f32 twins, in that order.
pub fn quant_moe(
    g: &Gpu,
    rng: &mut ChaCha8Rng,
    (e, hid, inter, sh): (usize, usize, usize, usize),
) -> ([DevNvfp4; 6], [Vec<f32>; 6]) {
    let shapes = [
        (e * inter, hid),
        (e * inter, hid),
        (e * hid, inter),
        (sh, hid),
        (sh, hid),
        (hid, sh),
    ];
    let (dev, cpu): (Vec<_>, Vec<_>) = shapes
        .iter()
        .map(|&(rows, cols)| quant(g, rng, rows, cols))
        .unzip();
    (
        dev.try_into()
            .unwrap_or_else(|_| unreachable!("six shapes")),
        cpu.try_into()
            .unwrap_or_else(|_| unreachable!("six shapes")),
    )
}

/// The weights of `quant_moe`'s order (routed gate, up, down, then the shared expert's) as the
/// expert kernels take them.
pub fn moe_weights(w: &[DevNvfp4; 6]) -> MoeWeights<'_> {
    let [gate, up, down, shared_gate, shared_up, shared_down] = w;
    MoeWeights {
        gate,
        up,
        down,
        shared_gate,
        shared_up,
        shared_down,
    }
}

/// Random NVFP4 weights `[rows, cols]`: the device copy and the dequantised f32 twin.
pub fn quant(g: &Gpu, rng: &mut ChaCha8Rng, rows: usize, cols: usize) -> (DevNvfp4, Vec<f32>) {
    let w = rand_vec(rng, rows * cols, (3.0 / cols as f32).sqrt());
    let (mut codes, mut scales, mut deq) = (
        vec![0u32; rows * cols / 8],
        vec![0u8; rows * cols / 16],
        vec![0f32; rows * cols],
    );
    for r in 0..rows {
        let (c, s) = (
            r * cols / 8..(r + 1) * cols / 8,
            r * cols / 16..(r + 1) * cols / 16,
        );
        quantize_row(
            &w[r * cols..(r + 1) * cols],
            &mut codes[c.clone()],
            &mut scales[s.clone()],
        );
        dequantize_row(&codes[c], &scales[s], &mut deq[r * cols..(r + 1) * cols]);
    }
    (
        DevNvfp4 {
            codes: g.stream.clone_htod(&codes).unwrap(),
            scales: g.stream.clone_htod(&scales).unwrap(),
        },
        deq,
    )
}
