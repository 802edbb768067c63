//! Synthetic checkpoints: deterministic random weights for a preset shape, written in the runtime
//! (or HF) layout with config, tokenizer, drafter and MANIFEST.
//!
//! Every value is a pure function of (seed, tensor name, element index) through a counter-based
//! hash (splitmix64), not a sequential RNG: any element can be produced independently, so the CUDA
//! backend can generate the same bytes directly in GPU memory, and writing is tensor by tensor.

use std::path::Path;

use indicatif::ProgressBar;
use safetensors::Dtype;

use crate::checkpoint::{
    f32_bytes, f32_to_bf16_bytes, u32_bytes, write_atomic, write_safetensors, LazyTensor,
};
use crate::config::{DrafterConfig, LagunaConfig};
use crate::error::{Error, Result};
use crate::inventory::{drafter_inventory, target_inventory, Layout, TensorSpec};
use crate::nvfp4::{dequantize_row, e4m3_encode, E2M1_MAGNITUDES};
use crate::tokenizer::synthetic_tokenizer_json;

/// A named pair of shapes: the target (runtime layout config) and its drafter.
pub struct Preset {
    pub name: &'static str,
    pub target: LagunaConfig,
    pub drafter: DrafterConfig,
}

pub const PRESETS: [&str; 2] = ["tiny", "xs2.1"];

/// The preset's name and its two config texts.
fn preset_texts(name: &str) -> Result<(&'static str, &'static str, &'static str)> {
    Ok(match name {
        "tiny" => (
            "tiny",
            include_str!("../presets/tiny/config.json"),
            include_str!("../presets/tiny/dflash-config.json"),
        ),
        "xs2.1" => (
            "xs2.1",
            include_str!("../presets/xs2.1/config.json"),
            include_str!("../presets/xs2.1/dflash-config.json"),
        ),
        other => {
            return Err(Error::Config(format!(
                "unknown preset {other:?} (known: {})",
                PRESETS.join(", ")
            )))
        }
    })
}

pub fn preset(name: &str) -> Result<Preset> {
    let (n, t, d) = preset_texts(name)?;
    let target = LagunaConfig::from_json_str(t)?;
    let drafter = DrafterConfig::from_json_str(d)?;
    drafter.check_target(&target)?;
    Ok(Preset {
        name: n,
        target,
        drafter,
    })
}

/// The identity of the synthetic checkpoint of preset `name` at `seed`, in place of a MANIFEST
/// digest: its weights are a pure function of the seed and the preset's shapes, so the digest is
/// the SHA-256 of both. A worker that generates them in GPU memory reports this, and a parent
/// computes the same to check it.
pub fn synthetic_digest(name: &str, seed: u64) -> Result<String> {
    use sha2::{Digest, Sha256};
    let (n, t, d) = preset_texts(name)?;
    let mut h = Sha256::new();
    h.update(format!("fastdecode synthetic checkpoint\npreset {n}\nseed {seed}\n").as_bytes());
    h.update(t.as_bytes());
    h.update(d.as_bytes());
    Ok(hex::encode(h.finalize()))
}

pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a of the tensor name: separates the streams of different tensors.
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

/// The per-tensor key of the counter-based generator.
pub fn tensor_key(seed: u64, name: &str) -> u64 {
    splitmix64(seed ^ fnv1a(name))
}

/// 64 random bits for element `i` of the tensor with `key`.
pub fn bits(key: u64, i: u64) -> u64 {
    splitmix64(key ^ i.wrapping_mul(0xD1B5_4A32_D192_ED03))
}

/// Uniform in [-1, 1), exactly representable in f32 (24 random bits).
pub fn uniform(key: u64, i: u64) -> f32 {
    (bits(key, i) >> 40) as f32 * (1.0 / (1 << 23) as f32) - 1.0
}

/// How a float tensor is drawn: `center + amplitude · uniform`.
pub fn float_law(name: &str, shape: &[usize]) -> (f32, f32) {
    if name.ends_with("norm.weight") || name.contains("norms.") {
        (1.0, 0.1)
    } else if name.ends_with("e_score_correction_bias") {
        (0.0, 0.05)
    } else if name.ends_with("embed_tokens.weight") {
        (0.0, 1.0)
    } else {
        // A [out, in] projection: variance 1/in keeps activations O(1) through 40 pre-norm layers.
        let fan_in = *shape.last().unwrap_or(&1) as f32;
        (0.0, (3.0 / fan_in).sqrt())
    }
}

/// The E4M3 scale byte around which an NVFP4 tensor of input width `fan_in` is drawn: uniform
/// random E2M1 codes have an RMS of sqrt(68.5/8) ≈ 2.93, so this gives weights of RMS ≈ 1/sqrt(in).
pub fn nvfp4_base_scale(fan_in: usize) -> u8 {
    let rms = (E2M1_MAGNITUDES.iter().map(|m| m * m).sum::<f32>() / 8.0).sqrt();
    e4m3_encode(1.0 / ((fan_in as f32).sqrt() * rms))
}

/// Word `i` of a synthetic NVFP4 code tensor: eight random codes, except that the first word of
/// every 16-code group has one code forced to magnitude 6 and there is no negative zero. Then each group's max |w| is 6·scale,
/// so re-quantising the dequantised values (`transform` of the HF layout) gives back exactly these
/// codes and scales.
pub fn nvfp4_code_word(key: u64, i: u64) -> u32 {
    let b = bits(key, i);
    let mut w = b as u32;
    // Negative zero (code 8) would come back as +0 from quantisation: make it +0 here.
    for j in 0..8 {
        if (w >> (4 * j)) & 0xF == 8 {
            w &= !(0xF << (4 * j));
        }
    }
    if i.is_multiple_of(2) {
        let j = ((b >> 32) & 7) as u32;
        w |= 7 << (4 * j);
    }
    w
}

/// Bytes of one tensor of the runtime layout (or the drafter), as `synth` writes them.
pub fn runtime_tensor_bytes(seed: u64, spec: &TensorSpec) -> Vec<u8> {
    let key = tensor_key(seed, &spec.name);
    let n = spec.numel() as u64;
    match spec.dtype {
        Dtype::U32 => u32_bytes(&(0..n).map(|i| nvfp4_code_word(key, i)).collect::<Vec<_>>()),
        Dtype::U8 => {
            // Scale bytes: the base scale ± one E4M3 step.
            let fan_in = spec.shape.last().unwrap() * 16;
            let base = nvfp4_base_scale(fan_in) as i32;
            (0..n)
                .map(|i| (base + (bits(key, i) % 3) as i32 - 1) as u8)
                .collect()
        }
        Dtype::BF16 | Dtype::F32 => {
            let (c, a) = float_law(&spec.name, &spec.shape);
            let v: Vec<f32> = (0..n).map(|i| c + a * uniform(key, i)).collect();
            if spec.dtype == Dtype::F32 {
                f32_bytes(&v)
            } else {
                f32_to_bf16_bytes(&v)
            }
        }
        other => unreachable!("no synthetic tensor of dtype {other:?}"),
    }
}

/// Dequantised values `[E or 1, rows, cols]` of one runtime NVFP4 pair `base.{weight,scales}`.
fn dequantized(seed: u64, base: &str, lead: &[usize], rows: usize, cols: usize) -> Vec<f32> {
    let part = |suffix: &str, dtype, last: usize| {
        let spec = TensorSpec {
            name: format!("{base}.{suffix}"),
            dtype,
            shape: [lead, &[rows, last]].concat(),
        };
        runtime_tensor_bytes(seed, &spec)
    };
    let codes: Vec<u32> = part("weight", Dtype::U32, cols / 8)
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let scales = part("scales", Dtype::U8, cols / 16);
    let total_rows: usize = lead.iter().product::<usize>() * rows;
    let mut out = vec![0f32; total_rows * cols];
    for r in 0..total_rows {
        dequantize_row(
            &codes[r * cols / 8..(r + 1) * cols / 8],
            &scales[r * cols / 16..(r + 1) * cols / 16],
            &mut out[r * cols..(r + 1) * cols],
        );
    }
    out
}

/// Bytes of one tensor of the HF layout holding the same numbers as the runtime layout: experts
/// are the dequantised NVFP4 values (exact in bf16), everything else is identical.
fn hf_tensor_bytes(seed: u64, c: &LagunaConfig, spec: &TensorSpec) -> Vec<u8> {
    let (h, e, mi, si) = (
        c.hidden_size,
        c.num_experts,
        c.moe_intermediate_size,
        c.shared_expert_intermediate_size,
    );
    if let Some(m) = spec.name.strip_suffix(".experts.gate_up_proj") {
        let g = dequantized(seed, &format!("{m}.switch_mlp.gate_proj"), &[e], mi, h);
        let u = dequantized(seed, &format!("{m}.switch_mlp.up_proj"), &[e], mi, h);
        let per = mi * h;
        let mut v = Vec::with_capacity(2 * e * per);
        for x in 0..e {
            v.extend_from_slice(&g[x * per..(x + 1) * per]);
            v.extend_from_slice(&u[x * per..(x + 1) * per]);
        }
        return f32_to_bf16_bytes(&v);
    }
    if let Some(m) = spec.name.strip_suffix(".experts.down_proj") {
        return f32_to_bf16_bytes(&dequantized(
            seed,
            &format!("{m}.switch_mlp.down_proj"),
            &[e],
            h,
            mi,
        ));
    }
    if let Some(m) = spec.name.strip_suffix(".experts.e_score_correction_bias") {
        // HfSaved: the same values as the runtime bias, under its HF name.
        let rt = TensorSpec {
            name: format!("{m}.gate.e_score_correction_bias"),
            ..spec.clone()
        };
        return runtime_tensor_bytes(seed, &rt);
    }
    if let Some(rest) = spec.name.strip_suffix(".weight") {
        // HfSaved per-expert tensors: one expert's slice of the stacked values.
        if let Some((m, tail)) = rest.split_once(".experts.") {
            if let Some((x, proj)) = tail.split_once('.') {
                let x: usize = x.parse().expect("inventory names carry expert indices");
                let (rows, cols) = if proj == "down_proj" {
                    (h, mi)
                } else {
                    (mi, h)
                };
                let all = dequantized(seed, &format!("{m}.switch_mlp.{proj}"), &[e], rows, cols);
                return f32_to_bf16_bytes(&all[x * rows * cols..(x + 1) * rows * cols]);
            }
        }
        let shared = rest
            .split_once(".shared_experts.")
            .or_else(|| rest.split_once(".shared_expert."));
        if let Some((m, proj)) = shared {
            let (rows, cols) = if proj == "down_proj" {
                (h, si)
            } else {
                (si, h)
            };
            return f32_to_bf16_bytes(&dequantized(
                seed,
                &format!("{m}.shared_expert.{proj}"),
                &[],
                rows,
                cols,
            ));
        }
    }
    runtime_tensor_bytes(seed, spec)
}

/// Writes `specs` to `path`, producing each tensor's bytes on demand.
fn write_tensors<'a>(
    path: &Path,
    specs: &'a [TensorSpec],
    produce: &'a (dyn Fn(&TensorSpec) -> Vec<u8> + 'a),
    progress: &'a ProgressBar,
) -> Result<()> {
    let tensors = specs
        .iter()
        .map(|s| {
            (
                s.name.clone(),
                LazyTensor {
                    dtype: s.dtype,
                    shape: s.shape.clone(),
                    produce: Box::new(move || {
                        let b = produce(s);
                        progress.inc(b.len() as u64);
                        b
                    }),
                },
            )
        })
        .collect();
    write_safetensors(path, tensors)
}

pub fn pretty_json(v: &serde_json::Value) -> Vec<u8> {
    let mut s = serde_json::to_string_pretty(v).expect("JSON values always serialise");
    s.push('\n');
    s.into_bytes()
}

/// Writes a synthetic target + drafter checkpoint directory. Returns the MANIFEST digest.
pub fn write_synthetic(
    out: &Path,
    preset: &Preset,
    seed: u64,
    layout: Layout,
    progress: &ProgressBar,
) -> Result<String> {
    let mut target = preset.target.clone();
    if layout.is_hf() {
        target.quantization = None;
    }
    let t_specs = target_inventory(&target, layout);
    let d_specs = drafter_inventory(&preset.drafter);
    let total: usize = t_specs.iter().chain(&d_specs).map(TensorSpec::nbytes).sum();
    progress.set_length(total as u64);
    crate::files::check_free_space(out, total as u64)?;
    crate::manifest::write_pinned_dir(out, |dir| {
        write_atomic(&dir.join("config.json"), &pretty_json(&target.to_hf_json()))?;
        let produce = |s: &TensorSpec| match layout {
            Layout::Runtime => runtime_tensor_bytes(seed, s),
            Layout::Hf | Layout::HfSaved => hf_tensor_bytes(seed, &target, s),
        };
        write_tensors(&dir.join("model.safetensors"), &t_specs, &produce, progress)?;
        write_atomic(
            &dir.join("tokenizer.json"),
            synthetic_tokenizer_json(&target, preset.drafter.mask_token_id)?.as_bytes(),
        )?;
        let ddir = dir.join("drafter");
        std::fs::create_dir(&ddir).map_err(|e| Error::io(&ddir, e))?;
        write_atomic(
            &ddir.join("config.json"),
            &pretty_json(&preset.drafter.to_hf_json()),
        )?;
        let produce = |s: &TensorSpec| runtime_tensor_bytes(seed, s);
        write_tensors(
            &ddir.join("model.safetensors"),
            &d_specs,
            &produce,
            progress,
        )?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_parse_and_tiny_has_every_feature() {
        let p = preset("tiny").unwrap();
        let t = &p.target;
        assert!(t.layer_types.contains(&crate::config::LayerType::Full));
        assert!(t.layer_types.contains(&crate::config::LayerType::Sliding));
        let heads: std::collections::BTreeSet<_> = t.num_attention_heads_per_layer.iter().collect();
        assert!(
            heads.len() > 1,
            "full and sliding layers differ in head count"
        );
        assert!(matches!(
            t.rope_full.scaling,
            crate::config::RopeScaling::Yarn(_)
        ));
        assert!(t.rope_full.partial_rotary_factor < 1.0);
        assert!(!t.is_sparse(0) && t.is_sparse(1));
        assert!(t.num_experts_per_tok >= 2 && t.shared_expert_intermediate_size > 0);
        assert!(t.sliding_window <= 64);
        let params: usize = target_inventory(t, Layout::Hf)
            .iter()
            .map(TensorSpec::numel)
            .sum();
        assert!((1_000_000..10_000_000).contains(&params), "{params}");
        assert_eq!(preset("xs2.1").unwrap().target.num_hidden_layers, 40);
        assert!(preset("huge").is_err());
    }

    /// The `xs2.1` preset is Laguna XS 2.1's released `config.json` and `dflash-config.json` byte
    /// for byte. The digests were taken when the copies were compared (`cmp`) with the release's
    /// files; an edit to a preset file fails here instead of silently drifting from the release.
    #[test]
    fn xs21_preset_is_the_release_config_verbatim() {
        use sha2::{Digest, Sha256};
        for (f, sha) in [
            (
                "config.json",
                "129dc0b8e7528f5dab6a856468b03dfb56f387b7efbe543022c3edc6f7e3e650",
            ),
            (
                "dflash-config.json",
                "ec2c95d22e59cde02d66c3944c54cd0ae842027c8884445f416c3681bafaac7e",
            ),
        ] {
            let bytes = std::fs::read(crate::fixtures::xs21(f)).unwrap();
            assert_eq!(
                hex::encode(Sha256::digest(&bytes)),
                sha,
                "presets/xs2.1/{f} is no longer the released file"
            );
        }
    }

    #[test]
    fn generator_is_a_pure_function_of_seed_name_index() {
        let k = tensor_key(5, "a");
        assert_eq!(uniform(k, 17), uniform(tensor_key(5, "a"), 17));
        assert_ne!(uniform(k, 17), uniform(tensor_key(6, "a"), 17));
        assert_ne!(uniform(k, 17), uniform(tensor_key(5, "b"), 17));
        let xs: Vec<f32> = (0..10000).map(|i| uniform(k, i)).collect();
        assert!(xs.iter().all(|x| (-1.0..1.0).contains(x)));
        let mean = xs.iter().sum::<f32>() / xs.len() as f32;
        assert!(mean.abs() < 0.05, "{mean}");
    }
}
