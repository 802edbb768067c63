//! The messages of the worker protocol (`PROTOCOL.md`): one JSON object per line, requests on the
//! worker's stdin, replies on its stdout. Both sides parse strictly (unknown fields are errors), so
//! a build speaking another dialect fails loudly instead of being half understood.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The protocol's name, in the `ready` line.
pub const PROTOCOL: &str = "fastdecode-worker";
/// Bumped on any change a parent of the previous version could misread.
pub const VERSION: u32 = 2;

/// Set to `0` by a parent whose windows will not draft with the drafter (serial windows, oracle
/// drafts, replays): a CUDA worker then loads no GPU drafter, sparing its memory and warm-up.
pub const DRAFTER_VAR: &str = "FASTDECODE_WORKER_DRAFTER";

/// Where a worker's model comes from: a checkpoint directory (verified against its MANIFEST), or
/// a preset's synthetic weights generated in place (a GPU worker's XS 2.1 without 60 GB on disk).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    Dir(PathBuf),
    Synthetic { preset: String, seed: u64 },
}

impl ModelSource {
    /// The worker's arguments naming this model.
    pub fn worker_args(&self) -> Vec<std::ffi::OsString> {
        match self {
            ModelSource::Dir(d) => vec!["--model".into(), d.into()],
            ModelSource::Synthetic { preset, seed } => vec![
                "--synthetic".into(),
                preset.into(),
                "--seed".into(),
                seed.to_string().into(),
            ],
        }
    }
}

impl std::fmt::Display for ModelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelSource::Dir(d) => write!(f, "{}", d.display()),
            ModelSource::Synthetic { preset, seed } => write!(f, "synthetic {preset} seed {seed}"),
        }
    }
}

/// The build a worker (or a golden) came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Build {
    /// The crate version, e.g. `0.1.0`.
    pub version: String,
    /// `git rev-parse --short=12 HEAD` at build time, `-dirty` when the tree had changes.
    pub commit: String,
}

/// The first line a worker writes, once its model is loaded, verified and warm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ready {
    pub protocol: String,
    pub version: u32,
    pub build: Build,
    pub backend: String,
    /// Optimisation flags switched on in this worker.
    pub flags: Vec<String>,
    /// Every optimisation flag this build knows (what `bisect` may switch).
    pub known_flags: Vec<String>,
    /// The MANIFEST digest of the model directory the worker verified and loaded.
    pub model_digest: String,
    pub vocab_size: usize,
    /// Largest DFlash block size the worker's draft sources accept.
    pub max_block: usize,
}

/// A timed window: prefill `prompt` (the seed), then decode `decode_tokens` more tokens greedily.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WindowRequest {
    pub id: u64,
    pub prompt: Vec<u32>,
    /// Tokens after the first one (which the prefill chooses). End-of-sequence tokens do not stop.
    pub decode_tokens: usize,
    /// 1 = serial decoding; K > 1 = DFlash rounds of K rows.
    pub block_size: usize,
    /// Draft source when `block_size > 1`: `drafter` or `oracle:P`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<String>,
    /// `oracle:P` only: the draft for every position after the prompt (`drafts[i]` for position
    /// `prompt.len() + i`), realised by the parent (`fastdecode_engine::oracle::realise`). The
    /// worker never gets the true continuation, only these, of which a share P are right.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drafts: Option<Vec<u32>>,
}

impl WindowRequest {
    /// A serial window of `prompt` and `decode_tokens` more tokens.
    pub fn serial(prompt: &[u32], decode_tokens: usize) -> WindowRequest {
        WindowRequest {
            id: 0,
            prompt: prompt.to_vec(),
            decode_tokens,
            block_size: 1,
            draft: None,
            drafts: None,
        }
    }

    /// A DFlash window of `block_size` rows drafted by `draft`. For `oracle:P` the parent
    /// realises the drafts here from `truth` (the serial continuation it holds, which never
    /// leaves it) with `seed`; `drafter` needs neither.
    pub fn dflash(
        prompt: &[u32],
        decode_tokens: usize,
        (block_size, draft): (usize, &str),
        truth: &[u32],
        seed: u64,
        vocab: usize,
    ) -> anyhow::Result<WindowRequest> {
        use fastdecode_engine::DraftSpec;
        let drafts = match draft.parse::<DraftSpec>().map_err(anyhow::Error::msg)? {
            DraftSpec::Oracle(p) => {
                Some(fastdecode_engine::oracle::realise(truth, p, vocab, seed)?)
            }
            DraftSpec::Drafter => None,
        };
        Ok(WindowRequest {
            block_size,
            draft: Some(draft.to_string()),
            drafts,
            ..WindowRequest::serial(prompt, decode_tokens)
        })
    }
}

/// Teacher-forced replay: the model's choice at every step of `chain` after `prompt`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    pub id: u64,
    pub prompt: Vec<u32>,
    pub chain: Vec<u32>,
    /// Also report, at step i, the logit of `chain[i]` itself.
    #[serde(default)]
    pub probe: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    Window(WindowRequest),
    Replay(ReplayRequest),
    /// Exit cleanly (end of input does the same).
    Shutdown,
}

/// A token and its logit.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scored {
    pub id: u32,
    pub logit: f32,
}

/// One step of a replay: the model's two best tokens (best first, ties to the lower id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub top: [Scored; 2],
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_logit: Option<f32>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    Ready(Ready),
    /// Mid-window: the prefill has chosen the first token (the parent's clock splits here).
    Seeded {
        id: u64,
        token: u32,
        kv_len: usize,
    },
    /// End of a window: every emitted token (the seeded one first) and the KV cache length.
    Window {
        id: u64,
        tokens: Vec<u32>,
        kv_len: usize,
    },
    Replay {
        id: u64,
        steps: Vec<Step>,
    },
    /// The request could not be served; the worker keeps reading.
    Error {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<u64>,
        message: String,
    },
}

impl Request {
    /// A request line (see `parse_named`).
    pub fn parse(line: &str) -> Result<Request, String> {
        parse_named(line, "op")
    }
}

impl Reply {
    /// A reply line (see `parse_named`).
    pub fn parse(line: &str) -> Result<Reply, String> {
        parse_named(line, "type")
    }
}

/// One line as `T`, a message tagged by the field `tag`, with an error that names the field at
/// fault. serde buffers a tagged message before it picks the variant, so for a value of the
/// wrong type or range its error names neither the field nor a position (`invalid value:
/// integer `-1`, expected usize`), and path-tracking deserialisers cannot see past that buffer.
/// The field is then found by taking the object's other fields out one at a time: only taking
/// out the one at fault changes the error (to its own `missing field`, a later field's fault, or
/// none). Errors that already name a field or a variant, and syntax errors (located by line and
/// column), are left as they are, and so is an object with more fields than any message has:
/// the search parses the line once per field, and a hostile line may hold thousands.
fn parse_named<T: serde::de::DeserializeOwned>(line: &str, tag: &str) -> Result<T, String> {
    const MOST_FIELDS: usize = 16;
    let e = match serde_json::from_str::<T>(line) {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    let msg = e.to_string();
    let named = ["field `", "variant `", " at line "]
        .iter()
        .any(|k| msg.contains(k));
    if named {
        return Err(msg);
    }
    let Ok(serde_json::Value::Object(m)) = serde_json::from_str::<serde_json::Value>(line) else {
        return Err(msg);
    };
    if m.len() > MOST_FIELDS {
        return Err(msg);
    }
    let error_of = |o: serde_json::Map<String, serde_json::Value>| {
        serde_json::from_value::<T>(serde_json::Value::Object(o))
            .err()
            .map(|e| e.to_string())
    };
    let whole = error_of(m.clone());
    let without = |k: &str| {
        let mut o = m.clone();
        o.remove(k);
        error_of(o)
    };
    match m
        .keys()
        .filter(|k| k.as_str() != tag)
        .find(|k| without(k) != whole)
    {
        Some(k) => Err(format!("field `{k}`: {msg}")),
        None => Err(msg),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_of_the_wrong_type_or_range_is_named_by_its_field() {
        let line = r#"{"op":"window","id":3,"prompt":[1,2],"decode_tokens":4,"block_size":-1}"#;
        let e = Request::parse(line).unwrap_err();
        assert!(
            e.starts_with("field `block_size`: invalid value: integer `-1`"),
            "{e}"
        );
        let e = Request::parse(r#"{"op":"replay","id":"x","prompt":[],"chain":[]}"#).unwrap_err();
        assert!(e.starts_with("field `id`: invalid type: string"), "{e}");
        // Deep inside a reply: the top-level field that holds it.
        let line = r#"{"type":"replay","id":2,"steps":[{"top":[{"id":5,"logit":"a"},{"id":2,"logit":0.5}]}]}"#;
        let e = Reply::parse(line).unwrap_err();
        assert!(e.starts_with("field `steps`: invalid type"), "{e}");
        // Already named or located: as serde says it.
        let e = Request::parse(r#"{"op":"window","id":3}"#).unwrap_err();
        assert!(e.starts_with("missing field `prompt`"), "{e}");
        let e = Request::parse(r#"{"op":"warp"}"#).unwrap_err();
        assert!(e.starts_with("unknown variant `warp`"), "{e}");
        let e = Reply::parse(r#"{"type":"seeded","id":1,"#).unwrap_err();
        assert!(e.contains(" at line 1 column"), "{e}");
        // More fields than any message has: not searched (bounded work), serde's message as is.
        let mut wide = r#"{"op":"window","block_size":-1"#.to_string();
        for i in 0..5000 {
            wide += &format!(r#","x{i}":{i}"#);
        }
        wide += "}";
        let t = std::time::Instant::now();
        let e = Request::parse(&wide).unwrap_err();
        assert!(e.starts_with("invalid value: integer `-1`"), "{e}");
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(
            Reply::parse(r#"{"type":"seeded","id":1,"token":5,"kv_len":12}"#).unwrap(),
            Reply::Seeded {
                id: 1,
                token: 5,
                kv_len: 12
            }
        );
    }

    #[test]
    fn requests_round_trip_and_unknown_fields_fail() {
        let r = Request::Window(WindowRequest {
            id: 3,
            prompt: vec![1, 2],
            decode_tokens: 4,
            block_size: 1,
            draft: None,
            drafts: None,
        });
        let line = serde_json::to_string(&r).unwrap();
        assert!(line.starts_with(r#"{"op":"window","id":3"#), "{line}");
        assert_eq!(serde_json::from_str::<Request>(&line).unwrap(), r);
        let bad = line.replace(r#""id":3"#, r#""id":3,"turbo":true"#);
        let e = serde_json::from_str::<Request>(&bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("turbo"), "{e}");
        let s: Request = serde_json::from_str(r#"{"op":"shutdown"}"#).unwrap();
        assert_eq!(s, Request::Shutdown);
    }

    #[test]
    fn logits_round_trip_exactly() {
        let x = 0.1f32 + 1e-7;
        let r = Reply::Replay {
            id: 1,
            steps: vec![Step {
                top: [Scored { id: 5, logit: x }, Scored { id: 2, logit: -x }],
                probe_logit: Some(x / 3.0),
            }],
        };
        let back: Reply = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }
}
