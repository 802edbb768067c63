//! NVFP4 with 16-element groups, exactly as `docs/spec/laguna.md` specifies.
//!
//! A weight row of `in` inputs is stored as `in / 8` little-endian u32 words of E2M1 codes (element
//! j of a word in bits 4j..4j+3) and `in / 16` E4M3 scale bytes. `W[c] = e4m3(scale[c/16]) ·
//! e2m1(code[c])`, exact in f32. There is no global scale and no zero point.

/// Elements per scale.
pub const GROUP: usize = 16;
/// Codes per packed u32 word.
pub const CODES_PER_WORD: usize = 8;

/// E2M1 magnitudes indexed by the low three bits of a code; bit 3 is the sign.
pub const E2M1_MAGNITUDES: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// Value of a four-bit E2M1 code (only the low nibble is read).
pub fn e2m1_decode(code: u8) -> f32 {
    let m = E2M1_MAGNITUDES[(code & 7) as usize];
    if code & 8 != 0 {
        -m
    } else {
        m
    }
}

/// Value of an E4M3 byte: sign bit 7, four exponent bits with bias 7, three mantissa bits.
/// Subnormals at exponent 0; 0x7F and 0xFF are NaN, as the GPU's `cvt…e4m3x2` and torch's
/// `float8_e4m3fn` read them, so the largest scale is 448. A checkpoint holding a NaN scale is
/// refused at load (`TensorRef::expect_finite_scales`): no engine computes with one.
pub fn e4m3_decode(byte: u8) -> f32 {
    if byte & 0x7F == 0x7F {
        return f32::NAN;
    }
    let exp = ((byte >> 3) & 0xF) as i32;
    let man = (byte & 7) as f32;
    let mag = if exp == 0 {
        man / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    };
    if byte & 0x80 != 0 {
        -mag
    } else {
        mag
    }
}

/// Index of the nearest entry of an increasing `table` to `x >= 0`, ties to the even index;
/// values beyond the last entry saturate to it.
fn nearest_even(table: &[f32], x: f32) -> usize {
    let x = x as f64;
    let hi = table.partition_point(|&v| (v as f64) < x);
    if hi == 0 {
        return 0;
    }
    if hi == table.len() {
        return table.len() - 1;
    }
    let (a, b) = (table[hi - 1] as f64, table[hi] as f64);
    // a < x <= b; the midpoint is exact in f64 because both ends are short f32 values.
    let mid = (a + b) / 2.0;
    if x < mid {
        hi - 1
    } else if x > mid {
        hi
    } else if (hi - 1) % 2 == 0 {
        hi - 1
    } else {
        hi
    }
}

/// The finite non-negative E4M3 values, bytes 0x00..=0x7E.
fn e4m3_positive_table() -> &'static [f32; 127] {
    use std::sync::OnceLock;
    static T: OnceLock<[f32; 127]> = OnceLock::new();
    T.get_or_init(|| std::array::from_fn(|b| e4m3_decode(b as u8)))
}

/// Round a non-negative finite `x` to the nearest E4M3 byte (ties to even), saturating at 448.
pub fn e4m3_encode(x: f32) -> u8 {
    debug_assert!(x >= 0.0 && x.is_finite());
    nearest_even(e4m3_positive_table(), x) as u8
}

/// Round a finite `x` to the nearest E2M1 code (ties to the even magnitude index), clamping at ±6.
/// Values that round to zero get the positive zero code so that quantisation is canonical.
pub fn e2m1_encode(x: f32) -> u8 {
    let idx = nearest_even(&E2M1_MAGNITUDES, x.abs()) as u8;
    if x < 0.0 && idx != 0 {
        idx | 8
    } else {
        idx
    }
}

/// Quantise one row (length a multiple of 16) into packed codes and scale bytes.
/// Every value must be finite (callers check and name the tensor).
pub fn quantize_row(w: &[f32], codes: &mut [u32], scales: &mut [u8]) {
    assert_eq!(w.len() % GROUP, 0);
    assert_eq!(codes.len() * CODES_PER_WORD, w.len());
    assert_eq!(scales.len() * GROUP, w.len());
    codes.fill(0);
    for (g, group) in w.chunks_exact(GROUP).enumerate() {
        let max = group.iter().fold(0f32, |m, v| m.max(v.abs()));
        let sbyte = e4m3_encode(max / 6.0);
        scales[g] = sbyte;
        let s = e4m3_decode(sbyte);
        if s == 0.0 {
            continue;
        }
        for (j, &v) in group.iter().enumerate() {
            let c = g * GROUP + j;
            codes[c / CODES_PER_WORD] |= (e2m1_encode(v / s) as u32) << (4 * (c % CODES_PER_WORD));
        }
    }
}

/// Dequantise one packed row into `out` (length = 8 · codes.len()).
pub fn dequantize_row(codes: &[u32], scales: &[u8], out: &mut [f32]) {
    assert_eq!(codes.len() * CODES_PER_WORD, out.len());
    assert_eq!(scales.len() * GROUP, out.len());
    for (c, o) in out.iter_mut().enumerate() {
        let code = (codes[c / CODES_PER_WORD] >> (4 * (c % CODES_PER_WORD))) & 0xF;
        *o = e4m3_decode(scales[c / GROUP]) * e2m1_decode(code as u8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// E4M3 written out from the format's definition, independently of `e4m3_decode`:
    /// value = (-1)^s · 2^(e-7) · (1 + m/8) for e > 0, and (-1)^s · 2^-6 · m/8 for e = 0;
    /// NaN where every exponent and mantissa bit is set (E4M3 has no infinities).
    fn e4m3_spec(byte: u8) -> f64 {
        if byte & 0x7F == 0x7F {
            return f64::NAN;
        }
        let s = if byte & 0x80 != 0 { -1.0 } else { 1.0 };
        let e = ((byte >> 3) & 15) as i32;
        let m = (byte & 7) as f64;
        if e == 0 {
            s * m / 8.0 / 64.0
        } else {
            s * (1.0 + m / 8.0) * (2f64).powi(e - 7)
        }
    }

    #[test]
    fn decode_all_codes_times_all_scales_matches_spec_table() {
        let mags = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for code in 0u8..16 {
            let v = if code & 8 != 0 {
                -mags[(code & 7) as usize]
            } else {
                mags[(code & 7) as usize]
            };
            for sb in 0..=255u8 {
                let want = e4m3_spec(sb) * v;
                // One group of 16 copies of the code, dequantised through the packed path.
                let codes = [code as u32 * 0x1111_1111; 2];
                let scales = [sb];
                let mut out = [0f32; 16];
                dequantize_row(&codes, &scales, &mut out);
                for &o in &out {
                    let same = o as f64 == want || (o.is_nan() && want.is_nan());
                    assert!(same, "code {code:#x} scale {sb:#04x}: {o} against {want}");
                }
            }
        }
        // Specific anchors from docs/spec/laguna.md.
        assert!(e4m3_decode(0x7F).is_nan());
        assert!(e4m3_decode(0xFF).is_nan());
        assert_eq!(e4m3_decode(0x7E), 448.0);
        assert_eq!(e4m3_decode(0x38), 1.0);
        assert_eq!(e4m3_decode(0x01), 2f32.powi(-9));
    }

    #[test]
    fn nibble_packing_order() {
        // Element j of a word in bits 4j..4j+3: byte k holds element 2k low, 2k+1 high.
        let mut w = vec![0f32; 16];
        // Scale: max 6 -> 6/6 = 1.0 exactly -> codes are the magnitudes themselves.
        w[0] = 0.5; // code 1
        w[1] = 6.0; // code 7
        w[2] = -1.0; // code 0xA
        w[9] = 3.0; // code 5, second word element 1
        let mut codes = [0u32; 2];
        let mut scales = [0u8; 1];
        quantize_row(&w, &mut codes, &mut scales);
        assert_eq!(scales[0], 0x38);
        let bytes: Vec<u8> = codes.iter().flat_map(|c| c.to_le_bytes()).collect();
        assert_eq!(bytes[0], 0x71);
        assert_eq!(bytes[1], 0x0A);
        assert_eq!(bytes[4], 0x50);
        let mut back = vec![0f32; 16];
        dequantize_row(&codes, &scales, &mut back);
        assert_eq!(back, w);
    }

    #[test]
    fn e4m3_rounds_to_nearest_even_and_saturates() {
        assert_eq!(e4m3_encode(1.0), 0x38);
        // 1.0625 is midway between 1.0 (0x38, even) and 1.125 (0x39): ties to even.
        assert_eq!(e4m3_encode(1.0625), 0x38);
        // 1.1875 is midway between 1.125 (0x39) and 1.25 (0x3A, even).
        assert_eq!(e4m3_encode(1.1875), 0x3A);
        assert_eq!(e4m3_encode(1.07), 0x39);
        // 448 is the largest finite value: 0x7F is NaN, never an encoding.
        assert_eq!(e4m3_encode(464.0), 0x7E);
        assert_eq!(e4m3_encode(470.0), 0x7E);
        assert_eq!(e4m3_encode(1e6), 0x7E);
        assert_eq!(e4m3_encode(2f32.powi(-10)), 0x00); // tie between 0 and 2^-9 -> 0
        assert_eq!(e4m3_encode(0.0), 0x00);
        for b in 0u8..0x7F {
            assert_eq!(e4m3_encode(e4m3_decode(b)), b);
        }
    }

    #[test]
    fn e2m1_rounds_to_nearest_even() {
        let cases = [
            (0.25, 0),
            (0.26, 1),
            (0.75, 2),
            (1.25, 2),
            (1.75, 4),
            (2.5, 4),
            (3.5, 6),
            (5.0, 6),
            (5.01, 7),
            (100.0, 7),
            (-0.2, 0),
            (-1.5, 0xB),
        ];
        for (x, want) in cases {
            assert_eq!(e2m1_encode(x), want, "x = {x}");
        }
    }

    #[test]
    fn representable_values_round_trip() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        for _ in 0..2000 {
            // A group whose max is 6·s for an E4M3 scale s: every element is then exactly a code·s.
            let sb = rng.random_range(0x08u8..0x7F);
            let s = e4m3_decode(sb);
            let mut codes_in = [0u8; 16];
            for c in codes_in.iter_mut() {
                *c = rng.random_range(0..16);
            }
            codes_in[rng.random_range(0..16)] = 7 | (rng.random_range(0..2) << 3);
            let w: Vec<f32> = codes_in.iter().map(|&c| e2m1_decode(c) * s).collect();
            let mut codes = [0u32; 2];
            let mut scales = [0u8; 1];
            quantize_row(&w, &mut codes, &mut scales);
            assert_eq!(scales[0], sb);
            let mut back = [0f32; 16];
            dequantize_row(&codes, &scales, &mut back);
            assert_eq!(back.to_vec(), w);
            // Re-quantising the dequantised row is idempotent.
            let mut codes2 = [0u32; 2];
            let mut scales2 = [0u8; 1];
            quantize_row(&back, &mut codes2, &mut scales2);
            assert_eq!((codes2, scales2), (codes, scales));
        }
    }

    #[test]
    fn quantisation_error_is_bounded_on_random_data() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let n = 16 * 4099;
        let w: Vec<f32> = (0..n)
            .map(|_| {
                let u: f32 = rng.random_range(-1.0..1.0);
                u * 10f32.powf(rng.random_range(-3.0..2.0))
            })
            .collect();
        let mut codes = vec![0u32; n / 8];
        let mut scales = vec![0u8; n / 16];
        quantize_row(&w, &mut codes, &mut scales);
        let mut back = vec![0f32; n];
        dequantize_row(&codes, &scales, &mut back);
        let (mut err2, mut ref2) = (0f64, 0f64);
        for (g, (wg, bg)) in w.chunks(16).zip(back.chunks(16)).enumerate() {
            let max = wg.iter().fold(0f32, |m, v| m.max(v.abs()));
            let s = e4m3_decode(scales[g]);
            // The scale is max/6 rounded to 3 mantissa bits: within 1/16 relative.
            assert!(
                (s - max / 6.0).abs() <= max / 6.0 / 16.0 + 1e-9,
                "group {g}"
            );
            for (a, b) in wg.iter().zip(bg) {
                // Half the widest E2M1 gap (4 -> 6) times the scale.
                assert!((a - b).abs() <= s * 1.0 + 1e-9, "group {g}: {a} vs {b}");
                err2 += ((a - b) as f64).powi(2);
                ref2 += (*a as f64).powi(2);
            }
        }
        let rel = (err2 / ref2).sqrt();
        assert!(rel < 0.12, "relative RMS error {rel}");
    }
}
