//! Rotary position embedding frequencies (default and YaRN), matching HF transformers'
//! `_compute_default_rope_parameters` / `_compute_yarn_parameters`.

use crate::config::{RopeParams, RopeScaling};

/// Inverse frequencies and output scale of one layer type's rotary embedding.
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    /// Number of leading head dims that rotate; pairs are (j, j + rotary_dim/2) ("rotate half").
    pub rotary_dim: usize,
    /// One per pair: `rotary_dim / 2` values.
    pub inv_freq: Vec<f32>,
    /// Multiplies cos and sin. For YaRN it is the config's `attention_factor` when present
    /// (Laguna XS 2.1 sets 1.0, as HF transformers reads it; the original MLX runtime ignored it and
    /// used 0.1·ln(32)+1 = 1.3466) and otherwise 0.1·ln(factor)+1. For default RoPE it is 1.
    pub attention_scaling: f32,
}

impl Rope {
    pub fn new(p: &RopeParams, head_dim: usize) -> Rope {
        let d = (head_dim as f64 * p.partial_rotary_factor).round() as usize;
        let base = p.theta;
        // HF computes base ** (arange(0, d, 2) / d) in float32; f64 then one rounding to f32 is
        // at least as accurate and within 1e-6 relative of it.
        let extrap: Vec<f64> = (0..d / 2)
            .map(|j| 1.0 / base.powf((2 * j) as f64 / d as f64))
            .collect();
        match &p.scaling {
            RopeScaling::Default => Rope {
                rotary_dim: d,
                inv_freq: extrap.iter().map(|&f| f as f32).collect(),
                attention_scaling: 1.0,
            },
            RopeScaling::Yarn(y) => {
                let l0 = y.original_max_position_embeddings as f64;
                let corr = |rot: f64| {
                    d as f64 * (l0 / (rot * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
                };
                let (mut low, mut high) = (corr(y.beta_fast), corr(y.beta_slow));
                if y.truncate {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0);
                let high = high.min(d as f64 - 1.0);
                let high = if low == high { high + 0.001 } else { high };
                let inv_freq = extrap
                    .iter()
                    .enumerate()
                    .map(|(j, &e)| {
                        let ramp = ((j as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        // HF: interp·(1 − extrapolation_factor) + extrap·extrapolation_factor,
                        // with extrapolation_factor = 1 − ramp.
                        let interp = e / y.factor;
                        (interp * ramp + e * (1.0 - ramp)) as f32
                    })
                    .collect();
                let attention_scaling = match y.attention_factor {
                    Some(a) => a,
                    None if y.factor <= 1.0 => 1.0,
                    None => 0.1 * y.factor.ln() + 1.0,
                } as f32;
                Rope {
                    rotary_dim: d,
                    inv_freq,
                    attention_scaling,
                }
            }
        }
    }

    /// cos and sin (already multiplied by `attention_scaling`) for one absolute position, one per
    /// pair. The angle is `position · inv_freq` in f32, as HF computes it.
    pub fn cos_sin(&self, position: usize, cos: &mut [f32], sin: &mut [f32]) {
        let p = position as f32;
        for (j, &f) in self.inv_freq.iter().enumerate() {
            let a = p * f;
            cos[j] = a.cos() * self.attention_scaling;
            sin[j] = a.sin() * self.attention_scaling;
        }
    }

    /// Rotate the first `rotary_dim` dims of one head vector in place.
    pub fn apply(&self, x: &mut [f32], cos: &[f32], sin: &[f32]) {
        let half = self.rotary_dim / 2;
        for j in 0..half {
            let (a, b) = (x[j], x[j + half]);
            x[j] = a * cos[j] - b * sin[j];
            x[j + half] = b * cos[j] + a * sin[j];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LagunaConfig, YarnParams};

    /// The formula of docs/spec/laguna.md written out directly for the XS 2.1 full layers.
    #[test]
    fn yarn_inverse_frequencies_match_the_formula() {
        let c = LagunaConfig::from_file(&crate::fixtures::xs21("config.json")).unwrap();
        let rope = Rope::new(&c.rope_full, c.head_dim);
        assert_eq!(rope.rotary_dim, 64);
        assert_eq!(rope.inv_freq.len(), 32);
        assert_eq!(rope.attention_scaling, 1.0);
        let (d, b, f, l0) = (64f64, 5e5f64, 32f64, 8192f64);
        let dim = |r: f64| d * (l0 / (2.0 * std::f64::consts::PI * r)).ln() / (2.0 * b.ln());
        let (low, high) = (dim(64.0).floor(), dim(1.0).ceil());
        assert_eq!((low, high), (7.0, 18.0));
        for j in 0..32 {
            let extrap = b.powf(-2.0 * j as f64 / d);
            let interp = extrap / f;
            let ramp = ((j as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let want = interp * ramp + extrap * (1.0 - ramp);
            let got = rope.inv_freq[j] as f64;
            assert!((got - want).abs() <= 1e-6 * want, "j={j}: {got} vs {want}");
        }
        // Sliding layers: default RoPE over all 128 dims with theta 1e4.
        let s = Rope::new(&c.rope_sliding, c.head_dim);
        assert_eq!(s.rotary_dim, 128);
        for j in 0..64 {
            let want = 1e4f64.powf(-2.0 * j as f64 / 128.0);
            assert!((s.inv_freq[j] as f64 - want).abs() <= 1e-6 * want);
        }
    }

    #[test]
    fn yarn_default_attention_factor_follows_hf() {
        let p = RopeParams {
            theta: 5e5,
            partial_rotary_factor: 0.5,
            scaling: RopeScaling::Yarn(YarnParams {
                factor: 32.0,
                original_max_position_embeddings: 8192,
                beta_fast: 64.0,
                beta_slow: 1.0,
                attention_factor: None,
                truncate: true,
            }),
        };
        let r = Rope::new(&p, 128);
        assert!((r.attention_scaling - 1.3465736).abs() < 1e-6);
    }

    #[test]
    fn rotation_preserves_norm_and_leaves_tail() {
        let p = RopeParams {
            theta: 1e4,
            partial_rotary_factor: 0.5,
            scaling: RopeScaling::Default,
        };
        let r = Rope::new(&p, 16);
        let mut x: Vec<f32> = (0..16).map(|i| i as f32 * 0.3 - 2.0).collect();
        let orig = x.clone();
        let (mut c, mut s) = (vec![0.0; 4], vec![0.0; 4]);
        r.cos_sin(37, &mut c, &mut s);
        r.apply(&mut x, &c, &s);
        assert_eq!(&x[8..], &orig[8..]);
        let n0: f32 = orig[..8].iter().map(|v| v * v).sum();
        let n1: f32 = x[..8].iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-4);
        assert_ne!(&x[..8], &orig[..8]);
    }
}
