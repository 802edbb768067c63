//! `oracle:P`: a draft source that knows the true greedy continuation and proposes each token
//! correctly with probability P, else a certainly-wrong token. It drives every accept/reject path
//! on any model, random weights included, at a chosen acceptance rate.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::backend::DraftSource;
use fastdecode_model::{Error, Result};

pub struct Oracle {
    /// The reference greedy tokens; `truth[i]` sits at position `start + i`.
    truth: Vec<u32>,
    start: usize,
    p: f64,
    vocab: u32,
    seed: u64,
    rng: ChaCha8Rng,
}

impl Oracle {
    /// `truth` are the greedy tokens generated after a prompt of `prompt_len` tokens (the first of
    /// them sits at position `prompt_len`).
    pub fn new(
        truth: Vec<u32>,
        prompt_len: usize,
        p: f64,
        vocab: usize,
        seed: u64,
    ) -> Result<Self> {
        if !(0.0..=1.0).contains(&p) {
            return Err(Error::Input(format!(
                "oracle probability {p} is not in [0, 1]"
            )));
        }
        if vocab < 2 {
            return Err(Error::Input(
                "oracle needs a vocabulary of at least 2".into(),
            ));
        }
        Ok(Oracle {
            truth,
            start: prompt_len,
            p,
            vocab: vocab as u32,
            seed,
            rng: ChaCha8Rng::seed_from_u64(seed),
        })
    }
}

impl DraftSource for Oracle {
    fn tap_layers(&self) -> &[usize] {
        &[]
    }
    fn propose(&mut self, _bonus: u32, position: usize, k: usize) -> Result<Vec<u32>> {
        Ok((1..k)
            .map(|j| {
                let q = position + j;
                let hit = self.rng.random_bool(self.p);
                match q.checked_sub(self.start).and_then(|i| self.truth.get(i)) {
                    Some(&t) if hit => t,
                    // A wrong token: shifted by 1..vocab-1 from the truth.
                    Some(&t) => (t + self.rng.random_range(1..self.vocab)) % self.vocab,
                    None => self.rng.random_range(0..self.vocab),
                }
            })
            .collect())
    }
    fn commit(&mut self, _taps: &[f32], _rows: usize) -> Result<()> {
        Ok(())
    }
    fn reset(&mut self) {
        self.rng = ChaCha8Rng::seed_from_u64(self.seed);
    }
}
