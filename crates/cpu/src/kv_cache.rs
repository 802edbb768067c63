//! KV caches.
//!
//! Target: full-attention layers keep every position; sliding layers keep a ring of
//! `window + max_block` slots indexed by `position % ring`. A verify of up to `max_block` rows never
//! overwrites an entry that a committed position can still see, so rejecting rows is just a
//! smaller logical length (`truncate`): no copy, no replay.
//!
//! Drafter: one ring of `window` context rows per layer; context is only ever appended for
//! committed positions, so it never rolls back.

/// Keys and values of one layer, `kv_dim = kv_heads · head_dim` floats per position.
///
/// Storage grows with the positions written, never ahead of them: a sliding layer's ring is
/// filled in position order until it holds `ring` positions, and only then wraps. So a window as
/// wide as the model's longest sequence costs memory only for the positions a run really uses.
pub struct LayerKv {
    k: Vec<f32>,
    v: Vec<f32>,
    kv_dim: usize,
    /// Ring length for sliding layers; `None` for full layers, which keep every position.
    ring: Option<usize>,
}

impl LayerKv {
    pub fn new(kv_dim: usize, ring: Option<usize>) -> Self {
        LayerKv {
            k: vec![],
            v: vec![],
            kv_dim,
            ring,
        }
    }

    /// Positions stored so far (at most the ring for sliding layers).
    fn stored(&self) -> usize {
        self.k.len() / self.kv_dim.max(1)
    }

    fn slot(&self, pos: usize) -> usize {
        match self.ring {
            Some(r) => pos % r,
            None => pos,
        }
    }

    /// Stores position `pos`. Positions arrive in order: each is either the next one not yet
    /// stored, or one already stored (rewritten after a rollback, or wrapped in a full ring).
    pub fn write(&mut self, pos: usize, k: &[f32], v: &[f32]) {
        let d = self.kv_dim;
        let full = self.ring.is_some_and(|r| self.stored() >= r);
        if !full && pos == self.stored() {
            self.k.extend_from_slice(k);
            self.v.extend_from_slice(v);
            return;
        }
        let s = self.slot(pos) * d;
        self.k[s..s + d].copy_from_slice(k);
        self.v[s..s + d].copy_from_slice(v);
    }

    pub fn key(&self, pos: usize) -> &[f32] {
        let s = self.slot(pos) * self.kv_dim;
        &self.k[s..s + self.kv_dim]
    }

    pub fn value(&self, pos: usize) -> &[f32] {
        let s = self.slot(pos) * self.kv_dim;
        &self.v[s..s + self.kv_dim]
    }

    fn truncate(&mut self, len: usize) {
        if self.ring.is_none() {
            self.k.truncate(len * self.kv_dim);
            self.v.truncate(len * self.kv_dim);
        }
    }
}

/// The target's cache: one `LayerKv` per decoder layer plus the logical length.
pub struct KvCache {
    pub layers: Vec<LayerKv>,
    len: usize,
}

impl KvCache {
    pub fn new(layers: Vec<LayerKv>) -> Self {
        KvCache { layers, len: 0 }
    }

    /// Number of positions the cache holds (committed plus any not yet trimmed verify rows).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// Rollback: forget positions `len..`. Only shrinks.
    pub fn truncate(&mut self, len: usize) {
        assert!(len <= self.len, "truncate can only shrink the cache");
        self.len = len;
        for l in &mut self.layers {
            l.truncate(len);
        }
    }
}
