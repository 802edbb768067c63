//! The numeric building blocks of the reference forward, in plain f32 with a fixed summation
//! order (ascending index). Each is the CPU twin of a GPU kernel.

/// `y = x · Wᵀ` for one row: W is `[out, in]` row-major.
pub fn matvec(w: &[f32], x: &[f32], y: &mut [f32]) {
    let n = x.len();
    debug_assert_eq!(w.len(), n * y.len());
    for (o, yo) in y.iter_mut().enumerate() {
        let row = &w[o * n..(o + 1) * n];
        let mut acc = 0f32;
        for i in 0..n {
            acc += row[i] * x[i];
        }
        *yo = acc;
    }
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
}
