//! `oracle:P`: a draft source that knows the true greedy continuation and proposes each token
//! correctly with probability P, else a certainly-wrong token. It drives every accept/reject path
//! on any model, random weights included, at a chosen acceptance rate.
//!
//! The oracle's choices are fixed per position before decoding starts (`realise`): the draft at
//! each position of the window is the true token or a wrong one, drawn once from the seed. So a
//! trusted parent can realise the drafts itself and send only them to a worker it does not trust
//! (the worker protocol's `drafts`): the worker never sees the truth, only drafts of which a
//! share P are right, and it cannot tell which without verifying them.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::backend::DraftSource;
use fastdecode_model::{Error, Result};

/// The oracle's draft for every position of `truth` (the greedy tokens after a prompt, the first
/// at the prompt's end): the true token with probability `p`, else one shifted by 1..vocab-1
/// from it, so a wrong draft is never right by chance.
pub fn realise(truth: &[u32], p: f64, vocab: usize, seed: u64) -> Result<Vec<u32>> {
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
    let vocab = vocab as u32;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    Ok(truth
        .iter()
        .map(|&t| {
            let hit = rng.random_bool(p);
            let shift = rng.random_range(1..vocab);
            if hit {
                t
            } else {
                (t % vocab + shift) % vocab
            }
        })
        .collect())
}

pub struct Oracle {
    /// The draft for each position from `start` on (`realise`).
    drafts: Vec<u32>,
    start: usize,
}

impl Oracle {
    /// `truth` are the greedy tokens generated after a prompt of `prompt_len` tokens (the first of
    /// them sits at position `prompt_len`); the drafts are realised from them with `p` and `seed`.
    pub fn new(truth: &[u32], prompt_len: usize, p: f64, vocab: usize, seed: u64) -> Result<Self> {
        Ok(Oracle::from_drafts(
            realise(truth, p, vocab, seed)?,
            prompt_len,
        ))
    }

    /// Drafts realised elsewhere (by the parent of a worker): `drafts[i]` for position
    /// `prompt_len + i`.
    pub fn from_drafts(drafts: Vec<u32>, prompt_len: usize) -> Self {
        Oracle {
            drafts,
            start: prompt_len,
        }
    }
}

impl DraftSource for Oracle {
    fn tap_layers(&self) -> &[usize] {
        &[]
    }
    fn propose(&mut self, _bonus: u32, position: usize, k: usize) -> Result<Vec<u32>> {
        (1..k)
            .map(|j| {
                let q = position + j;
                q.checked_sub(self.start)
                    .and_then(|i| self.drafts.get(i))
                    .copied()
                    .ok_or_else(|| {
                        Error::Input(format!(
                            "oracle: no draft for position {q} (drafts cover {}..{})",
                            self.start,
                            self.start + self.drafts.len()
                        ))
                    })
            })
            .collect()
    }
    fn commit(&mut self, _taps: &[f32], _rows: usize) -> Result<()> {
        Ok(())
    }
    fn reset(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_drafts_are_right_at_about_p_and_wrong_drafts_are_never_right() {
        let truth: Vec<u32> = (0..4000).map(|i| (i * 7 % 512) as u32).collect();
        let d = realise(&truth, 0.85, 512, 3).unwrap();
        let hits = d.iter().zip(&truth).filter(|(a, b)| a == b).count();
        // 4000 draws at 0.85: 3400 ± 23 (one standard deviation); 10 standard deviations.
        assert!((3170..3630).contains(&hits), "{hits}");
        assert!(d.iter().all(|&t| t < 512));
        assert_eq!(realise(&truth, 0.85, 512, 3).unwrap(), d, "same seed");
        assert_ne!(realise(&truth, 0.85, 512, 4).unwrap(), d, "another seed");
        assert_eq!(realise(&truth, 1.0, 512, 3).unwrap(), truth);
        let none = realise(&truth, 0.0, 512, 3).unwrap();
        assert!(none.iter().zip(&truth).all(|(a, b)| a != b));
    }

    #[test]
    fn a_position_past_the_drafts_is_an_error_naming_it() {
        let mut o = Oracle::from_drafts(vec![5, 6, 7], 10);
        assert_eq!(o.propose(0, 10, 3).unwrap(), vec![6, 7]);
        let e = o.propose(0, 11, 3).unwrap_err().to_string();
        assert!(e.contains("position 13") && e.contains("10..13"), "{e}");
        assert!(realise(&[1], 1.5, 512, 0).is_err());
        assert!(realise(&[1], 0.5, 1, 0).is_err());
    }
}
