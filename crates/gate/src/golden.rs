//! Golden traces: a prompt, the reference's greedy continuation and, per step, the reference's two
//! best tokens with their logits, stamped with the model digest and the build that made it.
//!
//! The format is strict and versioned (`FORMAT`, `VERSION`): unknown keys, missing keys, wrong
//! lengths or impossible values are errors naming the file and the field, never guesses.

use std::collections::HashSet;
use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use fastdecode_worker::{Build, ModelId, Scored};

pub const FORMAT: &str = "fastdecode-golden";
pub const VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Golden {
    pub format: String,
    pub version: u32,
    /// MANIFEST digest of the model directory the trace was made with.
    pub model_digest: String,
    pub vocab_size: usize,
    pub prompt: Vec<u32>,
    /// The reference's greedy continuation (`tokens[i]` = `steps[i].top[0].id`).
    pub tokens: Vec<u32>,
    pub steps: Vec<GoldenStep>,
    pub made_by: MadeBy,
    pub screen: ScreenStats,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GoldenStep {
    /// The reference's two best tokens after `prompt ++ tokens[..i]`, best first.
    pub top: [Scored; 2],
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MadeBy {
    pub build: Build,
    pub backend: String,
    pub flags: Vec<String>,
}

/// What the degeneracy screen measured on this continuation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScreenStats {
    pub ngram: usize,
    /// Fraction of the continuation's n-grams that already occurred earlier in it.
    pub ngram_hit_rate: f64,
    /// Distinct tokens / tokens.
    pub distinct_fraction: f64,
    /// Steps whose top-1 and top-2 logits are within `near_tie_gap`.
    pub near_tie_rows: usize,
    pub near_tie_gap: f32,
}

/// Thresholds of the degeneracy screen: a golden must not be trivially predictable (a drafter or a
/// cache of n-grams would accept it all) and must hold at least one row where a build that rounds
/// differently could flip the argmax.
#[derive(Debug, Clone, Copy)]
pub struct ScreenParams {
    pub ngram: usize,
    pub max_ngram_hit_rate: f64,
    pub min_distinct_fraction: f64,
    pub near_tie_gap: f32,
    pub min_near_tie_rows: usize,
}

impl Default for ScreenParams {
    fn default() -> Self {
        ScreenParams {
            ngram: 3,
            max_ngram_hit_rate: 0.25,
            min_distinct_fraction: 0.4,
            near_tie_gap: 0.05,
            min_near_tie_rows: 1,
        }
    }
}

/// Measures a continuation and its per-step top-2s against `p`; `Err` says why it is degenerate.
pub fn screen(
    tokens: &[u32],
    steps: &[GoldenStep],
    p: &ScreenParams,
) -> (ScreenStats, Result<(), String>) {
    let n = p.ngram.max(1);
    let mut seen = HashSet::new();
    let (mut grams, mut hits) = (0usize, 0usize);
    for w in tokens.windows(n) {
        grams += 1;
        if !seen.insert(w) {
            hits += 1;
        }
    }
    let distinct = tokens.iter().collect::<HashSet<_>>().len();
    let stats = ScreenStats {
        ngram: n,
        ngram_hit_rate: if grams == 0 {
            0.0
        } else {
            hits as f64 / grams as f64
        },
        distinct_fraction: if tokens.is_empty() {
            0.0
        } else {
            distinct as f64 / tokens.len() as f64
        },
        near_tie_rows: steps
            .iter()
            .filter(|s| s.top[0].logit - s.top[1].logit <= p.near_tie_gap)
            .count(),
        near_tie_gap: p.near_tie_gap,
    };
    let verdict = if stats.ngram_hit_rate > p.max_ngram_hit_rate {
        Err(format!(
            "self-similar: {:.0} % of its {n}-grams repeat (at most {:.0} %)",
            100.0 * stats.ngram_hit_rate,
            100.0 * p.max_ngram_hit_rate
        ))
    } else if stats.distinct_fraction < p.min_distinct_fraction {
        Err(format!(
            "self-similar: {:.0} % distinct tokens (at least {:.0} %)",
            100.0 * stats.distinct_fraction,
            100.0 * p.min_distinct_fraction
        ))
    } else if stats.near_tie_rows < p.min_near_tie_rows {
        Err(format!(
            "{} near-tie rows (top-1 - top-2 <= {}), at least {} needed",
            stats.near_tie_rows, p.near_tie_gap, p.min_near_tie_rows
        ))
    } else {
        Ok(())
    };
    (stats, verdict)
}

impl Golden {
    /// Reads and validates a golden; every error names the file.
    pub fn load(path: &Path) -> Result<Golden> {
        let text = fastdecode_model::files::read_text(path).context("cannot read golden trace")?;
        let g: Golden = serde_json::from_str(&text)
            .with_context(|| format!("{}: not a valid golden trace", path.display()))?;
        g.validate()
            .with_context(|| format!("{}: invalid golden trace", path.display()))?;
        Ok(g)
    }

    /// Writes the golden atomically (a temporary name, then a rename).
    pub fn save(&self, path: &Path) -> Result<()> {
        self.validate()?;
        let mut text = serde_json::to_string_pretty(self)?;
        text.push('\n');
        fastdecode_model::checkpoint::write_atomic(path, text.as_bytes())?;
        Ok(())
    }

    /// Checks everything the format promises beyond its shape.
    pub fn validate(&self) -> Result<()> {
        if self.format != FORMAT {
            bail!("field `format` is {:?}, expected {FORMAT:?}", self.format);
        }
        if self.version != VERSION {
            bail!(
                "field `version` is {}, this build reads version {VERSION}",
                self.version
            );
        }
        if self.model_digest.len() != 64
            || !self.model_digest.bytes().all(|b| b.is_ascii_hexdigit())
        {
            bail!("field `model_digest` is not a sha256 hex digest");
        }
        if self.prompt.is_empty() {
            bail!("field `prompt` is empty");
        }
        if self.tokens.is_empty() {
            bail!("field `tokens` is empty");
        }
        if self.steps.len() != self.tokens.len() {
            bail!(
                "field `steps` has {} entries for {} tokens",
                self.steps.len(),
                self.tokens.len()
            );
        }
        let v = self.vocab_size;
        if let Some(t) = self
            .prompt
            .iter()
            .chain(&self.tokens)
            .find(|&&t| t as usize >= v)
        {
            bail!("token id {t} is outside the vocabulary (0..{v}, field `vocab_size`)");
        }
        for (i, (s, &t)) in self.steps.iter().zip(&self.tokens).enumerate() {
            let [a, b] = s.top;
            if a.id as usize >= v || b.id as usize >= v || a.id == b.id {
                bail!("field `steps[{i}].top`: ids must be distinct and inside the vocabulary");
            }
            if !a.logit.is_finite() || !b.logit.is_finite() || a.logit < b.logit {
                bail!("field `steps[{i}].top`: logits must be finite, best first");
            }
            if a.id != t {
                bail!("field `steps[{i}].top[0].id` differs from `tokens[{i}]`: a greedy trace's best token is its token");
            }
        }
        Ok(())
    }

    /// Whether `model` can replay this golden (read from `path`): the vocabulary it was made with
    /// and a sequence no longer than the model's positions. A golden that does not fit is the
    /// caller's input at fault, never a build's.
    pub fn fits(&self, path: &Path, model: &ModelId) -> Result<()> {
        if self.vocab_size != model.vocab {
            bail!(
                "{}: field `vocab_size` is {} but the model's vocabulary has {} tokens",
                path.display(),
                self.vocab_size,
                model.vocab
            );
        }
        if self.prompt.len().saturating_add(self.tokens.len()) > model.max_positions {
            bail!(
                "{}: a prompt of {} and {} tokens, more than the model's max_position_embeddings {}",
                path.display(),
                self.prompt.len(),
                self.tokens.len(),
                model.max_positions
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Golden {
        let tokens = vec![5u32, 9, 2];
        Golden {
            format: FORMAT.into(),
            version: VERSION,
            model_digest: "ab".repeat(32),
            vocab_size: 16,
            prompt: vec![1, 2, 3],
            steps: tokens
                .iter()
                .map(|&t| GoldenStep {
                    top: [
                        Scored { id: t, logit: 2.5 },
                        Scored {
                            id: (t + 1) % 16,
                            logit: 2.49,
                        },
                    ],
                })
                .collect(),
            tokens,
            made_by: MadeBy {
                build: Build {
                    version: "0.1.0".into(),
                    commit: "abc".into(),
                },
                backend: "cpu".into(),
                flags: vec![],
            },
            screen: ScreenStats {
                ngram: 3,
                ngram_hit_rate: 0.0,
                distinct_fraction: 1.0,
                near_tie_rows: 3,
                near_tie_gap: 0.05,
            },
        }
    }

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn round_trips_and_rejects_unknown_keys_and_malformed_files() {
        let d = tempfile::tempdir().unwrap();
        let g = sample();
        let p = d.path().join("g.json");
        g.save(&p).unwrap();
        assert_eq!(Golden::load(&p).unwrap(), g);

        let text = std::fs::read_to_string(&p).unwrap();
        let extra = text.replacen("\"version\": 1,", "\"version\": 1,\n  \"hint\": 3,", 1);
        let e = format!(
            "{:#}",
            Golden::load(&write(d.path(), "x.json", &extra)).unwrap_err()
        );
        assert!(
            e.contains("x.json") && e.contains("unknown field `hint`"),
            "{e}"
        );
        let nested = text.replacen(
            "\"backend\": \"cpu\",",
            "\"backend\": \"cpu\", \"gpu\": 1,",
            1,
        );
        let e = format!(
            "{:#}",
            Golden::load(&write(d.path(), "n.json", &nested)).unwrap_err()
        );
        assert!(e.contains("unknown field `gpu`"), "{e}");

        let e = format!(
            "{:#}",
            Golden::load(&write(d.path(), "t.json", &text[..text.len() / 2])).unwrap_err()
        );
        assert!(
            e.contains("t.json") && e.contains("not a valid golden trace"),
            "{e}"
        );
        let missing = text.replacen("\"vocab_size\": 16,", "", 1);
        let e = format!(
            "{:#}",
            Golden::load(&write(d.path(), "m.json", &missing)).unwrap_err()
        );
        assert!(e.contains("missing field `vocab_size`"), "{e}");

        let v2 = text.replacen("\"version\": 1,", "\"version\": 2,", 1);
        let e = format!(
            "{:#}",
            Golden::load(&write(d.path(), "v.json", &v2)).unwrap_err()
        );
        assert!(e.contains("v.json") && e.contains("version 1"), "{e}");
        let e = format!(
            "{:#}",
            Golden::load(&d.path().join("absent.json")).unwrap_err()
        );
        assert!(e.contains("absent.json"), "{e}");
    }

    #[test]
    fn validation_names_the_field() {
        let mut g = sample();
        g.tokens[1] = 7;
        assert!(format!("{:#}", g.validate().unwrap_err()).contains("steps[1].top[0].id"));
        let mut g = sample();
        g.steps.pop();
        assert!(format!("{:#}", g.validate().unwrap_err()).contains("`steps` has 2 entries"));
        let mut g = sample();
        g.prompt[0] = 99;
        assert!(format!("{:#}", g.validate().unwrap_err()).contains("99"));
        let mut g = sample();
        g.steps[2].top[1].logit = 9.0;
        assert!(format!("{:#}", g.validate().unwrap_err()).contains("best first"));
    }

    #[test]
    fn screen_rejects_self_similar_continuations() {
        let p = ScreenParams::default();
        let tie = |n: usize| -> Vec<GoldenStep> {
            (0..n)
                .map(|i| GoldenStep {
                    top: [
                        Scored { id: 1, logit: 1.0 },
                        Scored {
                            id: 2,
                            logit: if i == 0 { 0.99 } else { 0.0 },
                        },
                    ],
                })
                .collect()
        };
        let varied: Vec<u32> = (0..40).map(|i| (i * 37 % 101) as u32).collect();
        let (s, v) = screen(&varied, &tie(40), &p);
        assert!(v.is_ok(), "{v:?}");
        assert_eq!(s.near_tie_rows, 1);
        let looping: Vec<u32> = (0..40).map(|i| [4, 5, 6, 7][i % 4]).collect();
        let (s, v) = screen(&looping, &tie(40), &p);
        assert!(v.unwrap_err().contains("3-grams repeat"), "{s:?}");
        // Few distinct tokens but no repeated trigram.
        let few: Vec<u32> = vec![1, 1, 2, 2, 1, 2, 1, 1, 1, 2];
        let (_, v) = screen(
            &few,
            &tie(10),
            &ScreenParams {
                max_ngram_hit_rate: 1.0,
                ..p
            },
        );
        assert!(v.unwrap_err().contains("distinct"));
        let no_ties: Vec<GoldenStep> = tie(40)
            .into_iter()
            .skip(1)
            .chain(tie(2).into_iter().skip(1))
            .collect();
        let (_, v) = screen(&varied, &no_ties, &p);
        assert!(v.unwrap_err().contains("near-tie rows"));
    }
}
