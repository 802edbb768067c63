//! The canonical tensor inventory of a checkpoint: every tensor's name, dtype and shape, derived from
//! the config alone. Loading checks a checkpoint against it, `synth` writes exactly it, and its text
//! form (`name<TAB>dtype<TAB>shape`, sorted by name) identifies a layout by its sha256.

use safetensors::Dtype;
use sha2::{Digest, Sha256};

use crate::config::{DrafterConfig, LagunaConfig};
use crate::nvfp4::{CODES_PER_WORD, GROUP};

/// Checkpoint layouts: the two of `docs/spec/laguna.md`, plus the per-expert form HF
/// transformers actually writes to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `docs/spec/laguna.md`'s HF layout (transformers' in-memory state dict): stacked experts
    /// `mlp.experts.gate_up_proj` [E, 2I, H] and `mlp.experts.down_proj` [E, H, I],
    /// `mlp.shared_experts.*`, `mlp.gate.e_score_correction_bias`.
    Hf,
    /// What transformers 5.x `save_pretrained` writes for Laguna: one tensor per expert
    /// `mlp.experts.{e}.{gate,up,down}_proj.weight`, `mlp.shared_expert.*` (singular) and
    /// `mlp.experts.e_score_correction_bias` (in the model dtype); `from_pretrained` fuses these
    /// into the `Hf` names on load.
    HfSaved,
    /// The NVFP4 runtime layout (`mlp.switch_mlp.*`, `mlp.shared_expert.*`).
    Runtime,
}

impl Layout {
    /// A runtime checkpoint's config carries a `quantization` block; an HF one does not (its
    /// expert naming is told apart by `detect`).
    pub fn of(cfg: &LagunaConfig) -> Layout {
        if cfg.quantization.is_some() {
            Layout::Runtime
        } else {
            Layout::Hf
        }
    }

    /// The layout of a checkpoint with this config and these tensor names.
    pub fn detect<'a>(cfg: &LagunaConfig, mut names: impl Iterator<Item = &'a str>) -> Layout {
        match Layout::of(cfg) {
            Layout::Runtime => Layout::Runtime,
            _ if names.any(|n| n.contains(".mlp.experts.0.")) => Layout::HfSaved,
            _ => Layout::Hf,
        }
    }

    pub fn is_hf(self) -> bool {
        self != Layout::Runtime
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
}

impl TensorSpec {
    fn new(name: String, dtype: Dtype, shape: &[usize]) -> Self {
        TensorSpec {
            name,
            dtype,
            shape: shape.to_vec(),
        }
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn nbytes(&self) -> usize {
        self.numel() * (self.dtype.bitsize() / 8)
    }
}

/// The gated attention tensors under `a` (`…self_attn`): (query heads, kv heads, head_dim, hidden).
fn attention_specs(v: &mut Vec<TensorSpec>, a: &str, (nh, kv, d, h): (usize, usize, usize, usize)) {
    let bf = Dtype::BF16;
    let projections = [
        ("q_proj", [nh * d, h]),
        ("k_proj", [kv * d, h]),
        ("v_proj", [kv * d, h]),
        ("o_proj", [h, nh * d]),
        ("g_proj", [nh, h]),
    ];
    for (name, shape) in projections {
        v.push(TensorSpec::new(format!("{a}.{name}.weight"), bf, &shape));
    }
    for name in ["q_norm", "k_norm"] {
        v.push(TensorSpec::new(format!("{a}.{name}.weight"), bf, &[d]));
    }
}

/// The SwiGLU triple under `p`: `gate_proj` and `up_proj` [inter, hidden], `down_proj` [hidden, inter].
fn swiglu_specs(v: &mut Vec<TensorSpec>, p: &str, inter: usize, h: usize) {
    let bf = Dtype::BF16;
    v.push(TensorSpec::new(
        format!("{p}.gate_proj.weight"),
        bf,
        &[inter, h],
    ));
    v.push(TensorSpec::new(
        format!("{p}.up_proj.weight"),
        bf,
        &[inter, h],
    ));
    v.push(TensorSpec::new(
        format!("{p}.down_proj.weight"),
        bf,
        &[h, inter],
    ));
}

/// The NVFP4 pair (codes, scales) of a `[rows, cols]` weight, with an optional leading expert axis.
fn nvfp4_pair(out: &mut Vec<TensorSpec>, base: &str, lead: &[usize], rows: usize, cols: usize) {
    let shape = |last: usize| [lead, &[rows, last]].concat();
    out.push(TensorSpec::new(
        format!("{base}.weight"),
        Dtype::U32,
        &shape(cols / CODES_PER_WORD),
    ));
    out.push(TensorSpec::new(
        format!("{base}.scales"),
        Dtype::U8,
        &shape(cols / GROUP),
    ));
}

/// Every tensor of a target checkpoint in `layout`, sorted by name.
pub fn target_inventory(c: &LagunaConfig, layout: Layout) -> Vec<TensorSpec> {
    let bf = Dtype::BF16;
    let (h, d, kv) = (c.hidden_size, c.head_dim, c.num_key_value_heads);
    let mut v = vec![
        TensorSpec::new("model.embed_tokens.weight".into(), bf, &[c.vocab_size, h]),
        TensorSpec::new("model.norm.weight".into(), bf, &[h]),
    ];
    if !c.tie_word_embeddings {
        v.push(TensorSpec::new(
            "lm_head.weight".into(),
            bf,
            &[c.vocab_size, h],
        ));
    }
    for i in 0..c.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let nh = c.heads(i);
        for n in ["input_layernorm", "post_attention_layernorm"] {
            v.push(TensorSpec::new(format!("{p}.{n}.weight"), bf, &[h]));
        }
        attention_specs(&mut v, &format!("{p}.self_attn"), (nh, kv, d, h));
        let m = format!("{p}.mlp");
        if !c.is_sparse(i) {
            swiglu_specs(&mut v, &m, c.intermediate_size, h);
            continue;
        }
        let (e, mi, si) = (
            c.num_experts,
            c.moe_intermediate_size,
            c.shared_expert_intermediate_size,
        );
        v.push(TensorSpec::new(format!("{m}.gate.weight"), bf, &[e, h]));
        // transformers saves the router bias under `experts`, in the model dtype (any float dtype
        // is accepted when reading HF checkpoints); everywhere else it is `gate.…`, F32.
        let bias = if layout == Layout::HfSaved {
            format!("{m}.experts.e_score_correction_bias")
        } else {
            format!("{m}.gate.e_score_correction_bias")
        };
        v.push(TensorSpec::new(bias, Dtype::F32, &[e]));
        match layout {
            Layout::Hf => {
                v.push(TensorSpec::new(
                    format!("{m}.experts.gate_up_proj"),
                    bf,
                    &[e, 2 * mi, h],
                ));
                v.push(TensorSpec::new(
                    format!("{m}.experts.down_proj"),
                    bf,
                    &[e, h, mi],
                ));
                swiglu_specs(&mut v, &format!("{m}.shared_experts"), si, h);
            }
            Layout::HfSaved => {
                for x in 0..e {
                    swiglu_specs(&mut v, &format!("{m}.experts.{x}"), mi, h);
                }
                swiglu_specs(&mut v, &format!("{m}.shared_expert"), si, h);
            }
            Layout::Runtime => {
                let s = format!("{m}.switch_mlp");
                nvfp4_pair(&mut v, &format!("{s}.gate_proj"), &[e], mi, h);
                nvfp4_pair(&mut v, &format!("{s}.up_proj"), &[e], mi, h);
                nvfp4_pair(&mut v, &format!("{s}.down_proj"), &[e], h, mi);
                let s = format!("{m}.shared_expert");
                nvfp4_pair(&mut v, &format!("{s}.gate_proj"), &[], si, h);
                nvfp4_pair(&mut v, &format!("{s}.up_proj"), &[], si, h);
                nvfp4_pair(&mut v, &format!("{s}.down_proj"), &[], h, si);
            }
        }
    }
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

/// Every tensor of a DFlash drafter checkpoint (BF16, never quantised), sorted by name.
pub fn drafter_inventory(c: &DrafterConfig) -> Vec<TensorSpec> {
    let bf = Dtype::BF16;
    let (h, d) = (c.hidden_size, c.head_dim);
    let (nh, kv, t) = (
        c.num_attention_heads,
        c.num_key_value_heads,
        c.target_layer_ids.len(),
    );
    let mut v = vec![
        TensorSpec::new("fc.weight".into(), bf, &[h, t * h]),
        TensorSpec::new("hidden_norm.weight".into(), bf, &[h]),
        TensorSpec::new("norm.weight".into(), bf, &[h]),
    ];
    for j in 0..t {
        v.push(TensorSpec::new(
            format!("aux_hidden_norms.{j}.weight"),
            bf,
            &[h],
        ));
    }
    for i in 0..c.num_hidden_layers {
        let p = format!("layers.{i}");
        for n in ["input_layernorm", "post_attention_layernorm"] {
            v.push(TensorSpec::new(format!("{p}.{n}.weight"), bf, &[h]));
        }
        attention_specs(&mut v, &format!("{p}.self_attn"), (nh, kv, d, h));
        swiglu_specs(&mut v, &format!("{p}.mlp"), c.intermediate_size, h);
    }
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

/// safetensors' spelling of a dtype (`BF16`, `F32`, `U32`, `U8`).
pub fn dtype_name(d: Dtype) -> String {
    format!("{d:?}")
}

/// The canonical inventory text: `name\tdtype\tshape\n` per tensor, sorted by name (byte order).
pub fn inventory_text(specs: &[TensorSpec]) -> String {
    let mut sorted: Vec<&TensorSpec> = specs.iter().collect();
    sorted.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
    let mut s = String::new();
    for t in sorted {
        let shape: Vec<String> = t.shape.iter().map(|x| x.to_string()).collect();
        s.push_str(&format!(
            "{}\t{}\t{}\n",
            t.name,
            dtype_name(t.dtype),
            shape.join(",")
        ));
    }
    s
}

pub fn inventory_sha256(specs: &[TensorSpec]) -> String {
    hex::encode(Sha256::digest(inventory_text(specs).as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn xs() -> LagunaConfig {
        LagunaConfig::from_file(&crate::fixtures::xs21("config.json")).unwrap()
    }

    #[test]
    fn xs21_runtime_inventory_is_the_real_release() {
        let inv = target_inventory(&xs(), Layout::Runtime);
        assert_eq!(inv.len(), 912);
        let mut by_dtype: BTreeMap<String, usize> = BTreeMap::new();
        for t in &inv {
            *by_dtype.entry(dtype_name(t.dtype)).or_default() += 1;
        }
        assert_eq!(by_dtype["BF16"], 405);
        assert_eq!(by_dtype["F32"], 39);
        assert_eq!(by_dtype["U32"], 234);
        assert_eq!(by_dtype["U8"], 234);
        let bytes: usize = inv.iter().map(TensorSpec::nbytes).sum();
        assert_eq!(bytes, 21_561_408_512);
        let find = |n: &str| inv.iter().find(|t| t.name == n).unwrap().shape.clone();
        let shapes: &[(&str, &[usize])] = &[
            ("layers.1.mlp.switch_mlp.gate_proj.weight", &[256, 512, 256]),
            ("layers.1.mlp.switch_mlp.gate_proj.scales", &[256, 512, 128]),
            ("layers.7.mlp.switch_mlp.down_proj.weight", &[256, 2048, 64]),
            ("layers.7.mlp.switch_mlp.down_proj.scales", &[256, 2048, 32]),
            ("layers.39.mlp.shared_expert.gate_proj.weight", &[512, 256]),
            ("layers.39.mlp.shared_expert.gate_proj.scales", &[512, 128]),
            ("layers.0.self_attn.q_proj.weight", &[6144, 2048]),
            ("layers.1.self_attn.q_proj.weight", &[8192, 2048]),
        ];
        for &(name, shape) in shapes {
            assert_eq!(find(&format!("model.{name}")), shape, "{name}");
        }
    }

    #[test]
    fn inventory_text_is_sorted_tab_separated() {
        let inv = target_inventory(&xs(), Layout::Runtime);
        let text = inventory_text(&inv);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 912);
        assert!(text.ends_with('\n'));
        let mut sorted = lines.clone();
        sorted.sort();
        assert_eq!(lines, sorted);
        assert!(lines.contains(&"lm_head.weight\tBF16\t100352,2048"));
        assert!(lines.contains(&"model.layers.1.mlp.gate.e_score_correction_bias\tF32\t256"));
    }

    #[test]
    fn xs21_drafter_inventory_has_about_462m_parameters() {
        let d = DrafterConfig::from_file(&crate::fixtures::xs21("dflash-config.json")).unwrap();
        let inv = drafter_inventory(&d);
        let params: usize = inv.iter().map(TensorSpec::numel).sum();
        assert!((450_000_000..475_000_000).contains(&params), "{params}");
        assert_eq!(
            inv.iter().find(|t| t.name == "fc.weight").unwrap().shape,
            vec![2048, 5 * 2048]
        );
    }
}
