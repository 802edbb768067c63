//! The DFlash drafter on the CPU (`docs/spec/dflash.md`): context rows from the target's tapped
//! hidden states, and one block forward that drafts K-1 tokens using the target's embedding and
//! lm_head.

use std::path::Path;

use fastdecode_model::checkpoint::TensorStore;
use fastdecode_model::config::{DrafterConfig, RopeParams, RopeScaling};
use fastdecode_model::inventory::drafter_inventory;
use fastdecode_model::rope::Rope;
use fastdecode_model::{Error, Result};

use crate::kv_cache::LayerKv;
use crate::layers::{normed, Attention, Linear, Mlp};
use crate::ops::argmax;
use crate::target::{linear, load_attention, load_mlp, read, TargetModel};

pub struct DrafterLayer {
    pub input_norm: Vec<f32>,
    pub post_norm: Vec<f32>,
    pub attn: Attention,
    pub mlp: Mlp,
}

pub struct DrafterModel {
    pub cfg: DrafterConfig,
    pub fc: Linear,
    pub hidden_norm: Vec<f32>,
    pub norm: Vec<f32>,
    pub aux_norms: Vec<Vec<f32>>,
    pub layers: Vec<DrafterLayer>,
    pub eps: f32,
}

/// The drafter's per-layer context K/V (rings of `window` rows) and how many positions it covers.
pub struct DrafterContext {
    layers: Vec<LayerKv>,
    len: usize,
}

impl DrafterContext {
    /// Positions `0..len` have context rows.
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl DrafterModel {
    pub fn load(dir: &Path) -> Result<Self> {
        let cfg = DrafterConfig::from_file(&dir.join("config.json"))?;
        let store = TensorStore::open_dir(dir)?;
        Self::from_store(cfg, &store)
    }

    pub fn from_store(c: DrafterConfig, store: &TensorStore) -> Result<Self> {
        store.check(&drafter_inventory(&c), true)?;
        let (h, d, nh, kv) = (
            c.hidden_size,
            c.head_dim,
            c.num_attention_heads,
            c.num_key_value_heads,
        );
        let t = c.target_layer_ids.len();
        let rope = Rope::new(
            &RopeParams {
                theta: c.rope_theta,
                partial_rotary_factor: 1.0,
                scaling: RopeScaling::Default,
            },
            d,
        );
        let mut layers = vec![];
        for i in 0..c.num_hidden_layers {
            let p = format!("layers.{i}");
            let a = format!("{p}.self_attn");
            let w = c.intermediate_size;
            layers.push(DrafterLayer {
                input_norm: read(store, &format!("{p}.input_layernorm.weight"), &[h])?,
                post_norm: read(store, &format!("{p}.post_attention_layernorm.weight"), &[h])?,
                attn: load_attention(
                    store,
                    &a,
                    (nh, kv, d, h),
                    rope.clone(),
                    Some(c.sliding_window),
                )?,
                mlp: load_mlp(store, &format!("{p}.mlp"), w, h)?,
            });
        }
        Ok(DrafterModel {
            fc: linear(store, "fc.weight", h, t * h)?,
            hidden_norm: read(store, "hidden_norm.weight", &[h])?,
            norm: read(store, "norm.weight", &[h])?,
            aux_norms: (0..t)
                .map(|j| read(store, &format!("aux_hidden_norms.{j}.weight"), &[h]))
                .collect::<Result<_>>()?,
            layers,
            eps: c.rms_norm_eps as f32,
            cfg: c,
        })
    }

    pub fn new_context(&self) -> DrafterContext {
        let kv_dim = self.cfg.num_key_value_heads * self.cfg.head_dim;
        DrafterContext {
            layers: self
                .layers
                .iter()
                .map(|_| LayerKv::new(kv_dim, Some(self.cfg.sliding_window)))
                .collect(),
            len: 0,
        }
    }

    /// Appends context rows for positions `ctx.len()..` from the target's tapped hidden states
    /// (`rows × taps × hidden`, taps in `target_layer_ids` order).
    pub fn extend_context(&self, ctx: &mut DrafterContext, taps: &[f32]) -> Result<()> {
        let h = self.cfg.hidden_size;
        let t = self.cfg.target_layer_ids.len();
        if !taps.len().is_multiple_of(t * h) {
            return Err(Error::Input(format!(
                "drafter context: {} floats is not a whole number of rows of {t} taps × {h}",
                taps.len()
            )));
        }
        for row in taps.chunks_exact(t * h) {
            let mut cat = Vec::with_capacity(t * h);
            for (j, hid) in row.chunks_exact(h).enumerate() {
                cat.extend(normed(hid, &self.aux_norms[j], self.eps));
            }
            let c = normed(&self.fc.forward(&cat), &self.hidden_norm, self.eps);
            let pos = ctx.len;
            for (layer, kv) in self.layers.iter().zip(&mut ctx.layers) {
                let cn = normed(&c, &layer.input_norm, self.eps);
                let (k, v) = layer.attn.project_kv(&cn, pos, self.eps);
                kv.write(pos, &k, &v);
            }
            ctx.len += 1;
        }
        Ok(())
    }

    /// Drafts `k - 1` tokens following `bonus`, which sits at position `ctx.len()`: the block
    /// `[bonus, mask, …, mask]` attends to the context rows in its window and causally to itself.
    pub fn draft(
        &self,
        target: &TargetModel,
        ctx: &DrafterContext,
        bonus: u32,
        k: usize,
    ) -> Vec<u32> {
        self.block_logits(target, ctx, bonus, k)
            .iter()
            .map(|l| argmax(l) as u32)
            .collect()
    }

    /// The logits (through the target's lm_head) of block rows 1..k, whose argmaxes are the
    /// drafts.
    pub fn block_logits(
        &self,
        target: &TargetModel,
        ctx: &DrafterContext,
        bonus: u32,
        k: usize,
    ) -> Vec<Vec<f32>> {
        let o = ctx.len;
        let mask = self.cfg.mask_token_id;
        let mut x: Vec<Vec<f32>> = (0..k)
            .map(|j| target.embed_row(if j == 0 { bonus } else { mask }).to_vec())
            .collect();
        for (layer, kv) in self.layers.iter().zip(&ctx.layers) {
            let proj = layer.attn.project_rows(&x, &layer.input_norm, o, self.eps);
            layer.attn.attend_block(&proj, o, kv, &mut x);
            for row in x.iter_mut() {
                let y = layer.mlp.forward(&normed(row, &layer.post_norm, self.eps));
                for (a, b) in row.iter_mut().zip(y) {
                    *a += b;
                }
            }
        }
        x[1..]
            .iter()
            .map(|row| target.logits(row, &self.norm))
            .collect()
    }
}
