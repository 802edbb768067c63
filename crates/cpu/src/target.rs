//! The Laguna target model on the CPU: weights loaded to f32 from either checkpoint layout, and
//! the one forward entry point that prefill, decode, DFlash verify and teacher-forced replay use.

use std::path::Path;

use fastdecode_model::checkpoint::TensorStore;
use fastdecode_model::config::{LagunaConfig, LayerType};
use fastdecode_model::inventory::{target_inventory, Layout};
use fastdecode_model::nvfp4::dequantize_row;
use fastdecode_model::rope::Rope;
use fastdecode_model::{Error, Result};

use crate::kv_cache::{KvCache, LayerKv};
use crate::layers::{normed, Attention, Ffn, Linear, Mlp, Moe};
use crate::profile::timed;

pub struct DecoderLayer {
    pub input_norm: Vec<f32>,
    pub post_norm: Vec<f32>,
    pub attn: Attention,
    pub ffn: Ffn,
}

pub struct TargetModel {
    pub cfg: LagunaConfig,
    pub embed: Vec<f32>,
    pub layers: Vec<DecoderLayer>,
    pub norm: Vec<f32>,
    pub lm_head: Linear,
    pub eps: f32,
}

/// What one forward returns.
#[derive(Debug)]
pub struct ForwardOut {
    /// `rows × vocab` logits, one row per input token.
    pub logits: Vec<f32>,
    /// `rows × taps × hidden`: the output of each requested decoder layer (after its residual
    /// add, before the final norm), in the order the layers were requested.
    pub taps: Vec<f32>,
}

/// Reads a named tensor as f32 with its expected shape.
pub(crate) fn read(store: &TensorStore, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    let t = store.get(name)?;
    t.expect_shape(shape)?;
    t.to_f32()
}

pub(crate) fn linear(store: &TensorStore, name: &str, out: usize, inp: usize) -> Result<Linear> {
    Ok(Linear {
        w: read(store, name, &[out, inp])?,
        out,
        inp,
    })
}

/// The bf16 SwiGLU MLP under `prefix`: `gate_proj` and `up_proj` [inter, hidden], `down_proj`
/// [hidden, inter].
pub(crate) fn load_mlp(store: &TensorStore, prefix: &str, inter: usize, h: usize) -> Result<Mlp> {
    Ok(Mlp {
        gate: linear(store, &format!("{prefix}.gate_proj.weight"), inter, h)?,
        up: linear(store, &format!("{prefix}.up_proj.weight"), inter, h)?,
        down: linear(store, &format!("{prefix}.down_proj.weight"), h, inter)?,
    })
}

/// The gated attention weights under `prefix` (`…self_attn`); `shape` is (query heads, kv heads,
/// head_dim, hidden).
pub(crate) fn load_attention(
    store: &TensorStore,
    prefix: &str,
    shape: (usize, usize, usize, usize),
    rope: Rope,
    window: Option<usize>,
) -> Result<Attention> {
    let (nh, kv, d, h) = shape;
    Ok(Attention {
        q: linear(store, &format!("{prefix}.q_proj.weight"), nh * d, h)?,
        k: linear(store, &format!("{prefix}.k_proj.weight"), kv * d, h)?,
        v: linear(store, &format!("{prefix}.v_proj.weight"), kv * d, h)?,
        o: linear(store, &format!("{prefix}.o_proj.weight"), h, nh * d)?,
        g: linear(store, &format!("{prefix}.g_proj.weight"), nh, h)?,
        q_norm: read(store, &format!("{prefix}.q_norm.weight"), &[d])?,
        k_norm: read(store, &format!("{prefix}.k_norm.weight"), &[d])?,
        heads: nh,
        kv_heads: kv,
        head_dim: d,
        rope,
        window,
    })
}

/// Dequantises NVFP4 `base.{weight,scales}` of shape `[lead.., rows, cols]` into f32.
fn nvfp4(
    store: &TensorStore,
    base: &str,
    lead: usize,
    rows: usize,
    cols: usize,
) -> Result<Vec<f32>> {
    let codes = store.get(&format!("{base}.weight"))?.to_u32()?;
    let scales = store.get(&format!("{base}.scales"))?.to_u8()?;
    let mut out = vec![0f32; lead * rows * cols];
    for r in 0..lead * rows {
        dequantize_row(
            &codes[r * cols / 8..(r + 1) * cols / 8],
            &scales[r * cols / 16..(r + 1) * cols / 16],
            &mut out[r * cols..(r + 1) * cols],
        );
    }
    Ok(out)
}

fn split_linears(all: Vec<f32>, n: usize, out: usize, inp: usize) -> Vec<Linear> {
    all.chunks_exact(out * inp)
        .take(n)
        .map(|c| Linear {
            w: c.to_vec(),
            out,
            inp,
        })
        .collect()
}

fn load_moe(store: &TensorStore, c: &LagunaConfig, m: &str, layout: Layout) -> Result<Moe> {
    let (h, e, mi, si) = (
        c.hidden_size,
        c.num_experts,
        c.moe_intermediate_size,
        c.shared_expert_intermediate_size,
    );
    let (experts, shared) = match layout {
        Layout::Runtime => {
            let s = format!("{m}.switch_mlp");
            let gate = split_linears(nvfp4(store, &format!("{s}.gate_proj"), e, mi, h)?, e, mi, h);
            let up = split_linears(nvfp4(store, &format!("{s}.up_proj"), e, mi, h)?, e, mi, h);
            let down = split_linears(nvfp4(store, &format!("{s}.down_proj"), e, h, mi)?, e, h, mi);
            let experts = gate
                .into_iter()
                .zip(up)
                .zip(down)
                .map(|((gate, up), down)| Mlp { gate, up, down })
                .collect();
            let s = format!("{m}.shared_expert");
            let shared = Mlp {
                gate: Linear {
                    w: nvfp4(store, &format!("{s}.gate_proj"), 1, si, h)?,
                    out: si,
                    inp: h,
                },
                up: Linear {
                    w: nvfp4(store, &format!("{s}.up_proj"), 1, si, h)?,
                    out: si,
                    inp: h,
                },
                down: Linear {
                    w: nvfp4(store, &format!("{s}.down_proj"), 1, h, si)?,
                    out: h,
                    inp: si,
                },
            };
            (experts, shared)
        }
        Layout::HfSaved => {
            let experts = (0..e)
                .map(|x| load_mlp(store, &format!("{m}.experts.{x}"), mi, h))
                .collect::<Result<Vec<_>>>()?;
            let shared = load_mlp(store, &format!("{m}.shared_expert"), si, h)?;
            (experts, shared)
        }
        Layout::Hf => {
            // gate_up_proj is [E, 2I, hidden] with the gate rows first, then the up rows.
            let gu = read(store, &format!("{m}.experts.gate_up_proj"), &[e, 2 * mi, h])?;
            let down = read(store, &format!("{m}.experts.down_proj"), &[e, h, mi])?;
            let per = mi * h;
            let experts = (0..e)
                .map(|x| Mlp {
                    gate: Linear {
                        w: gu[2 * x * per..(2 * x + 1) * per].to_vec(),
                        out: mi,
                        inp: h,
                    },
                    up: Linear {
                        w: gu[(2 * x + 1) * per..(2 * x + 2) * per].to_vec(),
                        out: mi,
                        inp: h,
                    },
                    down: Linear {
                        w: down[x * h * mi..(x + 1) * h * mi].to_vec(),
                        out: h,
                        inp: mi,
                    },
                })
                .collect();
            let shared = load_mlp(store, &format!("{m}.shared_experts"), si, h)?;
            (experts, shared)
        }
    };
    let bias = if layout == Layout::HfSaved {
        format!("{m}.experts.e_score_correction_bias")
    } else {
        format!("{m}.gate.e_score_correction_bias")
    };
    Ok(Moe {
        router: linear(store, &format!("{m}.gate.weight"), e, h)?,
        bias: read(store, &bias, &[e])?,
        experts,
        shared,
        top_k: c.num_experts_per_tok,
        routed_scaling: c.moe_routed_scaling_factor as f32,
        norm_topk: c.norm_topk_prob,
        softcap: c.moe_router_logit_softcapping as f32,
    })
}

impl TargetModel {
    /// Loads `dir/config.json` and the checkpoint in `dir`, in whichever layout its config says
    /// (runtime when it has `quantization`, else HF), checking every tensor against the inventory.
    pub fn load(dir: &Path) -> Result<Self> {
        let cfg = LagunaConfig::from_file(&dir.join("config.json"))?;
        let store = TensorStore::open_dir(dir)?;
        Self::from_store(cfg, &store)
    }

    pub fn from_store(c: LagunaConfig, store: &TensorStore) -> Result<Self> {
        let layout = Layout::detect(&c, store.names());
        // HF checkpoints may be saved in f32 or f16; the runtime layout is exact about dtypes.
        store.check(&target_inventory(&c, layout), layout.is_hf())?;
        let (h, d, kv, v) = (
            c.hidden_size,
            c.head_dim,
            c.num_key_value_heads,
            c.vocab_size,
        );
        let eps = c.rms_norm_eps as f32;
        let mut layers = vec![];
        for i in 0..c.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let a = format!("{p}.self_attn");
            let nh = c.heads(i);
            let window = (c.layer_types[i] == LayerType::Sliding).then_some(c.sliding_window);
            let attn = load_attention(store, &a, (nh, kv, d, h), Rope::new(c.rope(i), d), window)?;
            let m = format!("{p}.mlp");
            let ffn = if c.is_sparse(i) {
                Ffn::Moe(Box::new(load_moe(store, &c, &m, layout)?))
            } else {
                Ffn::Dense(load_mlp(store, &m, c.intermediate_size, h)?)
            };
            layers.push(DecoderLayer {
                input_norm: read(store, &format!("{p}.input_layernorm.weight"), &[h])?,
                post_norm: read(store, &format!("{p}.post_attention_layernorm.weight"), &[h])?,
                attn,
                ffn,
            });
        }
        let embed = read(store, "model.embed_tokens.weight", &[v, h])?;
        let lm_head = if c.tie_word_embeddings {
            Linear {
                w: embed.clone(),
                out: v,
                inp: h,
            }
        } else {
            linear(store, "lm_head.weight", v, h)?
        };
        Ok(TargetModel {
            norm: read(store, "model.norm.weight", &[h])?,
            embed,
            layers,
            lm_head,
            eps,
            cfg: c,
        })
    }

    /// An empty KV cache sized for verify blocks of up to `max_block` rows.
    pub fn new_cache(&self, max_block: usize) -> KvCache {
        let kv_dim = self.cfg.num_key_value_heads * self.cfg.head_dim;
        KvCache::new(
            self.layers
                .iter()
                .map(|l| LayerKv::new(kv_dim, l.attn.window.map(|w| w.saturating_add(max_block))))
                .collect(),
        )
    }

    /// Bytes of host memory a run of `positions` positions needs beyond the weights, with verify
    /// blocks of up to `max_block` rows and a prefill of `prefill_rows` rows: the KV cache (a
    /// sliding layer holds at most its ring) plus the prefill's activations and logits. Checked
    /// arithmetic: `None` when the figure does not fit in 64 bits.
    pub fn run_bytes(
        &self,
        positions: usize,
        max_block: usize,
        prefill_rows: usize,
    ) -> Option<u64> {
        let c = &self.cfg;
        let f32s = |n: usize| (n as u64).checked_mul(4);
        let kv_dim = c.num_key_value_heads.checked_mul(c.head_dim)?;
        let mut total = 0u64;
        for l in &self.layers {
            let rows = match l.attn.window {
                Some(w) => positions.min(w.saturating_add(max_block)),
                None => positions,
            };
            // Keys and values.
            total = total.checked_add(f32s(rows.checked_mul(kv_dim)?.checked_mul(2)?)?)?;
        }
        // Each prefill row holds its residual, projections and attention output (a few hidden
        // widths) and its logits.
        let heads = c
            .num_attention_heads_per_layer
            .iter()
            .copied()
            .max()
            .unwrap_or(0);
        let per_row = c
            .hidden_size
            .checked_mul(4)?
            .checked_add(heads.checked_mul(c.head_dim)?.checked_mul(3)?)?
            .checked_add(c.vocab_size)?;
        total.checked_add(f32s(prefill_rows.checked_mul(per_row)?)?)
    }

    pub fn embed_row(&self, token: u32) -> &[f32] {
        let h = self.cfg.hidden_size;
        &self.embed[token as usize * h..(token as usize + 1) * h]
    }

    /// Logits of one final hidden state (before the final norm).
    pub fn logits(&self, hidden: &[f32], norm: &[f32]) -> Vec<f32> {
        self.lm_head.forward(&normed(hidden, norm, self.eps))
    }

    /// The forward entry point: rows `tokens` at absolute `positions`, which must continue the
    /// cache (`positions[i] = cache.len() + i`). Appends the rows' keys and values to the cache and
    /// returns the logits of every row plus the hidden states of the `taps` layers.
    pub fn forward(
        &self,
        cache: &mut KvCache,
        tokens: &[u32],
        positions: &[usize],
        taps: &[usize],
    ) -> Result<ForwardOut> {
        let c = &self.cfg;
        let (n, h) = (tokens.len(), c.hidden_size);
        let p0 = cache.len();
        if positions.len() != n || positions.iter().enumerate().any(|(i, &p)| p != p0 + i) {
            return Err(Error::Input(format!(
                "forward: positions {positions:?} do not continue the KV cache of length {p0}"
            )));
        }
        if p0.saturating_add(n) > c.max_position_embeddings {
            return Err(Error::Input(format!(
                "forward: {} positions are more than the model's max_position_embeddings {}",
                p0.saturating_add(n),
                c.max_position_embeddings
            )));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(Error::Input(format!(
                "forward: token id {t} is outside the vocabulary (0..{})",
                c.vocab_size
            )));
        }
        if let Some(&l) = taps.iter().find(|&&l| l >= c.num_hidden_layers) {
            return Err(Error::Input(format!(
                "forward: tap layer {l} is out of range 0..{}",
                c.num_hidden_layers
            )));
        }
        let mut x: Vec<Vec<f32>> = timed("embed", || {
            tokens.iter().map(|&t| self.embed_row(t).to_vec()).collect()
        });
        let mut tap_out = vec![0f32; n * taps.len() * h];
        for (li, layer) in self.layers.iter().enumerate() {
            let proj = timed("attention projections", || {
                layer.attn.project_rows(&x, &layer.input_norm, p0, self.eps)
            });
            timed("attention", || {
                layer
                    .attn
                    .attend_block(&proj, p0, &cache.layers[li], &mut x)
            });
            let kv = &mut cache.layers[li];
            timed("kv cache write", || {
                for (r, p) in proj.iter().enumerate() {
                    kv.write(p0 + r, &p.k, &p.v);
                }
            });
            let ffn = match layer.ffn {
                Ffn::Moe(_) => "moe",
                Ffn::Dense(_) => "mlp",
            };
            for (r, row) in x.iter_mut().enumerate() {
                let y = timed(ffn, || {
                    layer.ffn.forward(&normed(row, &layer.post_norm, self.eps))
                });
                for (a, b) in row.iter_mut().zip(y) {
                    *a += b;
                }
                for (t, _) in taps.iter().enumerate().filter(|(_, &l)| l == li) {
                    let at = (r * taps.len() + t) * h;
                    tap_out[at..at + h].copy_from_slice(row);
                }
            }
        }
        cache.advance(n);
        let mut logits = Vec::with_capacity(n * c.vocab_size);
        timed("logits", || {
            for row in &x {
                logits.extend(self.logits(row, &self.norm));
            }
        });
        Ok(ForwardOut {
            logits,
            taps: tap_out,
        })
    }
}
