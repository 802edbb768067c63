//! Typed Laguna and DFlash drafter configurations, parsed from HF `config.json`.
//!
//! The raw JSON is read into permissive `Raw*` structs, then validated into typed configs whose
//! invariants the rest of the engine relies on (every per-layer list has one entry per layer, query
//! heads divide evenly into kv heads, top-k fits the expert count, ...). Every validation error names
//! the offending field so a user can fix the file.

use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::path::Path;

use crate::error::{Error, Result};

/// Attention kind of one decoder layer (`layer_types`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerType {
    Full,
    Sliding,
}

impl LayerType {
    pub fn hf_name(self) -> &'static str {
        match self {
            LayerType::Full => "full_attention",
            LayerType::Sliding => "sliding_attention",
        }
    }
}

/// Feed-forward kind of one decoder layer (`mlp_layer_types`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlpType {
    Dense,
    Sparse,
}

/// Rotary embedding of one layer type (`rope_parameters.<layer type>`).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeParams {
    pub theta: f64,
    /// Fraction of `head_dim` that is rotated; the rest passes through untouched.
    pub partial_rotary_factor: f64,
    pub scaling: RopeScaling,
}

#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    Default,
    Yarn(YarnParams),
}

#[derive(Debug, Clone, PartialEq)]
pub struct YarnParams {
    pub factor: f64,
    pub original_max_position_embeddings: usize,
    pub beta_fast: f64,
    pub beta_slow: f64,
    /// The config's `attention_factor` when present; `None` means HF's default 0.1·ln(factor)+1.
    pub attention_factor: Option<f64>,
    pub truncate: bool,
}

/// `quantization` / `quantization_config` of a runtime checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantization {
    pub group_size: usize,
    pub bits: usize,
}

/// The Laguna target model configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct LagunaConfig {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub vocab_size: usize,
    pub head_dim: usize,
    pub num_key_value_heads: usize,
    pub num_attention_heads_per_layer: Vec<usize>,
    pub layer_types: Vec<LayerType>,
    pub mlp_layer_types: Vec<MlpType>,
    pub sliding_window: usize,
    pub rope_full: RopeParams,
    pub rope_sliding: RopeParams,
    pub rms_norm_eps: f64,
    pub intermediate_size: usize,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub shared_expert_intermediate_size: usize,
    pub moe_routed_scaling_factor: f64,
    pub norm_topk_prob: bool,
    /// 0 = off.
    pub moe_router_logit_softcapping: f64,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
    pub quantization: Option<Quantization>,
}

impl LagunaConfig {
    pub fn heads(&self, layer: usize) -> usize {
        self.num_attention_heads_per_layer[layer]
    }
    pub fn rope(&self, layer: usize) -> &RopeParams {
        match self.layer_types[layer] {
            LayerType::Full => &self.rope_full,
            LayerType::Sliding => &self.rope_sliding,
        }
    }
    pub fn is_sparse(&self, layer: usize) -> bool {
        self.mlp_layer_types[layer] == MlpType::Sparse
    }
    pub fn has_sparse_layers(&self) -> bool {
        self.mlp_layer_types.contains(&MlpType::Sparse)
    }

    pub fn from_file(path: &Path) -> Result<Self> {
        let text = crate::files::read_text(path)?;
        Self::from_json_str(&text).map_err(|e| e.in_file(path))
    }

    pub fn from_json_str(text: &str) -> Result<Self> {
        let raw: RawLaguna = parse_named(text)?;
        raw.validate()
    }

    /// The HF `config.json` object for this configuration (what `save_pretrained` would write, plus
    /// the runtime `quantization` blocks when present). Key order is fixed so output is reproducible.
    pub fn to_hf_json(&self) -> Value {
        let n = self.num_hidden_layers;
        let mut m = Map::new();
        m.insert("architectures".into(), json!(["LagunaForCausalLM"]));
        m.insert("model_type".into(), json!("laguna"));
        m.insert("attention_bias".into(), json!(false));
        m.insert("attention_dropout".into(), json!(0.0));
        if let Some(b) = self.bos_token_id {
            m.insert("bos_token_id".into(), json!(b));
        }
        m.insert("eos_token_id".into(), json!(self.eos_token_ids));
        if let Some(p) = self.pad_token_id {
            m.insert("pad_token_id".into(), json!(p));
        }
        m.insert("gating".into(), json!("per-head"));
        m.insert("gating_types".into(), json!(vec!["per_head"; n]));
        m.insert("head_dim".into(), json!(self.head_dim));
        m.insert("hidden_size".into(), json!(self.hidden_size));
        m.insert("intermediate_size".into(), json!(self.intermediate_size));
        m.insert(
            "layer_types".into(),
            json!(self
                .layer_types
                .iter()
                .map(|t| t.hf_name())
                .collect::<Vec<_>>()),
        );
        m.insert(
            "max_position_embeddings".into(),
            json!(self.max_position_embeddings),
        );
        m.insert(
            "mlp_layer_types".into(),
            json!(self
                .mlp_layer_types
                .iter()
                .map(|t| match t {
                    MlpType::Dense => "dense",
                    MlpType::Sparse => "sparse",
                })
                .collect::<Vec<_>>()),
        );
        m.insert(
            "moe_intermediate_size".into(),
            json!(self.moe_intermediate_size),
        );
        m.insert(
            "moe_routed_scaling_factor".into(),
            json!(self.moe_routed_scaling_factor),
        );
        if self.moe_router_logit_softcapping > 0.0 {
            m.insert(
                "moe_router_logit_softcapping".into(),
                json!(self.moe_router_logit_softcapping),
            );
        }
        m.insert("norm_topk_prob".into(), json!(self.norm_topk_prob));
        m.insert(
            "num_attention_heads".into(),
            json!(self.num_attention_heads_per_layer[0]),
        );
        m.insert(
            "num_attention_heads_per_layer".into(),
            json!(self.num_attention_heads_per_layer),
        );
        m.insert("num_experts".into(), json!(self.num_experts));
        m.insert(
            "num_experts_per_tok".into(),
            json!(self.num_experts_per_tok),
        );
        m.insert("num_hidden_layers".into(), json!(n));
        m.insert(
            "num_key_value_heads".into(),
            json!(self.num_key_value_heads),
        );
        if let Some(q) = self.quantization {
            let qv = json!({"group_size": q.group_size, "bits": q.bits, "mode": "nvfp4"});
            m.insert("quantization".into(), qv.clone());
            m.insert("quantization_config".into(), qv);
        }
        m.insert("rms_norm_eps".into(), json!(self.rms_norm_eps));
        m.insert(
            "rope_parameters".into(),
            json!({
                "full_attention": rope_to_json(&self.rope_full),
                "sliding_attention": rope_to_json(&self.rope_sliding),
            }),
        );
        m.insert(
            "shared_expert_intermediate_size".into(),
            json!(self.shared_expert_intermediate_size),
        );
        m.insert("sliding_window".into(), json!(self.sliding_window));
        m.insert(
            "tie_word_embeddings".into(),
            json!(self.tie_word_embeddings),
        );
        m.insert("torch_dtype".into(), json!("bfloat16"));
        m.insert("vocab_size".into(), json!(self.vocab_size));
        Value::Object(m)
    }
}

fn rope_to_json(r: &RopeParams) -> Value {
    match &r.scaling {
        RopeScaling::Default => json!({
            "rope_type": "default",
            "rope_theta": r.theta,
            "partial_rotary_factor": r.partial_rotary_factor,
        }),
        RopeScaling::Yarn(y) => {
            let mut v = json!({
                "rope_type": "yarn",
                "rope_theta": r.theta,
                "factor": y.factor,
                "original_max_position_embeddings": y.original_max_position_embeddings,
                "beta_fast": y.beta_fast,
                "beta_slow": y.beta_slow,
                "partial_rotary_factor": r.partial_rotary_factor,
            });
            if let Some(a) = y.attention_factor {
                v["attention_factor"] = json!(a);
            }
            if !y.truncate {
                v["truncate"] = json!(false);
            }
            v
        }
    }
}

/// A config's JSON as `T`. serde's own message for a value of the wrong type names the type and
/// the line and column, not the field; the path to the value (`quantization.group_size`) is kept
/// alongside, so the error names the field as every other config error does. Syntax errors,
/// which belong to no field, stay `invalid JSON: … at line L column C`.
fn parse_named<T: serde::de::DeserializeOwned>(text: &str) -> Result<T> {
    let de = &mut serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." || inner.is_syntax() || inner.is_eof() {
            Error::Config(format!("invalid JSON: {inner}"))
        } else {
            Error::field(&path, format!("is invalid: {inner}"))
        }
    })
}

/// A token id or a list of them (`eos_token_id` is either in HF configs).
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(i64),
    Many(Vec<i64>),
}

#[derive(Deserialize, Clone)]
struct RawQuant {
    group_size: Option<usize>,
    bits: Option<usize>,
    mode: Option<String>,
}

#[derive(Deserialize)]
struct RawLaguna {
    model_type: Option<String>,
    hidden_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    vocab_size: Option<usize>,
    head_dim: Option<usize>,
    num_attention_heads: Option<usize>,
    num_attention_heads_per_layer: Option<Vec<usize>>,
    num_key_value_heads: Option<usize>,
    layer_types: Option<Vec<String>>,
    mlp_layer_types: Option<Vec<String>>,
    sliding_window: Option<usize>,
    rope_parameters: Option<Map<String, Value>>,
    rope_theta: Option<f64>,
    rms_norm_eps: Option<f64>,
    gating: Option<Value>,
    gating_types: Option<Vec<String>>,
    intermediate_size: Option<usize>,
    num_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    moe_intermediate_size: Option<usize>,
    shared_expert_intermediate_size: Option<usize>,
    moe_routed_scaling_factor: Option<f64>,
    norm_topk_prob: Option<bool>,
    moe_router_logit_softcapping: Option<f64>,
    moe_apply_router_weight_on_input: Option<bool>,
    tie_word_embeddings: Option<bool>,
    max_position_embeddings: Option<usize>,
    bos_token_id: Option<i64>,
    eos_token_id: Option<OneOrMany>,
    pad_token_id: Option<i64>,
    quantization: Option<RawQuant>,
    quantization_config: Option<RawQuant>,
}

fn field<T>(v: Option<T>, name: &str) -> Result<T> {
    v.ok_or_else(|| Error::field(name, "is missing"))
}

fn positive(v: Option<usize>, name: &str) -> Result<usize> {
    let v = field(v, name)?;
    if v == 0 {
        return Err(Error::field(name, "must be positive"));
    }
    Ok(v)
}

/// Upper bounds on a config's sizes, far above any released model. They keep every size derived
/// from a config (tensor elements and bytes, cache rows, their sums over all layers) inside
/// 64-bit arithmetic, so no config can make the engine overflow or try an absurd allocation.
pub mod limits {
    /// `hidden_size` and every intermediate (MLP, expert) width.
    pub const WIDTH: usize = 1 << 18;
    pub const HEAD_DIM: usize = 1 << 12;
    /// Query and key-value heads per layer.
    pub const HEADS: usize = 1 << 10;
    pub const LAYERS: usize = 1 << 10;
    pub const EXPERTS: usize = 1 << 12;
    pub const VOCAB: usize = 1 << 22;
    /// `max_position_embeddings`: the longest sequence (prompt and generated tokens) a model runs.
    pub const POSITIONS: usize = 1 << 24;
}

/// A positive size of at most `max`.
fn bounded(v: Option<usize>, name: &str, max: usize) -> Result<usize> {
    let v = positive(v, name)?;
    if v > max {
        return Err(Error::field(
            name,
            format!("{v} is above the engine's limit {max}"),
        ));
    }
    Ok(v)
}

fn finite(v: f64, name: &str) -> Result<f64> {
    if !v.is_finite() {
        return Err(Error::field(name, "must be a finite number"));
    }
    Ok(v)
}

/// A window wider than the longest sequence attends to every earlier position, exactly like a
/// window of `max_positions`; clamping it keeps caches and their rings no larger than a sequence.
fn clamp_window(window: usize, max_positions: usize) -> usize {
    window.min(max_positions)
}

fn token_id(v: i64, name: &str, vocab: usize) -> Result<u32> {
    if v < 0 || v as u64 >= vocab as u64 {
        return Err(Error::field(
            name,
            format!("token id {v} is outside the vocabulary (0..{vocab})"),
        ));
    }
    Ok(v as u32)
}

fn per_layer<T: Clone>(v: Vec<T>, n: usize, name: &str) -> Result<Vec<T>> {
    if v.len() != n {
        return Err(Error::field(
            name,
            format!("has {} entries but num_hidden_layers is {n}", v.len()),
        ));
    }
    Ok(v)
}

fn parse_layer_type(s: &str, name: &str) -> Result<LayerType> {
    match s {
        "full_attention" => Ok(LayerType::Full),
        "sliding_attention" => Ok(LayerType::Sliding),
        other => Err(Error::field(
            name,
            format!("unknown layer type {other:?} (expected full_attention or sliding_attention)"),
        )),
    }
}

fn get_f64(m: &Map<String, Value>, key: &str, name: &str) -> Result<Option<f64>> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| Error::field(&format!("{name}.{key}"), "must be a number")),
    }
}

fn parse_rope(m: &Map<String, Value>, name: &str, head_dim: usize) -> Result<RopeParams> {
    let theta = get_f64(m, "rope_theta", name)?
        .ok_or_else(|| Error::field(&format!("{name}.rope_theta"), "is missing"))?;
    if !(theta > 1.0 && theta.is_finite()) {
        return Err(Error::field(
            &format!("{name}.rope_theta"),
            "must be a finite number > 1",
        ));
    }
    let prf = get_f64(m, "partial_rotary_factor", name)?.unwrap_or(1.0);
    let rot = head_dim as f64 * prf;
    if !(prf > 0.0 && prf <= 1.0) || rot.fract() != 0.0 || !(rot as usize).is_multiple_of(2) {
        return Err(Error::field(
            &format!("{name}.partial_rotary_factor"),
            format!("{prf} must be in (0, 1] and give an even number of rotated dims of head_dim {head_dim}"),
        ));
    }
    let kind = m
        .get("rope_type")
        .or_else(|| m.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let scaling = match kind {
        "default" => RopeScaling::Default,
        "yarn" => {
            let factor = get_f64(m, "factor", name)?
                .ok_or_else(|| Error::field(&format!("{name}.factor"), "is missing"))?;
            if !(factor >= 1.0 && factor.is_finite()) {
                return Err(Error::field(
                    &format!("{name}.factor"),
                    "must be a finite number >= 1",
                ));
            }
            let orig = get_f64(m, "original_max_position_embeddings", name)?.ok_or_else(|| {
                Error::field(
                    &format!("{name}.original_max_position_embeddings"),
                    "is missing",
                )
            })?;
            if !(1.0..=limits::POSITIONS as f64).contains(&orig) || orig.fract() != 0.0 {
                return Err(Error::field(
                    &format!("{name}.original_max_position_embeddings"),
                    format!(
                        "must be a positive integer of at most {}",
                        limits::POSITIONS
                    ),
                ));
            }
            let truncate = match m.get("truncate") {
                None | Some(Value::Null) => true,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(Error::field(
                        &format!("{name}.truncate"),
                        "must be a boolean",
                    ))
                }
            };
            RopeScaling::Yarn(YarnParams {
                factor,
                original_max_position_embeddings: orig as usize,
                // HF defaults: beta_fast 32, beta_slow 1.
                beta_fast: finite(
                    get_f64(m, "beta_fast", name)?.unwrap_or(32.0),
                    &format!("{name}.beta_fast"),
                )?,
                beta_slow: finite(
                    get_f64(m, "beta_slow", name)?.unwrap_or(1.0),
                    &format!("{name}.beta_slow"),
                )?,
                attention_factor: get_f64(m, "attention_factor", name)?
                    .map(|a| finite(a, &format!("{name}.attention_factor")))
                    .transpose()?,
                truncate,
            })
        }
        other => {
            return Err(Error::field(
                &format!("{name}.rope_type"),
                format!("unsupported rope type {other:?} (expected default or yarn)"),
            ))
        }
    };
    Ok(RopeParams {
        theta,
        partial_rotary_factor: prf,
        scaling,
    })
}

fn parse_quant(q: Option<RawQuant>, name: &str) -> Result<Option<Quantization>> {
    let Some(q) = q else { return Ok(None) };
    let mode = q.mode.as_deref().unwrap_or("nvfp4");
    if mode != "nvfp4" {
        return Err(Error::field(
            &format!("{name}.mode"),
            format!("unsupported quantization mode {mode:?} (only nvfp4)"),
        ));
    }
    let group_size = q.group_size.unwrap_or(16);
    let bits = q.bits.unwrap_or(4);
    if group_size != 16 || bits != 4 {
        return Err(Error::field(
            name,
            format!("nvfp4 needs group_size 16 and bits 4, got {group_size} and {bits}"),
        ));
    }
    Ok(Some(Quantization { group_size, bits }))
}

impl RawLaguna {
    /// The HF config checked field by field (each error names its field) into the engine's.
    fn validate(&self) -> Result<LagunaConfig> {
        if let Some(t) = &self.model_type {
            if t != "laguna" {
                return Err(Error::field(
                    "model_type",
                    format!("is {t:?}, expected \"laguna\""),
                ));
            }
        }
        let n = bounded(self.num_hidden_layers, "num_hidden_layers", limits::LAYERS)?;
        let hidden = bounded(self.hidden_size, "hidden_size", limits::WIDTH)?;
        let vocab = bounded(self.vocab_size, "vocab_size", limits::VOCAB)?;
        let head_dim = bounded(self.head_dim, "head_dim", limits::HEAD_DIM)?;
        if head_dim % 2 != 0 {
            return Err(Error::field(
                "head_dim",
                "must be even for rotary embeddings",
            ));
        }
        let kv = bounded(
            self.num_key_value_heads,
            "num_key_value_heads",
            limits::HEADS,
        )?;
        let heads = query_heads(
            self.num_attention_heads_per_layer.clone(),
            self.num_attention_heads,
            kv,
            n,
        )?;
        let layer_types = per_layer(
            field(self.layer_types.clone(), "layer_types")?,
            n,
            "layer_types",
        )?
        .iter()
        .enumerate()
        .map(|(i, s)| parse_layer_type(s, &format!("layer_types[{i}]")))
        .collect::<Result<Vec<_>>>()?;
        let mlp_layer_types =
            mlp_types(field(self.mlp_layer_types.clone(), "mlp_layer_types")?, n)?;
        check_gating(self.gating.as_ref(), self.gating_types.clone(), n)?;
        let window = positive(self.sliding_window, "sliding_window")?;
        let (rope_full, rope_sliding) =
            ropes(self.rope_parameters.as_ref(), self.rope_theta, head_dim)?;
        let rms_norm_eps = field(self.rms_norm_eps, "rms_norm_eps")?;
        if !(rms_norm_eps > 0.0 && rms_norm_eps < 1.0) {
            return Err(Error::field("rms_norm_eps", "must be in (0, 1)"));
        }
        let intermediate_size = if mlp_layer_types.contains(&MlpType::Dense) {
            bounded(self.intermediate_size, "intermediate_size", limits::WIDTH)?
        } else {
            self.intermediate_size.unwrap_or(0)
        };
        let moe = if mlp_layer_types.contains(&MlpType::Sparse) {
            MoeShape::checked(self, hidden)?
        } else {
            MoeShape::default()
        };
        let (softcap, scaling) = router(self)?;
        let max_pos = bounded(
            self.max_position_embeddings,
            "max_position_embeddings",
            limits::POSITIONS,
        )?;
        let bos = self
            .bos_token_id
            .map(|b| token_id(b, "bos_token_id", vocab))
            .transpose()?;
        let eos = match &self.eos_token_id {
            None => vec![],
            Some(OneOrMany::One(e)) => vec![token_id(*e, "eos_token_id", vocab)?],
            Some(OneOrMany::Many(v)) => v
                .iter()
                .map(|&e| token_id(e, "eos_token_id", vocab))
                .collect::<Result<_>>()?,
        };
        let pad = self
            .pad_token_id
            .map(|p| token_id(p, "pad_token_id", vocab))
            .transpose()?;
        let q1 = parse_quant(self.quantization.clone(), "quantization")?;
        let q2 = parse_quant(self.quantization_config.clone(), "quantization_config")?;
        if q1.is_some() && q2.is_some() && q1 != q2 {
            return Err(Error::field(
                "quantization_config",
                "disagrees with quantization",
            ));
        }
        Ok(LagunaConfig {
            hidden_size: hidden,
            num_hidden_layers: n,
            vocab_size: vocab,
            head_dim,
            num_key_value_heads: kv,
            num_attention_heads_per_layer: heads,
            layer_types,
            mlp_layer_types,
            sliding_window: clamp_window(window, max_pos),
            rope_full,
            rope_sliding,
            rms_norm_eps,
            intermediate_size,
            num_experts: moe.experts,
            num_experts_per_tok: moe.top_k,
            moe_intermediate_size: moe.intermediate,
            shared_expert_intermediate_size: moe.shared_intermediate,
            moe_routed_scaling_factor: scaling,
            norm_topk_prob: self.norm_topk_prob.unwrap_or(true),
            moe_router_logit_softcapping: softcap,
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(false),
            max_position_embeddings: max_pos,
            bos_token_id: bos,
            eos_token_ids: eos,
            pad_token_id: pad,
            quantization: q1.or(q2),
        })
    }
}

/// Each layer's query heads: `num_attention_heads_per_layer`, or `num_attention_heads` for
/// every layer; each a positive multiple of the `kv` heads, within the engine's limit.
fn query_heads(
    per_layer_heads: Option<Vec<usize>>,
    all_layers: Option<usize>,
    kv: usize,
    n: usize,
) -> Result<Vec<usize>> {
    let heads = match per_layer_heads {
        Some(v) => per_layer(v, n, "num_attention_heads_per_layer")?,
        None => vec![bounded(all_layers, "num_attention_heads", limits::HEADS)?; n],
    };
    for (i, &h) in heads.iter().enumerate() {
        if h > limits::HEADS {
            return Err(Error::field(
                &format!("num_attention_heads_per_layer[{i}]"),
                format!("{h} is above the engine's limit {}", limits::HEADS),
            ));
        }
        if h == 0 || h % kv != 0 {
            return Err(Error::field(
                &format!("num_attention_heads_per_layer[{i}]"),
                format!("{h} query heads are not a positive multiple of num_key_value_heads {kv}"),
            ));
        }
    }
    Ok(heads)
}

/// `mlp_layer_types`: one `dense` or `sparse` per layer.
fn mlp_types(v: Vec<String>, n: usize) -> Result<Vec<MlpType>> {
    per_layer(v, n, "mlp_layer_types")?
        .iter()
        .enumerate()
        .map(|(i, s)| match s.as_str() {
            "dense" => Ok(MlpType::Dense),
            "sparse" => Ok(MlpType::Sparse),
            o => Err(Error::field(
                &format!("mlp_layer_types[{i}]"),
                format!("unknown mlp type {o:?} (expected dense or sparse)"),
            )),
        })
        .collect()
}

/// Per-head attention gates are all this engine implements.
fn check_gating(gating: Option<&Value>, gating_types: Option<Vec<String>>, n: usize) -> Result<()> {
    // transformers' Laguna gates per head only for `true` or "per-head"; any other value
    // (even "per_head") gives per-element gates there, which this engine does not implement.
    match gating {
        None | Some(Value::Bool(true)) => {}
        Some(Value::String(s)) if s == "per-head" => {}
        Some(other) => {
            return Err(Error::field(
                "gating",
                format!(
                "unsupported gating {other} (only true or \"per-head\": per-head attention gates)"
            ),
            ))
        }
    }
    if let Some(g) = gating_types {
        let g = per_layer(g, n, "gating_types")?;
        for (i, s) in g.iter().enumerate() {
            if s != "per_head" && s != "per-head" {
                return Err(Error::field(
                    &format!("gating_types[{i}]"),
                    format!("unsupported gating type {s:?} (only per_head)"),
                ));
            }
        }
    }
    Ok(())
}

/// The full- and sliding-attention layers' rotary embeddings: `rope_parameters` per layer type
/// (or flat, one for both), else a plain `rope_theta`.
fn ropes(
    rope_parameters: Option<&Map<String, Value>>,
    rope_theta: Option<f64>,
    head_dim: usize,
) -> Result<(RopeParams, RopeParams)> {
    let Some(rp) = rope_parameters else {
        let theta = field(rope_theta, "rope_parameters")?;
        // The same bound as rope_parameters' own rope_theta (parse_rope).
        if !(theta > 1.0 && theta.is_finite()) {
            return Err(Error::field("rope_theta", "must be a finite number > 1"));
        }
        let r = RopeParams {
            theta,
            partial_rotary_factor: 1.0,
            scaling: RopeScaling::Default,
        };
        return Ok((r.clone(), r));
    };
    // A flat rope_parameters (one rope for every layer) is also accepted.
    if rp.contains_key("rope_theta") {
        let r = parse_rope(rp, "rope_parameters", head_dim)?;
        return Ok((r.clone(), r));
    }
    let get = |key: &str| -> Result<RopeParams> {
        let name = format!("rope_parameters.{key}");
        match rp.get(key) {
            Some(Value::Object(m)) => parse_rope(m, &name, head_dim),
            Some(_) => Err(Error::field(&name, "must be an object")),
            None => Err(Error::field(&name, "is missing")),
        }
    };
    Ok((get("full_attention")?, get("sliding_attention")?))
}

/// The experts' shape (all zero in a model without sparse layers).
#[derive(Default)]
struct MoeShape {
    experts: usize,
    top_k: usize,
    intermediate: usize,
    shared_intermediate: usize,
}

impl MoeShape {
    fn checked(c: &RawLaguna, hidden: usize) -> Result<MoeShape> {
        let experts = bounded(c.num_experts, "num_experts", limits::EXPERTS)?;
        let top_k = positive(c.num_experts_per_tok, "num_experts_per_tok")?;
        if top_k > experts {
            return Err(Error::field(
                "num_experts_per_tok",
                format!("top-k {top_k} is above num_experts {experts}"),
            ));
        }
        let intermediate = bounded(
            c.moe_intermediate_size,
            "moe_intermediate_size",
            limits::WIDTH,
        )?;
        let shared_intermediate = bounded(
            c.shared_expert_intermediate_size,
            "shared_expert_intermediate_size",
            limits::WIDTH,
        )?;
        // NVFP4 groups of 16 run along the input dim of every expert projection.
        for (name, v) in [
            ("hidden_size", hidden),
            ("moe_intermediate_size", intermediate),
            ("shared_expert_intermediate_size", shared_intermediate),
        ] {
            if v % 16 != 0 {
                return Err(Error::field(
                    name,
                    format!("{v} must be a multiple of 16 (the NVFP4 group size)"),
                ));
            }
        }
        Ok(MoeShape {
            experts,
            top_k,
            intermediate,
            shared_intermediate,
        })
    }
}

/// The router's logit soft-cap (0: none) and the routed experts' scaling factor.
fn router(c: &RawLaguna) -> Result<(f64, f64)> {
    if c.moe_apply_router_weight_on_input == Some(true) {
        return Err(Error::field(
            "moe_apply_router_weight_on_input",
            "true is not supported (Laguna applies routing weights to expert outputs)",
        ));
    }
    let softcap = c.moe_router_logit_softcapping.unwrap_or(0.0);
    if !(softcap >= 0.0 && softcap.is_finite()) {
        return Err(Error::field(
            "moe_router_logit_softcapping",
            "must be a finite number >= 0",
        ));
    }
    let scaling = c.moe_routed_scaling_factor.unwrap_or(1.0);
    // The engines scale in f32: a value finite only in f64 would be infinite there.
    if !(scaling as f32).is_finite() {
        return Err(Error::field(
            "moe_routed_scaling_factor",
            "must be finite (as an f32)",
        ));
    }
    Ok((softcap, scaling))
}

/// The DFlash drafter configuration (`dflash-config.json` / the drafter's `config.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct DrafterConfig {
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub sliding_window: usize,
    pub max_position_embeddings: usize,
    pub block_size: usize,
    pub num_target_layers: usize,
    pub target_layer_ids: Vec<usize>,
    pub mask_token_id: u32,
}

#[derive(Deserialize)]
struct RawDflashInner {
    target_layer_ids: Option<Vec<i64>>,
    mask_token_id: Option<i64>,
}

#[derive(Deserialize)]
struct RawDrafter {
    hidden_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    intermediate_size: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    sliding_window: Option<usize>,
    max_position_embeddings: Option<usize>,
    layer_types: Option<Vec<String>>,
    gating: Option<Value>,
    block_size: Option<usize>,
    num_target_layers: Option<usize>,
    dflash_config: Option<RawDflashInner>,
}

/// Largest block size the engine supports (the drafter's trained block size may be smaller).
pub const MAX_BLOCK_SIZE: usize = 16;

impl DrafterConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = crate::files::read_text(path)?;
        Self::from_json_str(&text).map_err(|e| e.in_file(path))
    }

    pub fn from_json_str(text: &str) -> Result<Self> {
        let r: RawDrafter = parse_named(text)?;
        let n = bounded(r.num_hidden_layers, "num_hidden_layers", limits::LAYERS)?;
        let heads = bounded(r.num_attention_heads, "num_attention_heads", limits::HEADS)?;
        let kv = bounded(r.num_key_value_heads, "num_key_value_heads", limits::HEADS)?;
        if heads % kv != 0 {
            return Err(Error::field(
                "num_attention_heads",
                format!("{heads} query heads are not a multiple of num_key_value_heads {kv}"),
            ));
        }
        let head_dim = bounded(r.head_dim, "head_dim", limits::HEAD_DIM)?;
        if head_dim % 2 != 0 {
            return Err(Error::field(
                "head_dim",
                "must be even for rotary embeddings",
            ));
        }
        if let Some(lt) = r.layer_types {
            let lt = per_layer(lt, n, "layer_types")?;
            for (i, s) in lt.iter().enumerate() {
                if parse_layer_type(s, &format!("layer_types[{i}]"))? != LayerType::Sliding {
                    return Err(Error::field(
                        &format!("layer_types[{i}]"),
                        "drafter layers must be sliding_attention",
                    ));
                }
            }
        }
        match &r.gating {
            None | Some(Value::Bool(true)) => {}
            Some(Value::String(s)) if s == "per-head" || s == "per_head" => {}
            Some(other) => {
                return Err(Error::field(
                    "gating",
                    format!("unsupported gating {other} (only per-head)"),
                ))
            }
        }
        let block_size = positive(r.block_size, "block_size")?;
        if block_size > MAX_BLOCK_SIZE {
            return Err(Error::field(
                "block_size",
                format!("{block_size} is above the engine's maximum {MAX_BLOCK_SIZE}"),
            ));
        }
        let num_target_layers = bounded(r.num_target_layers, "num_target_layers", limits::LAYERS)?;
        let inner = field(r.dflash_config, "dflash_config")?;
        let ids = field(inner.target_layer_ids, "dflash_config.target_layer_ids")?;
        if ids.is_empty() || ids.len() > limits::LAYERS {
            return Err(Error::field(
                "dflash_config.target_layer_ids",
                format!("must have 1 to {} entries", limits::LAYERS),
            ));
        }
        let mut target_layer_ids = Vec::with_capacity(ids.len());
        for (i, &id) in ids.iter().enumerate() {
            if id < 0 || id as u64 >= num_target_layers as u64 {
                return Err(Error::field(
                    &format!("dflash_config.target_layer_ids[{i}]"),
                    format!("layer {id} is out of range 0..{num_target_layers}"),
                ));
            }
            target_layer_ids.push(id as usize);
        }
        let vocab = bounded(r.vocab_size, "vocab_size", limits::VOCAB)?;
        let mask = field(inner.mask_token_id, "dflash_config.mask_token_id")?;
        let mask_token_id = token_id(mask, "dflash_config.mask_token_id", vocab)?;
        let rms_norm_eps = field(r.rms_norm_eps, "rms_norm_eps")?;
        if !(rms_norm_eps > 0.0 && rms_norm_eps < 1.0) {
            return Err(Error::field("rms_norm_eps", "must be in (0, 1)"));
        }
        let rope_theta = field(r.rope_theta, "rope_theta")?;
        if !(rope_theta > 1.0 && rope_theta.is_finite()) {
            return Err(Error::field("rope_theta", "must be a finite number > 1"));
        }
        let max_pos = r.max_position_embeddings.unwrap_or(262_144);
        let max_pos = bounded(Some(max_pos), "max_position_embeddings", limits::POSITIONS)?;
        Ok(DrafterConfig {
            hidden_size: bounded(r.hidden_size, "hidden_size", limits::WIDTH)?,
            num_hidden_layers: n,
            intermediate_size: bounded(r.intermediate_size, "intermediate_size", limits::WIDTH)?,
            num_attention_heads: heads,
            num_key_value_heads: kv,
            head_dim,
            vocab_size: vocab,
            rms_norm_eps,
            rope_theta,
            sliding_window: clamp_window(positive(r.sliding_window, "sliding_window")?, max_pos),
            max_position_embeddings: max_pos,
            block_size,
            num_target_layers,
            target_layer_ids,
            mask_token_id,
        })
    }

    /// Checks that this drafter can run on `target` (it borrows the target's embedding and lm_head).
    pub fn check_target(&self, target: &LagunaConfig) -> Result<()> {
        let shared = [
            ("hidden_size", self.hidden_size, target.hidden_size),
            ("vocab_size", self.vocab_size, target.vocab_size),
        ];
        for (field, ours, theirs) in shared {
            if ours != theirs {
                return Err(Error::field(
                    field,
                    format!("drafter {field} {ours} differs from the target's {theirs}"),
                ));
            }
        }
        if self.num_target_layers != target.num_hidden_layers {
            return Err(Error::field(
                "num_target_layers",
                format!(
                    "drafter expects {} target layers, the target has {}",
                    self.num_target_layers, target.num_hidden_layers
                ),
            ));
        }
        Ok(())
    }

    /// The drafter's decoder stack as a Laguna configuration: every layer sliding attention with
    /// the per-head gate and a dense SwiGLU MLP, default RoPE over all of `head_dim` at
    /// `rope_theta`, and the target's vocabulary (it borrows the target's embedding and
    /// lm_head). A backend that runs Laguna layers runs the drafter's with it.
    pub fn as_laguna(&self, target: &LagunaConfig) -> LagunaConfig {
        let n = self.num_hidden_layers;
        let rope = RopeParams {
            theta: self.rope_theta,
            partial_rotary_factor: 1.0,
            scaling: RopeScaling::Default,
        };
        LagunaConfig {
            hidden_size: self.hidden_size,
            num_hidden_layers: n,
            vocab_size: target.vocab_size,
            head_dim: self.head_dim,
            num_key_value_heads: self.num_key_value_heads,
            num_attention_heads_per_layer: vec![self.num_attention_heads; n],
            layer_types: vec![LayerType::Sliding; n],
            mlp_layer_types: vec![MlpType::Dense; n],
            sliding_window: self.sliding_window,
            rope_full: rope.clone(),
            rope_sliding: rope,
            rms_norm_eps: self.rms_norm_eps,
            intermediate_size: self.intermediate_size,
            num_experts: 0,
            num_experts_per_tok: 0,
            moe_intermediate_size: 0,
            shared_expert_intermediate_size: 0,
            moe_routed_scaling_factor: 1.0,
            norm_topk_prob: false,
            moe_router_logit_softcapping: 0.0,
            tie_word_embeddings: false,
            max_position_embeddings: self.max_position_embeddings,
            bos_token_id: target.bos_token_id,
            eos_token_ids: target.eos_token_ids.clone(),
            pad_token_id: target.pad_token_id,
            quantization: None,
        }
    }

    pub fn to_hf_json(&self) -> Value {
        json!({
            "architectures": ["DFlashDraftModel"],
            "model_type": "laguna",
            "gating": "per-head",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "sliding_window": self.sliding_window,
            "layer_types": vec!["sliding_attention"; self.num_hidden_layers],
            "tie_word_embeddings": false,
            "block_size": self.block_size,
            "num_target_layers": self.num_target_layers,
            "dflash_config": {
                "target_layer_ids": self.target_layer_ids,
                "mask_token_id": self.mask_token_id,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::path::PathBuf {
        crate::fixtures::xs21(name)
    }

    fn xs_json() -> Value {
        serde_json::from_str(&std::fs::read_to_string(fixture("config.json")).unwrap()).unwrap()
    }

    #[test]
    fn xs21_fixture_parses_with_every_field() {
        let c = LagunaConfig::from_file(&fixture("config.json")).unwrap();
        assert_eq!(c.hidden_size, 2048);
        assert_eq!(c.num_hidden_layers, 40);
        assert_eq!(c.vocab_size, 100352);
        assert_eq!(c.heads(0), 48);
        assert_eq!(c.heads(1), 64);
        assert_eq!(c.layer_types[4], LayerType::Full);
        assert_eq!(c.layer_types[5], LayerType::Sliding);
        assert_eq!(c.mlp_layer_types[0], MlpType::Dense);
        assert!(c.is_sparse(39));
        assert_eq!(c.rope_full.partial_rotary_factor, 0.5);
        match &c.rope_full.scaling {
            RopeScaling::Yarn(y) => {
                assert_eq!(y.factor, 32.0);
                assert_eq!(y.original_max_position_embeddings, 8192);
                assert_eq!(y.attention_factor, Some(1.0));
                assert_eq!((y.beta_fast, y.beta_slow), (64.0, 1.0));
            }
            other => panic!("expected yarn, got {other:?}"),
        }
        assert_eq!(c.rope_sliding.scaling, RopeScaling::Default);
        assert_eq!(c.rope_sliding.theta, 1e4);
        assert_eq!(c.num_experts, 256);
        assert_eq!(c.num_experts_per_tok, 8);
        assert_eq!(c.moe_routed_scaling_factor, 2.5);
        assert_eq!(c.moe_router_logit_softcapping, 0.0);
        assert_eq!(c.eos_token_ids, vec![2, 24]);
        assert_eq!(c.pad_token_id, Some(9));
        assert_eq!(
            c.quantization,
            Some(Quantization {
                group_size: 16,
                bits: 4
            })
        );
    }

    #[test]
    fn hf_json_round_trips() {
        let c = LagunaConfig::from_file(&fixture("config.json")).unwrap();
        let again = LagunaConfig::from_json_str(&c.to_hf_json().to_string()).unwrap();
        assert_eq!(c, again);
        let d = DrafterConfig::from_file(&fixture("dflash-config.json")).unwrap();
        let again = DrafterConfig::from_json_str(&d.to_hf_json().to_string()).unwrap();
        assert_eq!(d, again);
    }

    #[test]
    fn drafter_fixture_parses_and_fits_target() {
        let d = DrafterConfig::from_file(&fixture("dflash-config.json")).unwrap();
        assert_eq!(d.target_layer_ids, vec![1, 13, 25, 33, 39]);
        assert_eq!(d.mask_token_id, 12);
        assert_eq!(d.block_size, 16);
        assert_eq!(d.num_attention_heads, 64);
        let t = LagunaConfig::from_file(&fixture("config.json")).unwrap();
        d.check_target(&t).unwrap();
    }

    fn bad(edit: impl FnOnce(&mut Value)) -> String {
        let mut v = xs_json();
        edit(&mut v);
        LagunaConfig::from_json_str(&v.to_string())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn invalid_configs_name_the_field() {
        let e = bad(|v| v["num_attention_heads_per_layer"][3] = json!(60));
        assert!(e.contains("num_attention_heads_per_layer[3]"), "{e}");
        let e = bad(|v| {
            v["layer_types"].as_array_mut().unwrap().pop();
        });
        assert!(e.contains("layer_types") && e.contains("39 entries"), "{e}");
        let e = bad(|v| v["layer_types"][7] = json!("chunked_attention"));
        assert!(
            e.contains("layer_types[7]") && e.contains("chunked_attention"),
            "{e}"
        );
        let e = bad(|v| v["num_experts_per_tok"] = json!(300));
        assert!(e.contains("num_experts_per_tok"), "{e}");
        let e = bad(|v| v["mlp_layer_types"][2] = json!("moe"));
        assert!(e.contains("mlp_layer_types[2]"), "{e}");
        let e = bad(|v| {
            v.as_object_mut().unwrap().remove("hidden_size");
        });
        assert!(e.contains("hidden_size") && e.contains("missing"), "{e}");
        let e =
            bad(|v| v["rope_parameters"]["full_attention"]["partial_rotary_factor"] = json!(0.3));
        assert!(
            e.contains("rope_parameters.full_attention.partial_rotary_factor"),
            "{e}"
        );
        let e = bad(|v| v["rope_parameters"]["full_attention"]["rope_type"] = json!("longrope"));
        assert!(e.contains("rope_type"), "{e}");
        let e = bad(|v| v["eos_token_id"] = json!([2, 100352]));
        assert!(e.contains("eos_token_id"), "{e}");
        let e = bad(|v| v["gating_types"][0] = json!("per_channel"));
        assert!(e.contains("gating_types[0]"), "{e}");
        let e = bad(|v| v["quantization"]["mode"] = json!("mxfp4"));
        assert!(e.contains("quantization.mode"), "{e}");
        let e = bad(|v| v["gating"] = json!("per_head"));
        assert!(e.contains("gating"), "{e}");
        let e = bad(|v| v["model_type"] = json!("llama"));
        assert!(e.contains("model_type"), "{e}");
        // A value of the wrong type: named by its path, not only located by line and column.
        let e = bad(|v| v["hidden_size"] = json!("wide"));
        assert!(
            e.contains("field `hidden_size` is invalid: invalid type: string"),
            "{e}"
        );
        let e = bad(|v| v["quantization"]["group_size"] = json!(-16));
        assert!(e.contains("field `quantization.group_size`"), "{e}");
        let e = bad(|v| v["layer_types"][5] = json!(5));
        assert!(e.contains("field `layer_types[5]`"), "{e}");
        // A flat rope_theta (no rope_parameters) has the bound rope_parameters' own has.
        for theta in [json!(0.5), json!(-1e300)] {
            let e = bad(|v| {
                v.as_object_mut().unwrap().remove("rope_parameters");
                v["rope_theta"] = theta;
            });
            assert!(
                e.contains("rope_theta") && e.contains("finite number > 1"),
                "{e}"
            );
        }
    }

    #[test]
    fn invalid_drafter_configs_name_the_field() {
        let base: Value =
            serde_json::from_str(&std::fs::read_to_string(fixture("dflash-config.json")).unwrap())
                .unwrap();
        let bad = |edit: &dyn Fn(&mut Value)| {
            let mut v = base.clone();
            edit(&mut v);
            DrafterConfig::from_json_str(&v.to_string())
                .unwrap_err()
                .to_string()
        };
        let e = bad(&|v| v["dflash_config"]["target_layer_ids"][4] = json!(40));
        assert!(
            e.contains("target_layer_ids[4]") && e.contains("out of range"),
            "{e}"
        );
        let e = bad(&|v| v["num_attention_heads"] = json!(60));
        assert!(e.contains("num_attention_heads"), "{e}");
        let e = bad(&|v| v["block_size"] = json!(32));
        assert!(e.contains("block_size"), "{e}");
        let e = bad(&|v| v["dflash_config"]["mask_token_id"] = json!(-1));
        assert!(e.contains("mask_token_id"), "{e}");
        let e = bad(&|v| v["layer_types"][0] = json!("full_attention"));
        assert!(e.contains("layer_types[0]"), "{e}");
        let mut t = LagunaConfig::from_file(&fixture("config.json")).unwrap();
        t.hidden_size = 1024;
        let d = DrafterConfig::from_json_str(&base.to_string()).unwrap();
        let e = d.check_target(&t).unwrap_err().to_string();
        assert!(e.contains("hidden_size"), "{e}");
    }

    #[test]
    fn config_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("config.json");
        std::fs::write(&p, "{ not json").unwrap();
        let e = LagunaConfig::from_file(&p).unwrap_err().to_string();
        assert!(
            e.contains("config.json") && e.contains("invalid JSON"),
            "{e}"
        );
    }
}
