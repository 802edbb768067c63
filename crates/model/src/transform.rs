//! `transform IN OUT`: an HF-layout checkpoint to the NVFP4 runtime layout.
//!
//! Byte-reproducible: the output depends only on the input bytes (tensors in canonical order, JSON
//! with sorted keys, no timestamps), is written into a staging directory and renamed when complete.
//! Routed and shared experts of sparse layers are quantised to NVFP4 (`nvfp4::quantize_row`);
//! every other tensor becomes BF16 (bit-identical when it already was), the router bias stays F32.

use std::cell::RefCell;
use std::path::Path;

use indicatif::ProgressBar;
use safetensors::Dtype;
use serde_json::{json, Value};

use crate::checkpoint::{
    f32_bytes, f32_to_bf16_bytes, u32_bytes, write_atomic, write_safetensors, LazyTensor,
    TensorStore,
};
use crate::config::{DrafterConfig, LagunaConfig};
use crate::error::{Error, Result};
use crate::files::{read_bounded, read_text, refuse_overlap, MAX_TEXT_BYTES};
use crate::inventory::{drafter_inventory, target_inventory, Layout, TensorSpec};
use crate::manifest::write_pinned_dir;
use crate::nvfp4::quantize_row;
use crate::synth::pretty_json;

/// Small files copied unchanged from IN to OUT when present.
const SIDE_FILES: [&str; 4] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
];

/// Where a runtime NVFP4 tensor's values come from in an HF layout: rows `[row0, row0 + rows)` of
/// each listed tensor, concatenated (one segment per expert), each row `cols` wide.
struct ExpertSource {
    segments: Vec<(String, usize, usize)>,
    cols: usize,
}

fn expert_source(
    c: &LagunaConfig,
    layout: Layout,
    runtime_name: &str,
) -> Option<(ExpertSource, bool)> {
    let (base, is_scales) = if let Some(b) = runtime_name.strip_suffix(".weight") {
        (b, false)
    } else {
        (runtime_name.strip_suffix(".scales")?, true)
    };
    let (h, e, mi, si) = (
        c.hidden_size,
        c.num_experts,
        c.moe_intermediate_size,
        c.shared_expert_intermediate_size,
    );
    let src = if let Some((m, proj)) = base.split_once(".switch_mlp.") {
        let cols = if proj == "down_proj" { mi } else { h };
        let segments = (0..e)
            .map(|x| match (layout, proj) {
                (Layout::HfSaved, _) => (
                    format!("{m}.experts.{x}.{proj}.weight"),
                    0,
                    if proj == "down_proj" { h } else { mi },
                ),
                (_, "gate_proj") => (format!("{m}.experts.gate_up_proj"), 2 * mi * x, mi),
                (_, "up_proj") => (format!("{m}.experts.gate_up_proj"), 2 * mi * x + mi, mi),
                _ => (format!("{m}.experts.down_proj"), h * x, h),
            })
            .collect();
        ExpertSource { segments, cols }
    } else if let Some((m, proj)) = base.split_once(".shared_expert.") {
        let (rows, cols) = if proj == "down_proj" {
            (h, si)
        } else {
            (si, h)
        };
        let name = if layout == Layout::HfSaved {
            format!("{m}.shared_expert.{proj}.weight")
        } else {
            format!("{m}.shared_experts.{proj}.weight")
        };
        ExpertSource {
            segments: vec![(name, 0, rows)],
            cols,
        }
    } else {
        return None;
    };
    Some((src, is_scales))
}

/// Quantises the source rows; returns packed codes or scale bytes.
fn quantize_source(store: &TensorStore, s: &ExpertSource, scales_out: bool) -> Result<Vec<u8>> {
    let mut codes = vec![0u32; s.cols / 8];
    let mut scales = vec![0u8; s.cols / 16];
    let mut out = vec![];
    for (name, row0, rows) in &s.segments {
        let all = store.get(name)?.to_f32()?;
        // `to_f32` has refused non-finite values, which no NVFP4 code can hold.
        for r in *row0..row0 + rows {
            let at = r * s.cols;
            quantize_row(&all[at..at + s.cols], &mut codes, &mut scales);
            if scales_out {
                out.extend_from_slice(&scales);
            } else {
                out.extend_from_slice(&u32_bytes(&codes));
            }
        }
    }
    Ok(out)
}

/// A float tensor converted to the runtime dtype; `layout` maps the router bias's HF name.
fn float_bytes(store: &TensorStore, layout: Layout, spec: &TensorSpec) -> Result<Vec<u8>> {
    let name = match spec.name.strip_suffix(".gate.e_score_correction_bias") {
        Some(m) if layout == Layout::HfSaved => format!("{m}.experts.e_score_correction_bias"),
        _ => spec.name.clone(),
    };
    let v = store.get(&name)?.to_f32()?;
    Ok(if spec.dtype == Dtype::F32 {
        f32_bytes(&v)
    } else {
        f32_to_bf16_bytes(&v)
    })
}

/// Writes `specs` drawn from `store` by `produce`; the first error aborts the file (the writer
/// cannot fail mid-stream, so the error is kept and reported after the write is discarded).
fn convert(
    path: &Path,
    specs: &[TensorSpec],
    produce: &dyn Fn(&TensorSpec) -> Result<Vec<u8>>,
    progress: &ProgressBar,
) -> Result<()> {
    let failure: RefCell<Option<Error>> = RefCell::new(None);
    let tensors = specs
        .iter()
        .map(|s| {
            let failure = &failure;
            (
                s.name.clone(),
                LazyTensor {
                    dtype: s.dtype,
                    shape: s.shape.clone(),
                    produce: Box::new(move || {
                        let n = s.nbytes();
                        progress.inc(n as u64);
                        if failure.borrow().is_some() {
                            return vec![0; n];
                        }
                        match produce(s) {
                            Ok(b) => b,
                            Err(e) => {
                                *failure.borrow_mut() = Some(e);
                                vec![0; n]
                            }
                        }
                    }),
                },
            )
        })
        .collect();
    let written = write_safetensors(path, tensors);
    if let Some(e) = failure.into_inner() {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    written
}

fn read_json(path: &Path) -> Result<Value> {
    let text = read_text(path)?;
    serde_json::from_str(&text)
        .map_err(|e| Error::Config(format!("invalid JSON: {e}")).in_file(path))
}

/// Converts the HF checkpoint in `input` (and its `drafter/`, if any) into `output`.
/// Returns the MANIFEST digest of the output.
pub fn transform(input: &Path, output: &Path, progress: &ProgressBar) -> Result<String> {
    let cfg_path = input.join("config.json");
    // Checked before the long part: written into its input, the output would change the input
    // under its own MANIFEST.
    crate::files::check_new_dir(output, false)?;
    refuse_overlap(output, input, "input directory")?;
    let cfg = LagunaConfig::from_file(&cfg_path)?;
    if cfg.quantization.is_some() {
        return Err(Error::Checkpoint(format!(
            "{}: already the runtime layout (its config has `quantization`)",
            cfg_path.display()
        )));
    }
    let store = TensorStore::open_dir(input)?;
    let layout = Layout::detect(&cfg, store.names());
    store.check(&target_inventory(&cfg, layout), true)?;
    let mut rt_cfg = cfg.clone();
    rt_cfg.quantization = Some(crate::config::Quantization {
        group_size: 16,
        bits: 4,
    });
    let specs = target_inventory(&rt_cfg, Layout::Runtime);

    let ddir = input.join("drafter");
    let drafter = if ddir.join("config.json").exists() {
        let dcfg = DrafterConfig::from_file(&ddir.join("config.json"))?;
        dcfg.check_target(&cfg)
            .map_err(|e| e.in_file(&ddir.join("config.json")))?;
        let dstore = TensorStore::open_dir(&ddir)?;
        let dspecs = drafter_inventory(&dcfg);
        dstore.check(&dspecs, true)?;
        Some((dstore, dspecs))
    } else {
        None
    };
    let total: usize = specs
        .iter()
        .chain(drafter.iter().flat_map(|(_, s)| s))
        .map(TensorSpec::nbytes)
        .sum();
    progress.set_length(total as u64);
    crate::files::check_free_space(output, total as u64)?;

    // The original config, kept field for field, plus the quantization blocks.
    let mut cfg_json = read_json(&cfg_path)?;
    let q = json!({"group_size": 16, "bits": 4, "mode": "nvfp4"});
    cfg_json["quantization"] = q.clone();
    cfg_json["quantization_config"] = q;

    write_pinned_dir(output, |dir| {
        write_atomic(&dir.join("config.json"), &pretty_json(&cfg_json))?;
        let produce = |s: &TensorSpec| match expert_source(&rt_cfg, layout, &s.name) {
            Some((src, is_scales)) => quantize_source(&store, &src, is_scales),
            None => float_bytes(&store, layout, s),
        };
        convert(&dir.join("model.safetensors"), &specs, &produce, progress)?;
        for f in SIDE_FILES {
            let p = input.join(f);
            if p.symlink_metadata().is_ok() {
                write_atomic(&dir.join(f), &read_bounded(&p, MAX_TEXT_BYTES)?)?;
            }
        }
        if let Some((dstore, dspecs)) = &drafter {
            let od = dir.join("drafter");
            std::fs::create_dir(&od).map_err(|e| Error::io(&od, e))?;
            write_atomic(
                &od.join("config.json"),
                &pretty_json(&read_json(&ddir.join("config.json"))?),
            )?;
            let produce = |s: &TensorSpec| float_bytes(dstore, Layout::Runtime, s);
            convert(&od.join("model.safetensors"), dspecs, &produce, progress)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::synth::{preset, write_synthetic};

    fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut v = vec![];
        for rel in [
            "model.safetensors",
            "drafter/model.safetensors",
            "tokenizer.json",
            "MANIFEST",
        ] {
            v.push((rel.to_string(), std::fs::read(dir.join(rel)).unwrap()));
        }
        v
    }

    /// The tiny preset synthesised into `dir` at `seed`, in `layout`; returns `dir`.
    fn tiny(dir: PathBuf, seed: u64, layout: Layout) -> PathBuf {
        let p = preset("tiny").unwrap();
        write_synthetic(&dir, &p, seed, layout, &ProgressBar::hidden()).unwrap();
        dir
    }

    #[test]
    fn transform_of_hf_synth_equals_runtime_synth_and_is_reproducible() {
        let tmp = tempfile::tempdir().unwrap();
        let hidden = ProgressBar::hidden();
        let hf = tiny(tmp.path().join("hf"), 11, Layout::Hf);
        let rt = tiny(tmp.path().join("rt"), 11, Layout::Runtime);
        let a = tmp.path().join("a");
        let b = tmp.path().join("b");
        let da = transform(&hf, &a, &hidden).unwrap();
        let db = transform(&hf, &b, &hidden).unwrap();
        assert_eq!(da, db, "transform twice gives the same digest");
        assert!(files(&a) == files(&b), "transform is byte-reproducible");
        // The quantisation is lossless on NVFP4-representable experts: same tensors as direct synth.
        for f in ["model.safetensors", "drafter/model.safetensors"] {
            let same = std::fs::read(a.join(f)).unwrap() == std::fs::read(rt.join(f)).unwrap();
            assert!(same, "{f}: transform(HF synth) differs from runtime synth");
        }
        crate::manifest::verify(&a, &hidden).unwrap();
        // Nothing but the outputs is left beside them (no staging directory).
        let mut left: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["a", "b", "hf", "rt"]);
        // Refuses to overwrite, and refuses a runtime-layout input.
        assert!(transform(&hf, &a, &hidden)
            .unwrap_err()
            .to_string()
            .contains("already exists"));
        let e = transform(&rt, &tmp.path().join("c"), &hidden)
            .unwrap_err()
            .to_string();
        assert!(e.contains("already the runtime layout"), "{e}");
    }

    #[test]
    fn transform_of_the_per_expert_hf_layout_equals_runtime_synth() {
        let tmp = tempfile::tempdir().unwrap();
        let hidden = ProgressBar::hidden();
        let hf = tiny(tmp.path().join("hf-saved"), 5, Layout::HfSaved);
        let store = TensorStore::open_dir(&hf).unwrap();
        assert!(store.contains("model.layers.1.mlp.experts.31.down_proj.weight"));
        assert!(store.contains("model.layers.1.mlp.shared_expert.up_proj.weight"));
        let rt = tiny(tmp.path().join("rt"), 5, Layout::Runtime);
        let out = tmp.path().join("out");
        transform(&hf, &out, &hidden).unwrap();
        let same = std::fs::read(out.join("model.safetensors")).unwrap()
            == std::fs::read(rt.join("model.safetensors")).unwrap();
        assert!(
            same,
            "transform(per-expert HF synth) differs from runtime synth"
        );
    }

    #[test]
    fn synth_is_reproducible_and_seed_sensitive() {
        let tmp = tempfile::tempdir().unwrap();
        let p = preset("tiny").unwrap();
        let hidden = ProgressBar::hidden();
        let d1 = write_synthetic(&tmp.path().join("1"), &p, 3, Layout::Runtime, &hidden).unwrap();
        let d2 = write_synthetic(&tmp.path().join("2"), &p, 3, Layout::Runtime, &hidden).unwrap();
        let d3 = write_synthetic(&tmp.path().join("3"), &p, 4, Layout::Runtime, &hidden).unwrap();
        assert_eq!(d1, d2);
        assert_ne!(d1, d3);
        assert!(files(&tmp.path().join("1")) == files(&tmp.path().join("2")));
    }

    #[test]
    fn transform_rejects_bad_inputs_naming_the_tensor() {
        let tmp = tempfile::tempdir().unwrap();
        let hidden = ProgressBar::hidden();
        let hf = tiny(tmp.path().join("hf"), 1, Layout::Hf);
        // Truncated safetensors file.
        let bytes = std::fs::read(hf.join("model.safetensors")).unwrap();
        let cut = tmp.path().join("cut");
        std::fs::create_dir(&cut).unwrap();
        std::fs::copy(hf.join("config.json"), cut.join("config.json")).unwrap();
        std::fs::write(cut.join("model.safetensors"), &bytes[..bytes.len() - 100]).unwrap();
        let e = transform(&cut, &tmp.path().join("o1"), &hidden)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("model.safetensors") && e.contains("truncated"),
            "{e}"
        );
        let left = std::fs::read_dir(tmp.path()).unwrap().count();
        assert!(
            !tmp.path().join("o1").exists() && left == 2,
            "a failed run leaves nothing"
        );
    }
}
