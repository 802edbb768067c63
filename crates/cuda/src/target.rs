//! The GPU target session: KV cache (full layers hold `max_positions`; sliding layers a ring of
//! window + `PREFILL_CHUNK` slots), the forward entry point, the greedy step that decoding
//! replays as a CUDA graph, and the prefill path.
//!
//! One step of up to `MAX_ROWS` rows is a fixed sequence of launches whose inputs (token ids,
//! positions) live in device buffers, so the same sequence is captured once per row count and
//! replayed: the host writes the ids and positions, launches the graph and reads the chosen
//! tokens back, the step's only synchronisation. Every step kernel computes a row the same way
//! whatever the step holds, so a K-row verify reproduces K serial steps bit for bit. Longer runs
//! of rows (prompts) take the prefill path in chunks of `PREFILL_CHUNK`.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaEvent, CudaGraph, CudaSlice, CudaView, PinnedHostSlice};

use fastdecode_cpu::ForwardOut;
use half::bf16;

use crate::dense::{Accumulate, MatShape, Norm, RowShape};
use crate::device::Gpu;
use crate::error::{CudaError, Result};
use crate::model::{moe_shape, CudaModel, DevFfn, DevLayer, DevMoe};
use crate::ops::{
    AttnRows, AttnShape, MoeLayer, RouterOut, RouterWeights, Routing, ATT_SPLITS, MAX_ROWS,
};
use crate::prefill::{GroupedSplit, PrefillAttn};
use crate::profile::mark;

/// Per-row buffers both paths use, for up to `n` rows: inputs, activations, the router's
/// choices and the greedy picks.
struct Rows {
    tok: CudaSlice<i32>,
    pos: CudaSlice<i32>,
    next: CudaSlice<i32>,
    x: CudaSlice<f32>,
    xn: CudaSlice<f32>,
    qkvg: CudaSlice<f32>,
    router_logits: CudaSlice<f32>,
    ids: CudaSlice<i32>,
    wts: CudaSlice<f32>,
    h: CudaSlice<f32>,
    gate_up: CudaSlice<f32>,
    act: CudaSlice<f32>,
}

impl Rows {
    fn new(
        c: &fastdecode_model::LagunaConfig,
        st: &Arc<cudarc::driver::CudaStream>,
        n: usize,
    ) -> Result<Rows> {
        let ms = moe_shape(c);
        let h = c.hidden_size;
        Ok(Rows {
            tok: st.alloc_zeros(n)?,
            pos: st.alloc_zeros(n)?,
            next: st.alloc_zeros(n)?,
            x: st.alloc_zeros(n * h)?,
            xn: st.alloc_zeros(n * h)?,
            qkvg: st.alloc_zeros(n * qkvg_width(c))?,
            router_logits: st.alloc_zeros(n * c.num_experts.max(1))?,
            ids: st.alloc_zeros(n * ms.top_k.max(1))?,
            wts: st.alloc_zeros(n * ms.top_k.max(1))?,
            h: st.alloc_zeros(n * (ms.top_k + 1) * ms.slot_width().max(1))?,
            gate_up: st.alloc_zeros(n * 2 * c.intermediate_size.max(1))?,
            act: st.alloc_zeros(n * c.intermediate_size.max(1))?,
        })
    }

    /// The step kernels' gate/up of the first `n` rows: `h` from `xn` and the router's `ids`.
    fn moe_gate_up(&mut self, g: &Gpu, layer: &MoeLayer, n: usize) -> Result<()> {
        g.moe_gate_up(
            layer,
            &self.xn.as_view(),
            &self.ids.as_view(),
            n,
            &mut self.h.as_view_mut(),
        )
    }

    /// The step kernels' down of the first `n` rows from `h`, weighted by the router's `wts`
    /// and added onto `x`.
    fn moe_down(&mut self, g: &Gpu, layer: &MoeLayer, n: usize) -> Result<()> {
        let routing = Routing {
            ids: &self.ids.as_view(),
            wts: &self.wts.as_view(),
        };
        g.moe_down(
            layer,
            &self.h.as_view(),
            routing,
            n,
            &mut self.x.as_view_mut(),
        )
    }
}

/// The step's buffers for one launch of up to `MAX_ROWS` rows, allocated once.
struct Scratch {
    /// Page-locked staging of the step's token ids and positions: copies from it are truly
    /// asynchronous (from pageable memory the driver would synchronise the stream first).
    host_tok: PinnedHostSlice<i32>,
    host_pos: PinnedHostSlice<i32>,
    /// Page-locked landing slots of `serial_greedy`'s choices, used in turn: one is read while
    /// the next step's choice is already on its way into the other. Each has its own event,
    /// recorded after the copy into it: cudarc records a page-locked slice's own event only when
    /// it tracks events, which this single-stream context turns off, so the slice's own
    /// synchronisation would not wait for the copy.
    host_next: [(PinnedHostSlice<i32>, CudaEvent); 2],
    rows: Rows,
    /// The attention output (the prefill's attention writes the o_proj GEMM's split instead).
    att: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    part: CudaSlice<f32>,
    att_counters: CudaSlice<u32>,
    router_counter: CudaSlice<u32>,
    taps: CudaSlice<f32>,
}

/// Which rows of a step get logits and a greedy choice.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Logits {
    /// Every row (a decode step or a verify block).
    All,
    /// Only the last row (the end of a prefill).
    Last,
    /// None (a prefill chunk before the last).
    Skip,
}

pub struct CudaTarget {
    pub model: Arc<CudaModel>,
    kv: Vec<(CudaSlice<f32>, CudaSlice<f32>)>,
    len: usize,
    max_positions: usize,
    s: Scratch,
    p: Option<PrefillScratch>,
    /// Captured steps by row count, logits mode and tapped layers.
    graphs: HashMap<(usize, Logits, Vec<usize>), CudaGraph>,
    /// Replay steps as CUDA graphs (default); off, every kernel is launched one by one.
    pub use_graphs: bool,
    /// When set, every op is bracketed by CUDA events (`fastdecode bench --profile`); steps are
    /// then launched one by one, so each op's figure includes its launch gap.
    pub profiler: Option<crate::profile::Profiler>,
    /// When set, every step is launched eagerly and each sparse layer's routed expert ids
    /// (rows × top-k) are copied out after its router, one entry per layer and step: how many
    /// distinct experts a verify block reads (`fastdecode bench`). Never set in timed runs.
    pub expert_trace: Option<Vec<Vec<i32>>>,
}

/// Rows of one step (a decode step or a verify block): the GEMV kernels' row limit.
const CHUNK: usize = MAX_ROWS;
/// Rows of one prefill launch sequence. Longer runs of rows take the prefill path: tensor-core
/// GEMMs (bf16 hi/lo split, about f32-accurate), flash-style attention and grouped NVFP4 expert
/// GEMMs. Its rows differ from the step path's in the last bits (other summation orders), which
/// is fine: a prefill is shared by every decoding policy, while verify blocks, whose rows must
/// match serial decoding bit for bit, always take the step path.
pub const PREFILL_CHUNK: usize = 512;
/// Slots a sliding layer's ring holds beyond its window: the most rows one launch writes.
const RING_MARGIN: usize = PREFILL_CHUNK;

/// The prefill path's buffers for one chunk, allocated on the first prefill.
struct PrefillScratch {
    rows: Rows,
    /// Normed and rotated queries.
    q: CudaSlice<f32>,
    logits: Option<CudaSlice<f32>>,
    /// The tapped hidden states of a chunk (`rows × taps × hidden`), sized on first use.
    taps: Option<CudaSlice<f32>>,
}

/// Where a forward's tapped hidden states go: copied to the host (returned), or left on the
/// device in the caller's buffer (`rows × taps × hidden` from row 0) for a drafter there.
pub enum TapsTo<'a> {
    Host,
    Device(&'a mut CudaSlice<f32>),
}

impl CudaTarget {
    /// A session for verify blocks of up to `max_block` rows and contexts of up to `max_positions`.
    pub fn new(model: Arc<CudaModel>, max_block: usize, max_positions: usize) -> Result<Self> {
        if max_block > MAX_ROWS {
            return Err(CudaError::Shape(format!(
                "blocks of {max_block} rows: the CUDA step carries at most {MAX_ROWS}"
            )));
        }
        let c = &model.cfg;
        let st = &model.gpu.stream;
        let kvd = c.num_key_value_heads * c.head_dim;
        let mut kv = vec![];
        for l in &model.layers {
            let slots = if l.window > 0 {
                l.window + RING_MARGIN
            } else {
                max_positions
            };
            kv.push((
                st.alloc_zeros::<f32>(slots * kvd)?,
                st.alloc_zeros::<f32>(slots * kvd)?,
            ));
        }
        let hmax = max_heads(c);
        let (h, d, n) = (c.hidden_size, c.head_dim, CHUNK);
        let ctx = &model.gpu.ctx;
        // SAFETY: every element is written before it is copied (`step` fills rows 0..n and
        // copies the whole buffer; rows past n are ignored by the kernels).
        let (mut host_tok, mut host_pos) =
            unsafe { (ctx.alloc_pinned::<i32>(n)?, ctx.alloc_pinned::<i32>(n)?) };
        host_tok.as_mut_slice()?.fill(0);
        host_pos.as_mut_slice()?.fill(0);
        // SAFETY: each slot is read only after a copy into it has completed (its event). Not
        // write-combined (the default): the host reads these, and reads of write-combined
        // memory bypass the cache.
        let host_next = unsafe {
            [
                (
                    ctx.alloc_pinned_with_flags::<i32>(1, 0)?,
                    ctx.new_event(None)?,
                ),
                (
                    ctx.alloc_pinned_with_flags::<i32>(1, 0)?,
                    ctx.new_event(None)?,
                ),
            ]
        };
        let s = Scratch {
            host_tok,
            host_pos,
            host_next,
            rows: Rows::new(c, st, n)?,
            att: st.alloc_zeros(n * hmax * d)?,
            logits: st.alloc_zeros(n * c.vocab_size)?,
            part: st.alloc_zeros(n * hmax * ATT_SPLITS * (d + 2))?,
            att_counters: st.alloc_zeros(n * c.num_key_value_heads)?,
            router_counter: st.alloc_zeros(n)?,
            taps: st.alloc_zeros(n * c.num_hidden_layers * h)?,
        };
        Ok(CudaTarget {
            model,
            kv,
            len: 0,
            max_positions,
            s,
            p: None,
            graphs: HashMap::new(),
            use_graphs: true,
            profiler: None,
            expert_trace: None,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn truncate(&mut self, len: usize) {
        assert!(len <= self.len, "truncate can only shrink the cache");
        self.len = len;
    }

    pub fn reset(&mut self) {
        self.len = 0;
    }

    fn validate(&self, tokens: &[u32], positions: &[usize], taps: &[usize]) -> Result<()> {
        let c = &self.model.cfg;
        let p0 = self.len;
        if tokens.is_empty() {
            return Err(CudaError::Shape("forward: no rows".into()));
        }
        if positions.len() != tokens.len()
            || positions.iter().enumerate().any(|(i, &p)| p != p0 + i)
        {
            return Err(CudaError::Shape(format!(
                "forward: positions {positions:?} do not continue the KV cache of length {p0}"
            )));
        }
        if p0 + tokens.len() > self.max_positions {
            return Err(CudaError::Shape(format!(
                "forward: context {} exceeds this session's {} positions",
                p0 + tokens.len(),
                self.max_positions
            )));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            return Err(CudaError::Shape(format!(
                "forward: token id {t} is outside the vocabulary (0..{})",
                c.vocab_size
            )));
        }
        if let Some(&l) = taps.iter().find(|&&l| l >= c.num_hidden_layers) {
            return Err(CudaError::Shape(format!(
                "forward: tap layer {l} is out of range 0..{}",
                c.num_hidden_layers
            )));
        }
        Ok(())
    }

    /// Runs rows `tokens` at `positions` (continuing the cache) and returns every row's logits
    /// and the hidden states of the `taps` layers (the CPU reference's entry point).
    pub fn forward(
        &mut self,
        tokens: &[u32],
        positions: &[usize],
        taps: &[usize],
    ) -> Result<ForwardOut> {
        self.validate(tokens, positions, taps)?;
        let (vocab, h) = (self.model.cfg.vocab_size, self.model.cfg.hidden_size);
        let mut out = ForwardOut {
            logits: Vec::with_capacity(tokens.len() * vocab),
            taps: Vec::with_capacity(tokens.len() * taps.len() * h),
        };
        let mut start = 0;
        while start < tokens.len() {
            let n = chunk_rows(tokens.len() - start);
            let rows = &tokens[start..start + n];
            let st = self.model.gpu.stream.clone();
            if n > CHUNK {
                self.prefill(rows, self.len, taps, Logits::All)?;
                let p = self.p.as_ref().expect("allocated by prefill");
                let logits = p.logits.as_ref().expect("allocated for all-row logits");
                out.logits
                    .extend(st.clone_dtoh(&logits.slice(0..n * vocab))?);
            } else {
                self.step(rows, self.len, taps, Logits::All)?;
                out.logits
                    .extend(st.clone_dtoh(&self.s.logits.slice(0..n * vocab))?);
            }
            if !taps.is_empty() {
                out.taps
                    .extend(st.clone_dtoh(&self.taps_of(n > CHUNK).slice(0..n * taps.len() * h))?);
            }
            start += n;
        }
        Ok(out)
    }

    /// A prefill as decoding runs it (`forward_greedy` of the last row only), returning that
    /// row's logits: the very numbers its greedy choice was made from. The all-row path
    /// (`forward`) computes a long prompt's logits with the prefill's GEMM, whose last bits
    /// differ from this GEMV's, so a replay that must agree with decoding starts here.
    pub fn prefill_logits(&mut self, tokens: &[u32], positions: &[usize]) -> Result<Vec<f32>> {
        self.forward_greedy(tokens, positions, &[], true, TapsTo::Host)?;
        let vocab = self.model.cfg.vocab_size;
        Ok(self
            .model
            .gpu
            .stream
            .clone_dtoh(&self.s.logits.slice(0..vocab))?)
    }

    /// `forward` keeping only the greedy choice (argmax, ties to the lower id) of every row, or
    /// of the last row only when `last_only`, computed on the device; plus the taps.
    /// With `TapsTo::Device` the taps stay on the device and the returned taps are empty.
    pub fn forward_greedy(
        &mut self,
        tokens: &[u32],
        positions: &[usize],
        taps: &[usize],
        last_only: bool,
        mut taps_to: TapsTo,
    ) -> Result<(Vec<u32>, Vec<f32>)> {
        self.validate(tokens, positions, taps)?;
        let h = self.model.cfg.hidden_size;
        if let TapsTo::Device(buf) = &taps_to {
            if buf.len() < tokens.len() * taps.len() * h {
                return Err(CudaError::Shape(format!(
                    "forward: the device taps buffer holds {} floats, {} rows × {} taps × {h} needed",
                    buf.len(),
                    tokens.len(),
                    taps.len()
                )));
            }
        }
        let mut chosen = vec![];
        let mut tap_rows = Vec::with_capacity(tokens.len() * taps.len() * h);
        let mut start = 0;
        while start < tokens.len() {
            let n = chunk_rows(tokens.len() - start);
            let end = start + n;
            let mode = match (last_only, end == tokens.len()) {
                (false, _) => Logits::All,
                (true, true) => Logits::Last,
                (true, false) => Logits::Skip,
            };
            let m = match mode {
                Logits::All => n,
                Logits::Last => 1,
                Logits::Skip => 0,
            };
            let st = self.model.gpu.stream.clone();
            if n > CHUNK {
                self.prefill(&tokens[start..end], self.len, taps, mode)?;
                if m > 0 {
                    let next = &self.p.as_ref().expect("allocated by prefill").rows.next;
                    let ids = st.clone_dtoh(&next.slice(0..m))?;
                    chosen.extend(ids.into_iter().map(|t| t as u32));
                }
            } else {
                self.step(&tokens[start..end], self.len, taps, mode)?;
                if m > 0 {
                    let ids = st.clone_dtoh(&self.s.rows.next.slice(0..m))?;
                    chosen.extend(ids.into_iter().map(|t| t as u32));
                }
            }
            if !taps.is_empty() {
                let per = taps.len() * h;
                let src = self.taps_of(n > CHUNK).slice(0..n * per);
                match &mut taps_to {
                    TapsTo::Host => tap_rows.extend(st.clone_dtoh(&src)?),
                    TapsTo::Device(buf) => {
                        st.memcpy_dtod(&src, &mut buf.slice_mut(start * per..end * per))?
                    }
                }
            }
            start = end;
        }
        Ok((chosen, tap_rows))
    }

    /// Serial greedy decoding from the end of the cache: runs `first` at position `len()`, then
    /// each step's own choice, until `steps` choices are made or one is in `stop`; `on_token`
    /// hears each choice as it reaches the host. Returns how many were made; the cache then holds
    /// one more position per choice made.
    ///
    /// Each step is enqueued before the previous step's choice is read: the choice goes from the
    /// argmax to the next step's token buffer by a device copy, and the positions are known
    /// ahead, so the host's read of a choice, its checks and the next launch overlap the GPU's
    /// work instead of leaving it idle between steps. The tokens are those of one-row
    /// `forward_greedy` steps (the same graph runs on the same inputs). A step run ahead past a
    /// stop token leaves the cache (its position is written again by whatever runs next).
    pub fn serial_greedy(
        &mut self,
        first: u32,
        steps: usize,
        stop: &[u32],
        on_token: &mut dyn FnMut(u32),
    ) -> Result<usize> {
        if steps == 0 {
            return Ok(0);
        }
        let p0 = self.len;
        self.validate(&[first], &[p0], &[])?;
        if p0 + steps > self.max_positions {
            return Err(CudaError::Shape(format!(
                "serial decoding: {steps} steps from position {p0} exceed this session's {} positions",
                self.max_positions
            )));
        }
        let st = self.model.gpu.stream.clone();
        // The positions of the steps after the first, on the device for the whole run.
        let later: Vec<i32> = (p0 + 1..p0 + steps).map(|p| p as i32).collect();
        let later = if later.is_empty() {
            None
        } else {
            Some(st.clone_htod(&later)?)
        };
        self.step(&[first], p0, &[], Logits::All)?;
        let mut made = 0;
        loop {
            let slot = made % 2;
            let (host, copied) = &mut self.s.host_next[slot];
            st.memcpy_dtoh(&self.s.rows.next.slice(0..1), host)?;
            copied.record(&st)?;
            if let Some(later) = later.as_ref().filter(|_| made + 1 < steps) {
                let r = &mut self.s.rows;
                st.memcpy_dtod(&r.next.slice(0..1), &mut r.tok.slice_mut(0..1))?;
                st.memcpy_dtod(&later.slice(made..made + 1), &mut r.pos.slice_mut(0..1))?;
                self.run_step(1, p0 + made + 1, &[], Logits::All)?;
            }
            // Waits for this slot's copy only: the step behind it keeps the GPU busy.
            let (host, copied) = &self.s.host_next[slot];
            copied.synchronize()?;
            let t = host.as_slice()?[0] as u32;
            made += 1;
            on_token(t);
            if made == steps || stop.contains(&t) {
                self.len = p0 + made;
                return Ok(made);
            }
        }
    }

    /// The buffer the last step (or prefill chunk) wrote its taps to.
    fn taps_of(&self, prefill: bool) -> &CudaSlice<f32> {
        if prefill {
            self.p
                .as_ref()
                .and_then(|p| p.taps.as_ref())
                .expect("a prefill with taps allocated them")
        } else {
            &self.s.taps
        }
    }

    /// Appends `n <= MAX_ROWS` rows at positions `len..len + n` whose every layer's input is the
    /// same row of `x` (`n × hidden`, on the device): each layer's K and V of `RMSNorm(x;
    /// input_layernorm)`, normed and rotated as a forward would, are written to its cache; no
    /// attention, no output. The DFlash drafter's context rows (`docs/spec/dflash.md`, round
    /// step 1).
    pub fn append_kv_rows(&mut self, x: &CudaView<f32>, n: usize) -> Result<()> {
        let m = self.model.clone();
        let c = &m.cfg;
        let (h, d) = (c.hidden_size, c.head_dim);
        if n == 0 || n > CHUNK || x.len() < n * h {
            return Err(CudaError::Shape(format!(
                "append_kv_rows: {n} rows (1..={CHUNK}) of {h} from a buffer of {}",
                x.len()
            )));
        }
        if self.len + n > self.max_positions {
            return Err(CudaError::Shape(format!(
                "append_kv_rows: context {} exceeds this session's {} positions",
                self.len + n,
                self.max_positions
            )));
        }
        let g = m.gpu.as_ref();
        let st = &g.stream;
        let eps = c.rms_norm_eps as f32;
        let p0 = self.len;
        let pos: Vec<i32> = (p0..p0 + n).map(|p| p as i32).collect();
        st.memcpy_htod(&pos, &mut self.s.rows.pos.slice_mut(0..n))?;
        g.set_pdl(false);
        let s = &mut self.s;
        for (li, l) in m.layers.iter().enumerate() {
            let shape = attn_shape(c, l);
            let width = shape.width();
            g.gemv_bf16(
                &l.qkvg.as_view(),
                x,
                Some(Norm {
                    w: &l.input_norm.as_view(),
                    eps,
                }),
                &mut s.rows.qkvg.as_view_mut(),
                MatShape {
                    out: width,
                    inp: h,
                    rows: n,
                },
                Accumulate::Overwrite,
            )?;
            let (ck, cv) = &mut self.kv[li];
            // The queries are computed and dropped (the attention scratch holds them).
            g.qk_norm_rope_store(
                AttnRows {
                    qkvg: &s.rows.qkvg.slice(0..n * width),
                    pos: &s.rows.pos.slice(0..n),
                    q_norm: &l.q_norm,
                    k_norm: &l.k_norm,
                    eps,
                    rope: &l.rope,
                    shape,
                    rows: n,
                },
                &mut s.att.slice_mut(0..n * l.heads * d),
                ck,
                cv,
            )?;
        }
        self.len = p0 + n;
        Ok(())
    }

    /// One launch sequence of `tokens.len() <= MAX_ROWS` rows starting at position `p0`,
    /// replayed from a CUDA graph when possible.
    fn step(&mut self, tokens: &[u32], p0: usize, taps: &[usize], mode: Logits) -> Result<()> {
        let n = tokens.len();
        let st = self.model.gpu.stream.clone();
        for (d, &t) in self.s.host_tok.as_mut_slice()?.iter_mut().zip(tokens) {
            *d = t as i32;
        }
        for (i, d) in self.s.host_pos.as_mut_slice()?[..n].iter_mut().enumerate() {
            *d = (p0 + i) as i32;
        }
        st.memcpy_htod(&self.s.host_tok, &mut self.s.rows.tok)?;
        st.memcpy_htod(&self.s.host_pos, &mut self.s.rows.pos)?;
        self.run_step(n, p0, taps, mode)
    }

    /// The launch sequence of one step whose token ids and positions are already in the device
    /// buffers, replayed from a CUDA graph when possible.
    fn run_step(&mut self, n: usize, p0: usize, taps: &[usize], mode: Logits) -> Result<()> {
        let st = self.model.gpu.stream.clone();
        let graphable = self.use_graphs && self.profiler.is_none() && self.expert_trace.is_none();
        let key = (n, mode, taps.to_vec());
        if !graphable {
            self.launch(n, p0, taps, mode)?;
        } else if let Some(g) = self.graphs.get(&key) {
            g.launch()?;
        } else {
            // Compile and load every module before capturing (module loads are not stream work),
            // by running this step eagerly once; then capture the same sequence for the next.
            self.launch(n, p0, taps, mode)?;
            st.synchronize()?;
            let saved = self.len;
            st.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
            let captured = self.launch(n, p0, taps, mode);
            let graph = st.end_capture(CUgraphInstantiate_flags(0))?;
            captured?;
            self.len = saved;
            let graph = graph.ok_or_else(|| {
                CudaError::Shape("CUDA graph capture of the step returned no graph".into())
            })?;
            graph.upload()?;
            self.graphs.insert(key, graph);
        }
        self.len = p0 + n;
        Ok(())
    }

    /// Enqueues the kernels of one step, as programmatic dependent launches (each kernel starts
    /// during its predecessor and prefetches its weights); reads token ids and positions from
    /// the device buffers.
    fn launch(&mut self, n: usize, p0: usize, taps: &[usize], mode: Logits) -> Result<()> {
        let gpu = self.model.gpu.clone();
        let r = self.launch_kernels(n, p0, taps, mode);
        gpu.set_pdl(false);
        r
    }

    /// One step's kernels, per layer as `TargetModel::forward` (fastdecode-cpu) computes it:
    /// attention, then the FFN, then the taps; the logits of `mode`'s rows last.
    fn launch_kernels(&mut self, n: usize, p0: usize, taps: &[usize], mode: Logits) -> Result<()> {
        let m = self.model.clone();
        let mut step = Step::new(&m, n, self.profiler.take());
        step.mark("start")?;
        let s = &mut self.s;
        m.gpu.embed_rows(
            &m.embed,
            &s.rows.tok.slice(0..n),
            &mut s.rows.x,
            m.cfg.hidden_size,
        )?;
        step.mark("embed_rows")?;
        // The first kernel follows host copies (token ids, positions), which a programmatic
        // launch would not wait for; the rest follow kernels (taps are copied by one too),
        // unless the expert trace puts copies between.
        m.gpu.set_pdl(self.expert_trace.is_none());
        for (li, l) in m.layers.iter().enumerate() {
            step.attention(l, s, &mut self.kv[li])?;
            match &l.ffn {
                DevFfn::Dense { gate_up, down } => step.dense_ffn(l, gate_up, down, s)?,
                DevFfn::Moe(e) => step.moe_ffn(l, e, s, self.expert_trace.as_mut())?,
            }
            for (t, _) in taps.iter().enumerate().filter(|(_, &tl)| tl == li) {
                step.copy_tap(s, t, taps.len())?;
            }
        }
        step.logits(s, mode)?;
        if let Some(p) = step.prof.as_mut() {
            p.collect()?;
        }
        self.profiler = step.prof;
        self.len = p0 + n;
        Ok(())
    }

    fn prefill_scratch(&mut self, want_logits: bool, taps: usize) -> Result<()> {
        let c = &self.model.cfg;
        let st = &self.model.gpu.stream;
        if self.p.is_none() {
            let n = PREFILL_CHUNK;
            let hmax = max_heads(c);
            self.p = Some(PrefillScratch {
                rows: Rows::new(c, st, n)?,
                q: st.alloc_zeros(n * hmax * c.head_dim)?,
                logits: None,
                taps: None,
            });
        }
        let p = self.p.as_mut().expect("allocated above");
        if want_logits && p.logits.is_none() {
            p.logits = Some(st.alloc_zeros(PREFILL_CHUNK * c.vocab_size)?);
        }
        let tap_floats = PREFILL_CHUNK * taps * c.hidden_size;
        if tap_floats > p.taps.as_ref().map_or(0, |t| t.len()) {
            p.taps = Some(st.alloc_zeros(tap_floats)?);
        }
        Ok(())
    }

    /// The prefill path for one chunk of `MAX_ROWS < n <= PREFILL_CHUNK` rows from position `p0`.
    fn prefill(&mut self, tokens: &[u32], p0: usize, taps: &[usize], mode: Logits) -> Result<()> {
        self.prefill_scratch(mode == Logits::All, taps.len())?;
        let m = self.model.clone();
        let (g, n) = (m.gpu.as_ref(), tokens.len());
        let mut step = Step::new(&m, n, self.profiler.take());
        step.mark("start")?;
        let p = self.p.as_mut().expect("allocated above");
        let toks: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let pos: Vec<i32> = (p0..p0 + n).map(|q| q as i32).collect();
        g.stream
            .memcpy_htod(&toks, &mut p.rows.tok.slice_mut(0..n))?;
        g.stream
            .memcpy_htod(&pos, &mut p.rows.pos.slice_mut(0..n))?;
        g.embed_rows(
            &m.embed,
            &p.rows.tok.slice(0..n),
            &mut p.rows.x,
            m.cfg.hidden_size,
        )?;
        step.mark("prefill embed")?;
        for (li, l) in m.layers.iter().enumerate() {
            step.prefill_attention(l, p, &mut self.kv[li], p0)?;
            let xs = step.prefill_post_norm(l, p)?;
            match &l.ffn {
                DevFfn::Dense { gate_up, down } => step.prefill_dense(gate_up, down, p, &xs)?,
                DevFfn::Moe(e) => step.prefill_moe(e, p, &xs)?,
            }
            for (t, _) in taps.iter().enumerate().filter(|(_, &tl)| tl == li) {
                step.prefill_copy_tap(p, t, taps.len())?;
            }
        }
        step.prefill_logits(p, &mut self.s.logits, mode)?;
        step.mark("prefill lm_head + argmax")?;
        if let Some(pr) = step.prof.as_mut() {
            pr.collect()?;
        }
        self.profiler = step.prof;
        self.len = p0 + n;
        Ok(())
    }
}

/// The launches of one step of `n` rows over the model's layers, each op marked for the
/// profiler when one is set.
struct Step<'m> {
    m: &'m CudaModel,
    n: usize,
    eps: f32,
    prof: Option<crate::profile::Profiler>,
}

impl<'m> Step<'m> {
    fn new(m: &'m CudaModel, n: usize, prof: Option<crate::profile::Profiler>) -> Step<'m> {
        let eps = m.cfg.rms_norm_eps as f32;
        Step { m, n, eps, prof }
    }

    fn mark(&mut self, what: &'static str) -> Result<()> {
        mark(&mut self.prof, what, &self.m.gpu.stream)
    }

    /// The normed q|k|v|g projection, the attention over the layer's cache (which takes the
    /// rows' keys and values) and o_proj added onto the rows.
    fn attention(
        &mut self,
        l: &DevLayer,
        s: &mut Scratch,
        (ck, cv): &mut (CudaSlice<f32>, CudaSlice<f32>),
    ) -> Result<()> {
        let (g, c, n, eps) = (self.m.gpu.as_ref(), &self.m.cfg, self.n, self.eps);
        let h = c.hidden_size;
        let shape = attn_shape(c, l);
        g.gemv_bf16(
            &l.qkvg.as_view(),
            &s.rows.x.as_view(),
            Some(Norm {
                w: &l.input_norm.as_view(),
                eps,
            }),
            &mut s.rows.qkvg.as_view_mut(),
            MatShape {
                out: shape.width(),
                inp: h,
                rows: n,
            },
            Accumulate::Overwrite,
        )?;
        self.mark("norm + gemv qkvg")?;
        g.attend_decode(
            AttnRows {
                qkvg: &s.rows.qkvg.as_view(),
                pos: &s.rows.pos.as_view(),
                q_norm: &l.q_norm,
                k_norm: &l.k_norm,
                eps,
                rope: &l.rope,
                shape,
                rows: n,
            },
            ck,
            cv,
            &mut s.part,
            &mut s.att_counters,
            &mut s.att.as_view_mut(),
        )?;
        self.mark("attend (qk norm, rope, kv store, split-KV, gate)")?;
        g.gemv_bf16(
            &l.o.as_view(),
            &s.att.as_view(),
            None,
            &mut s.rows.x.as_view_mut(),
            MatShape {
                out: h,
                inp: l.heads * c.head_dim,
                rows: n,
            },
            Accumulate::Add,
        )?;
        self.mark("gemv o_proj + residual")
    }

    /// A dense layer's FFN added onto the rows: normed gate|up, silu · up, down.
    fn dense_ffn(
        &mut self,
        l: &DevLayer,
        gate_up: &CudaSlice<bf16>,
        down: &CudaSlice<bf16>,
        s: &mut Scratch,
    ) -> Result<()> {
        let (g, c, n, eps) = (self.m.gpu.as_ref(), &self.m.cfg, self.n, self.eps);
        let (h, w) = (c.hidden_size, c.intermediate_size);
        g.gemv_bf16(
            &gate_up.as_view(),
            &s.rows.x.as_view(),
            Some(Norm {
                w: &l.post_norm.as_view(),
                eps,
            }),
            &mut s.rows.gate_up.as_view_mut(),
            MatShape {
                out: 2 * w,
                inp: h,
                rows: n,
            },
            Accumulate::Overwrite,
        )?;
        self.mark("dense norm + gemv gate_up")?;
        g.silu_mul(
            &s.rows.gate_up.as_view(),
            &mut s.rows.act.as_view_mut(),
            w,
            n,
        )?;
        self.mark("dense silu_mul")?;
        g.gemv_bf16(
            &down.as_view(),
            &s.rows.act.as_view(),
            None,
            &mut s.rows.x.as_view_mut(),
            MatShape {
                out: h,
                inp: w,
                rows: n,
            },
            Accumulate::Add,
        )?;
        self.mark("dense gemv down + residual")
    }

    /// A sparse layer's FFN added onto the rows: the router (norm, logits, top-k), the routed
    /// and shared experts' gate/up, then their down and the weighted combine. With `trace`, the
    /// routed ids are copied out after the router.
    fn moe_ffn(
        &mut self,
        l: &DevLayer,
        e: &DevMoe,
        s: &mut Scratch,
        trace: Option<&mut Vec<Vec<i32>>>,
    ) -> Result<()> {
        let (g, c, n, eps) = (self.m.gpu.as_ref(), &self.m.cfg, self.n, self.eps);
        let ms = moe_shape(c);
        g.router(
            &s.rows.x.as_view(),
            RouterWeights {
                norm: &l.post_norm,
                eps,
                w: &e.router,
            },
            e.top_k(c),
            ms,
            n,
            RouterOut {
                xn: &mut s.rows.xn.as_view_mut(),
                logits: &mut s.rows.router_logits.as_view_mut(),
                ids: &mut s.rows.ids.as_view_mut(),
                wts: &mut s.rows.wts.as_view_mut(),
                counter: &mut s.router_counter,
            },
        )?;
        self.mark("router (norm, logits, top-k)")?;
        if let Some(trace) = trace {
            trace.push(g.stream.clone_dtoh(&s.rows.ids.slice(0..n * ms.top_k))?);
        }
        let layer = e.layer(ms, c.moe_routed_scaling_factor as f32);
        s.rows.moe_gate_up(g, &layer, n)?;
        self.mark("nvfp4 gate_up (routed + shared)")?;
        s.rows.moe_down(g, &layer, n)?;
        self.mark("nvfp4 down + combine + residual")
    }

    /// The rows' hidden states into tap slot `t` of `count`.
    fn copy_tap(&mut self, s: &mut Scratch, t: usize, count: usize) -> Result<()> {
        let (n, h) = (self.n, self.m.cfg.hidden_size);
        self.m.gpu.copy_taps(
            &s.rows.x.slice(0..n * h),
            &mut s.taps.as_view_mut(),
            n,
            h,
            count,
            t,
        )?;
        self.mark("copy taps")
    }

    /// The normed lm_head and argmax of `mode`'s rows.
    fn logits(&mut self, s: &mut Scratch, mode: Logits) -> Result<()> {
        let (g, c, n) = (self.m.gpu.as_ref(), &self.m.cfg, self.n);
        let h = c.hidden_size;
        let (first, rows) = match mode {
            Logits::All => (0, n),
            Logits::Last => (n - 1, 1),
            Logits::Skip => (n, 0),
        };
        if rows == 0 {
            return Ok(());
        }
        g.gemv_bf16(
            &self.m.lm_head.as_view(),
            &s.rows.x.slice(first * h..(first + rows) * h),
            Some(Norm {
                w: &self.m.norm.as_view(),
                eps: self.eps,
            }),
            &mut s.logits.as_view_mut(),
            MatShape {
                out: c.vocab_size,
                inp: h,
                rows,
            },
            Accumulate::Overwrite,
        )?;
        self.mark("norm + gemv lm_head")?;
        g.argmax_rows(
            &s.logits.as_view(),
            c.vocab_size,
            rows,
            &mut s.rows.next.as_view_mut(),
        )?;
        self.mark("argmax")
    }
}

/// The prefill path's launches (tensor-core GEMMs, flash-style attention, grouped experts).
impl Step<'_> {
    /// Whether the grouped expert GEMMs take this model's MoE widths (multiples of 128).
    fn grouped_moe(&self) -> bool {
        let ms = moe_shape(&self.m.cfg);
        [ms.hidden, ms.inter, ms.shared_inter]
            .iter()
            .all(|v| v.is_multiple_of(128))
    }

    /// The normed q|k|v|g GEMM, the rows' keys and values into the layer's cache, the attention
    /// of the rows at `p0..` over it, and o_proj added onto the rows.
    fn prefill_attention(
        &mut self,
        l: &DevLayer,
        p: &mut PrefillScratch,
        (ck, cv): &mut (CudaSlice<f32>, CudaSlice<f32>),
        p0: usize,
    ) -> Result<()> {
        let (g, c, n, eps) = (self.m.gpu.as_ref(), &self.m.cfg, self.n, self.eps);
        let (h, d) = (c.hidden_size, c.head_dim);
        let shape = attn_shape(c, l);
        let width = shape.width();
        // The norm writes the GEMM's hi/lo split directly (the normed rows are not needed).
        let xs = g.rms_norm_split(
            &p.rows.x.slice(0..n * h),
            Norm {
                w: &l.input_norm.as_view(),
                eps,
            },
            None,
            GroupedSplit::Skip,
            RowShape { rows: n, n: h },
        )?;
        self.mark("prefill rms_norm (+ split)")?;
        g.gemm_bf16_tc_split(
            &l.qkvg.as_view(),
            &xs.xs.as_view(),
            &mut p.rows.qkvg.slice_mut(0..n * width),
            MatShape {
                out: width,
                inp: h,
                rows: n,
            },
            Accumulate::Overwrite,
        )?;
        self.mark("prefill gemm qkvg (hi/lo)")?;
        g.qk_norm_rope_store(
            AttnRows {
                qkvg: &p.rows.qkvg.slice(0..n * width),
                pos: &p.rows.pos.slice(0..n),
                q_norm: &l.q_norm,
                k_norm: &l.k_norm,
                eps,
                rope: &l.rope,
                shape,
                rows: n,
            },
            &mut p.q.slice_mut(0..n * l.heads * d),
            ck,
            cv,
        )?;
        self.mark("prefill qk norm + rope + kv store")?;
        // Straight into the o_proj GEMM's hi/lo split.
        let att = g.attend_prefill_split(PrefillAttn {
            q: &p.q.slice(0..n * l.heads * d),
            ck: &ck.as_view(),
            cv: &cv.as_view(),
            // The gate logits: the tail of each fused projection row.
            g: &p.rows.qkvg.slice(width - l.heads..n * width),
            g_stride: width,
            pos: &p.rows.pos.slice(0..n),
            // The layer's attn_shape: l.heads, its kv heads, head_dim d, l.window, its ring.
            shape,
            rows: n,
            // The keys these rows see: the first row's window through the last row.
            keys: if l.window > 0 {
                (p0 + 1).saturating_sub(l.window)
            } else {
                0
            }..p0 + n,
        })?;
        self.mark("prefill attention")?;
        g.gemm_bf16_tc_split(
            &l.o.as_view(),
            &att.as_view(),
            &mut p.rows.x.slice_mut(0..n * h),
            MatShape {
                out: h,
                inp: l.heads * d,
                rows: n,
            },
            Accumulate::Add,
        )?;
        self.mark("prefill gemm o_proj + residual")
    }

    /// The post-attention norm: the split for the router or dense GEMM, and for the experts
    /// either the grouped GEMMs' layout or (step kernels) the normed rows.
    fn prefill_post_norm(
        &mut self,
        l: &DevLayer,
        p: &mut PrefillScratch,
    ) -> Result<crate::prefill::NormSplit> {
        let (n, h) = (self.n, self.m.cfg.hidden_size);
        let moe_layer = matches!(l.ffn, DevFfn::Moe(_));
        let grouped = self.grouped_moe();
        let xs = self.m.gpu.rms_norm_split(
            &p.rows.x.slice(0..n * h),
            Norm {
                w: &l.post_norm.as_view(),
                eps: self.eps,
            },
            (moe_layer && !grouped).then_some(&mut p.rows.xn.slice_mut(0..n * h)),
            if moe_layer && grouped {
                GroupedSplit::Make
            } else {
                GroupedSplit::Skip
            },
            RowShape { rows: n, n: h },
        )?;
        self.mark("prefill rms_norm (+ split)")?;
        Ok(xs)
    }

    /// A dense layer's FFN added onto the rows from the normed split `xs`.
    fn prefill_dense(
        &mut self,
        gate_up: &CudaSlice<bf16>,
        down: &CudaSlice<bf16>,
        p: &mut PrefillScratch,
        xs: &crate::prefill::NormSplit,
    ) -> Result<()> {
        let (g, c, n) = (self.m.gpu.as_ref(), &self.m.cfg, self.n);
        let (h, w) = (c.hidden_size, c.intermediate_size);
        g.gemm_bf16_tc_split(
            &gate_up.as_view(),
            &xs.xs.as_view(),
            &mut p.rows.gate_up.slice_mut(0..n * 2 * w),
            MatShape {
                out: 2 * w,
                inp: h,
                rows: n,
            },
            Accumulate::Overwrite,
        )?;
        g.silu_mul(
            &p.rows.gate_up.as_view(),
            &mut p.rows.act.as_view_mut(),
            w,
            n,
        )?;
        g.gemm_bf16_tc(
            &down.as_view(),
            &p.rows.act.slice(0..n * w),
            &mut p.rows.x.slice_mut(0..n * h),
            MatShape {
                out: h,
                inp: w,
                rows: n,
            },
            Accumulate::Add,
        )?;
        self.mark("prefill dense mlp")
    }

    /// A sparse layer's FFN added onto the rows from the post norm's `xs`: the router GEMM and
    /// top-k, then the grouped expert GEMMs, or the step kernels for widths they do not take.
    fn prefill_moe(
        &mut self,
        e: &DevMoe,
        p: &mut PrefillScratch,
        xs: &crate::prefill::NormSplit,
    ) -> Result<()> {
        let (g, c, n) = (self.m.gpu.as_ref(), &self.m.cfg, self.n);
        let (h, ms) = (c.hidden_size, moe_shape(c));
        g.gemm_bf16_tc_split(
            &e.router.as_view(),
            &xs.xs.as_view(),
            &mut p.rows.router_logits.slice_mut(0..n * ms.experts),
            MatShape {
                out: ms.experts,
                inp: h,
                rows: n,
            },
            Accumulate::Overwrite,
        )?;
        g.router_topk(
            &p.rows.router_logits.slice(0..n * ms.experts),
            e.top_k(c),
            ms,
            n,
            &mut p.rows.ids.as_view_mut(),
            &mut p.rows.wts.as_view_mut(),
        )?;
        self.mark("prefill router (gemm + top-k)")?;
        let layer = e.layer(ms, c.moe_routed_scaling_factor as f32);
        if self.grouped_moe() {
            let perm = xs.perm.as_ref().expect("asked for grouped MoE layers");
            let routing = Routing {
                ids: &p.rows.ids.slice(0..n * ms.top_k),
                wts: &p.rows.wts.slice(0..n * ms.top_k),
            };
            let x = &mut p.rows.x.slice_mut(0..n * h);
            g.moe_prefill_split(&layer, &perm.as_view(), routing, n, x)?;
            return self.mark("prefill grouped moe");
        }
        // Widths the grouped kernel does not take: the step kernels, every row reading its own
        // experts.
        p.rows.moe_gate_up(g, &layer, n)?;
        p.rows.moe_down(g, &layer, n)?;
        self.mark("prefill moe (step kernels)")
    }

    /// The rows' hidden states into tap slot `t` of `count`.
    fn prefill_copy_tap(&mut self, p: &mut PrefillScratch, t: usize, count: usize) -> Result<()> {
        let (n, h) = (self.n, self.m.cfg.hidden_size);
        let buf = p.taps.as_mut().expect("sized by prefill_scratch");
        self.m.gpu.copy_taps(
            &p.rows.x.slice(0..n * h),
            &mut buf.as_view_mut(),
            n,
            h,
            count,
            t,
        )?;
        self.mark("prefill copy taps")
    }

    /// The argmax of `mode`'s rows: the last one's by the step's GEMV into `step_logits`, or
    /// every row's by the tensor-core GEMM into the prefill's own logits.
    fn prefill_logits(
        &mut self,
        p: &mut PrefillScratch,
        step_logits: &mut CudaSlice<f32>,
        mode: Logits,
    ) -> Result<()> {
        let (g, c, n) = (self.m.gpu.as_ref(), &self.m.cfg, self.n);
        let h = c.hidden_size;
        match mode {
            Logits::Skip => {}
            Logits::Last => {
                g.gemv_bf16(
                    &self.m.lm_head.as_view(),
                    &p.rows.x.slice((n - 1) * h..n * h),
                    Some(Norm {
                        w: &self.m.norm.as_view(),
                        eps: self.eps,
                    }),
                    &mut step_logits.as_view_mut(),
                    MatShape {
                        out: c.vocab_size,
                        inp: h,
                        rows: 1,
                    },
                    Accumulate::Overwrite,
                )?;
                g.argmax_rows(
                    &step_logits.as_view(),
                    c.vocab_size,
                    1,
                    &mut p.rows.next.as_view_mut(),
                )?;
            }
            Logits::All => {
                let logits = p.logits.as_mut().expect("allocated above");
                let xs = g.rms_norm_split(
                    &p.rows.x.slice(0..n * h),
                    Norm {
                        w: &self.m.norm.as_view(),
                        eps: self.eps,
                    },
                    None,
                    GroupedSplit::Skip,
                    RowShape { rows: n, n: h },
                )?;
                g.gemm_bf16_tc_split(
                    &self.m.lm_head.as_view(),
                    &xs.xs.as_view(),
                    &mut logits.slice_mut(0..n * c.vocab_size),
                    MatShape {
                        out: c.vocab_size,
                        inp: h,
                        rows: n,
                    },
                    Accumulate::Overwrite,
                )?;
                g.argmax_rows(
                    &logits.as_view(),
                    c.vocab_size,
                    n,
                    &mut p.rows.next.as_view_mut(),
                )?;
            }
        }
        Ok(())
    }
}

/// The attention shape of layer `l` as the kernels take it (sliding rings: window + margin).
fn attn_shape(c: &fastdecode_model::LagunaConfig, l: &crate::model::DevLayer) -> AttnShape {
    AttnShape {
        heads: l.heads,
        kv_heads: c.num_key_value_heads,
        head_dim: c.head_dim,
        window: l.window,
        ring: if l.window > 0 {
            l.window + RING_MARGIN
        } else {
            0
        },
    }
}

/// The most query heads of any layer (scratch sizes).
fn max_heads(c: &fastdecode_model::LagunaConfig) -> usize {
    c.num_attention_heads_per_layer
        .iter()
        .copied()
        .max()
        .unwrap_or(1)
}

/// The widest fused q|k|v|g projection row of any layer.
fn qkvg_width(c: &fastdecode_model::LagunaConfig) -> usize {
    let (h, d) = (max_heads(c), c.head_dim);
    h * d + 2 * c.num_key_value_heads * d + h
}

/// Rows of the next launch sequence out of `left`: a prefill chunk when more than a step's
/// worth remain, else a step.
fn chunk_rows(left: usize) -> usize {
    if left > CHUNK {
        left.min(PREFILL_CHUNK)
    } else {
        left.min(CHUNK)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_runs_of_rows_take_the_prefill_path_in_chunks_and_the_rest_take_steps() {
        // A 1200-token prompt: two full prefill chunks, then the 176 rows left in one more.
        assert_eq!(chunk_rows(1200), PREFILL_CHUNK);
        assert_eq!(chunk_rows(1200 - 2 * PREFILL_CHUNK), 176);
        // Up to a step's worth of rows (decode steps, verify blocks) is a step.
        assert_eq!(chunk_rows(CHUNK), CHUNK);
        assert_eq!(chunk_rows(1), 1);
    }
}
