//! Property-based fuzzing of the golden-trace reader (`Golden::load`): random bytes, damaged
//! text and structured mutations of a valid golden (a field deleted, retyped, set to an extreme
//! value). Asserts no panic, a bounded time per case, and an error that names the file and,
//! for a deleted field, that field.
//!
//! The CI run is short (256 cases per property). The benchmark-sized run:
//! `FASTDECODE_FUZZ_CASES=100000 cargo test --release -p fastdecode-gate --test fuzz`

use fastdecode_fuzzing::{config, damage, mutate_at, mutation, text_damage, timed, Mutation, Seg};
use fastdecode_gate::golden::Golden;
use proptest::prelude::*;
use serde_json::{json, Value};

/// A valid golden: four steps over a vocabulary of 32.
fn example() -> Value {
    let tokens = [5u32, 9, 2, 17];
    json!({
        "format": "fastdecode-golden",
        "version": 1,
        "model_digest": "ab".repeat(32),
        "vocab_size": 32,
        "prompt": [1, 2, 3],
        "tokens": tokens,
        "steps": tokens.iter().map(|&t| json!({"top": [
            {"id": t, "logit": 2.5},
            {"id": (t + 1) % 32, "logit": 2.49},
        ]})).collect::<Vec<_>>(),
        "made_by": {
            "build": {"version": "0.1.0", "commit": "abc"},
            "backend": "cpu",
            "flags": [],
        },
        "screen": {
            "ngram": 3,
            "ngram_hit_rate": 0.0,
            "distinct_fraction": 1.0,
            "near_tie_rows": 4,
            "near_tie_gap": 0.05,
        },
    })
}

/// Loads `bytes` as a golden file; on error, returns the whole message chain.
fn load(bytes: &[u8]) -> (String, Result<Golden, String>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("golden-0.json");
    std::fs::write(&path, bytes).unwrap();
    let r = timed("Golden::load", || Golden::load(&path)).map_err(|e| format!("{e:#}"));
    (path.display().to_string(), r)
}

/// What every golden error holds: the file's path and a reason after it.
fn check_error(path: &str, msg: &str) -> Result<(), TestCaseError> {
    prop_assert!(msg.contains(path), "an error not naming the file: {msg:?}");
    let reason = msg
        .split(path)
        .last()
        .unwrap()
        .trim_start_matches(':')
        .trim();
    prop_assert!(reason.len() > 10, "an error without a reason: {msg:?}");
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn golden_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let (path, r) = load(&bytes);
        if let Err(msg) = r {
            check_error(&path, &msg)?;
        }
    }

    #[test]
    fn golden_damaged_text(d in text_damage(), d2 in proptest::option::of(text_damage())) {
        let text = serde_json::to_string_pretty(&example()).unwrap();
        let mut bytes = damage(text.as_bytes(), d);
        if let Some(d2) = d2 {
            bytes = damage(&bytes, d2);
        }
        let (path, r) = load(&bytes);
        if let Err(msg) = r {
            check_error(&path, &msg)?;
        }
    }

    #[test]
    fn golden_mutated_field(which in any::<prop::sample::Index>(), m in mutation(), extra in proptest::option::of("[a-z_]{1,10}")) {
        let mut v = example();
        let path = mutate_at(&mut v, which, &m);
        if let (Some(k), Value::Object(o)) = (&extra, &mut v) {
            // An unknown key next to the mutation (the format refuses unknown keys).
            if !o.contains_key(k) {
                o.insert(k.clone(), json!(1));
            }
        }
        let (file, r) = load(v.to_string().as_bytes());
        match r {
            Ok(g) => {
                // Whatever loads keeps the format's promises.
                prop_assert!(extra.is_none(), "an unknown key {:?} was accepted", extra);
                prop_assert_eq!(g.steps.len(), g.tokens.len());
                prop_assert!(!g.prompt.is_empty());
                for (s, &t) in g.steps.iter().zip(&g.tokens) {
                    prop_assert_eq!(s.top[0].id, t);
                    prop_assert!((t as usize) < g.vocab_size && s.top[0].logit >= s.top[1].logit);
                }
            }
            Err(msg) => {
                check_error(&file, &msg)?;
                if extra.is_none() && matches!(m, Mutation::Delete) {
                    if let Some(Seg::Key(k)) = path.last() {
                        // Every field is required: a deleted one is named.
                        prop_assert!(msg.contains(&format!("`{k}`")), "deleting {:?}: {:?}", k, msg);
                    }
                }
            }
        }
    }
}
