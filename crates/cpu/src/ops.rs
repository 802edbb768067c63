//! The numeric building blocks of the reference forward, in plain f32 with a fixed summation
//! order (ascending index). Each is the CPU twin of a GPU kernel. The fast paths behind
//! `crate::flags` are here too, each next to the reference it replaces.

use crate::flags::{self, FAST_EXP, UNROLLED_DOT};

/// `y = x · Wᵀ` for one row: W is `[out, in]` row-major.
pub fn matvec(w: &[f32], x: &[f32], y: &mut [f32]) {
    let n = x.len();
    debug_assert_eq!(w.len(), n * y.len());
    let unrolled = flags::active().has(UNROLLED_DOT);
    for (o, yo) in y.iter_mut().enumerate() {
        let row = &w[o * n..(o + 1) * n];
        *yo = if unrolled {
            dot_unrolled(row, x)
        } else {
            let mut acc = 0f32;
            for i in 0..n {
                acc += row[i] * x[i];
            }
            acc
        };
    }
}

/// Dot product with 8 interleaved partial sums combined pairwise (the `unrolled_dot` flag): the
/// independent chains let the compiler vectorise, and the sum rounds differently from the
/// reference's single running sum.
fn dot_unrolled(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (xa, xb) in ca.zip(cb) {
        for j in 0..8 {
            acc[j] += xa[j] * xb[j];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ta.iter().zip(tb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `eˣ` for the attention softmax: libm's `expf`, or with the `fast_exp` flag a range-reduced
/// polynomial (relative error below 2e-6 on [-20, 0], growing to 1e-5 near -87 where the weight
/// is negligible; 0 below -87).
pub fn softmax_exp(x: f32) -> f32 {
    if flags::active().has(FAST_EXP) {
        fast_exp(x)
    } else {
        x.exp()
    }
}

/// `eˣ = 2ⁿ · 2ᶠ` with n = round(x·log2 e) and a degree-6 Taylor polynomial of `e^(f·ln 2)`.
fn fast_exp(x: f32) -> f32 {
    if x < -87.0 {
        return 0.0;
    }
    let t = x * std::f32::consts::LOG2_E;
    let n = t.round();
    let r = (t - n) * std::f32::consts::LN_2;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `RMSNorm(x; w) = w · x / sqrt(mean(x²) + eps)`, as HF computes it: `w · (x · rsqrt(var + eps))`.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let mut ss = 0f32;
    for v in x {
        ss += v * v;
    }
    let inv = 1.0 / (ss / x.len() as f32 + eps).sqrt();
    for i in 0..x.len() {
        out[i] = w[i] * (x[i] * inv);
    }
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `ln(1 + eˣ)`, returning x above 20 as PyTorch's `softplus` does (beta 1, threshold 20).
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Index of the largest value; ties go to the lowest index, NaN never wins.
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] || v[best].is_nan() {
            best = i;
        }
    }
    best
}

/// The two largest values as (index, value), best first, ties to the lowest index.
pub fn top2(v: &[f32]) -> [(usize, f32); 2] {
    let a = argmax(v);
    let mut b = if a == 0 { 1.min(v.len() - 1) } else { 0 };
    for (i, &x) in v.iter().enumerate() {
        if i != a && (x > v[b] || b == a) {
            b = i;
        }
    }
    [(a, v[a]), (b, v[b])]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_and_top2_break_ties_low() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[f32::NAN, 0.5]), 1);
        let t = top2(&[1.0, 3.0, 3.0, 2.0]);
        assert_eq!((t[0].0, t[1].0), (1, 2));
        let t = top2(&[5.0, 1.0, 4.0]);
        assert_eq!((t[0].0, t[1].0), (0, 2));
    }

    #[test]
    fn small_ops_match_definitions() {
        assert!((softplus(0.0) - 2f32.ln()).abs() < 1e-7);
        assert_eq!(softplus(30.0), 30.0);
        assert!((silu(1.0) - 1.0 / (1.0 + (-1f32).exp())).abs() < 1e-7);
        let mut y = [0f32; 2];
        matvec(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[1.0, 0.5, -1.0], &mut y);
        assert_eq!(y, [-1.0, 0.5]);
        let mut o = [0f32; 2];
        rms_norm(&[3.0, 4.0], &[1.0, 2.0], 0.0, &mut o);
        let r = (12.5f32).sqrt();
        assert!((o[0] - 3.0 / r).abs() < 1e-6 && (o[1] - 8.0 / r).abs() < 1e-6);
    }

    #[test]
    fn fast_paths_stay_close_to_the_reference() {
        for i in 0..2000 {
            let x = -20.0 + i as f32 * 0.01;
            let (f, e) = (fast_exp(x), x.exp());
            assert!(((f - e) / e).abs() < 2e-6, "exp({x}): {f} vs {e}");
        }
        assert_eq!(fast_exp(-100.0), 0.0);
        let a: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..37).map(|i| (i as f32 * 0.11).cos()).collect();
        let exact: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
        assert!((dot_unrolled(&a, &b) as f64 - exact).abs() < 1e-5);
    }
}
