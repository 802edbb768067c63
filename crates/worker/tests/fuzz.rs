//! Property-based fuzzing of the worker protocol's parsers: request lines (what a worker reads
//! from its parent), reply lines (what the parent reads from a worker it does not trust) and the
//! bounded line reader both sides use. Random bytes, damaged lines and structured mutations of
//! valid messages; asserts no panic, a bounded time per case, errors that say what is wrong
//! (a deleted field by name, any other fault by its position), and that the line reader never
//! holds more than its limit and splits exactly at newlines.
//!
//! The CI run is short (256 cases per property). The benchmark-sized run:
//! `FASTDECODE_FUZZ_CASES=100000 cargo test --release -p fastdecode-worker --test fuzz`

use std::io::BufReader;
use std::time::Instant;

use fastdecode_fuzzing::{
    config, damage, mutate_at, mutation, text_damage, timed, Mutation, Seg, BOUND,
};
use fastdecode_worker::lines::{read_line, skip_line, Bounded};
use fastdecode_worker::{Reply, Request};
use proptest::prelude::*;
use serde_json::{json, Value};

fn requests() -> Vec<Value> {
    vec![
        json!({"op": "window", "id": 3, "prompt": [1, 2, 3], "decode_tokens": 16, "block_size": 4,
               "draft": "oracle:0.5", "drafts": [4, 5, 6]}),
        json!({"op": "replay", "id": 4, "prompt": [1, 2], "chain": [3, 4, 5], "probe": true}),
        json!({"op": "shutdown"}),
    ]
}

fn replies() -> Vec<Value> {
    vec![
        json!({"type": "ready", "protocol": "fastdecode-worker", "version": 2,
               "build": {"version": "0.1.0", "commit": "abc123"}, "backend": "cpu",
               "flags": ["fused"], "known_flags": ["fused", "graph"],
               "model_digest": "ab".repeat(32), "vocab_size": 8192, "max_block": 16}),
        json!({"type": "seeded", "id": 1, "token": 5, "kv_len": 12}),
        json!({"type": "window", "id": 1, "tokens": [5, 6, 7], "kv_len": 14}),
        json!({"type": "replay", "id": 2, "steps": [
            {"top": [{"id": 5, "logit": 1.5}, {"id": 2, "logit": -0.25}], "probe_logit": 0.125},
            {"top": [{"id": 1, "logit": 3.0}, {"id": 0, "logit": 3.0}]}]}),
        json!({"type": "error", "id": 9, "message": "bad request"}),
        json!({"type": "error", "message": "bad request"}),
    ]
}

/// What every protocol parse error is: one of serde's specific descriptions (a named missing or
/// unknown field or variant, a wrong type, value or length) or a syntax error at a position.
fn specific(msg: &str) -> bool {
    [
        "missing field `",
        "unknown field `",
        "unknown variant `",
        "invalid type: ",
        "invalid value: ",
        "invalid length ",
        " at line ",
    ]
    .iter()
    .any(|k| msg.contains(k))
}

/// A message of the protocol, parsed the way its reader does (`Request::parse` in the worker,
/// `Reply::parse` in the parent), with the field that tags it.
trait Message: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug {
    const TAG: &'static str;
    fn parse(line: &str) -> Result<Self, String>;
}

impl Message for Request {
    const TAG: &'static str = "op";
    fn parse(line: &str) -> Result<Self, String> {
        Request::parse(line)
    }
}

impl Message for Reply {
    const TAG: &'static str = "type";
    fn parse(line: &str) -> Result<Self, String> {
        Reply::parse(line)
    }
}

/// Parses one line as `T` the way both ends do; checks the error, and that whatever parses
/// survives a round trip unchanged.
fn parse_line<T: Message>(line: &str) -> Result<Result<T, String>, TestCaseError> {
    let r = timed("a protocol line", || T::parse(line));
    match &r {
        Ok(v) => {
            // A logit beyond f32's range (`1e300`) parses as an infinity, which serialises as
            // `null`: the one way a parsed message does not round-trip. (The parent refuses
            // non-finite logits after parsing, in `Worker::replay`.)
            if !format!("{v:?}").contains("inf") {
                let again: T = serde_json::from_str(&serde_json::to_string(v).unwrap()).unwrap();
                prop_assert_eq!(&again, v);
            }
        }
        Err(msg) => prop_assert!(specific(msg), "a generic error: {:?}", msg),
    }
    Ok(r)
}

/// A structured mutation of example `i` of `examples`; a deleted required field is named.
fn mutated<T>(
    examples: Vec<Value>,
    i: prop::sample::Index,
    which: prop::sample::Index,
    m: &Mutation,
    optional: &[&str],
) -> Result<(), TestCaseError>
where
    T: Message,
{
    let mut v = i.get(&examples).clone();
    let path = mutate_at(&mut v, which, m);
    let line = v.to_string();
    let r = parse_line::<T>(&line)?;
    if let (Err(msg), Mutation::Delete, Some(Seg::Key(k))) = (&r, m, path.last()) {
        if !optional.contains(&k.as_str()) {
            prop_assert!(
                msg.contains(&format!("`{k}`")),
                "deleting {:?} gave an error not naming it: {:?}",
                k,
                msg
            );
        }
    }
    // A value of the wrong type, range or length is named by the message's field that holds it.
    if let (Err(msg), Mutation::Set(_), Some(Seg::Key(top))) = (&r, m, path.first()) {
        let retyped = ["invalid type: ", "invalid value: ", "invalid length "]
            .iter()
            .any(|k| msg.contains(k));
        if retyped && top != T::TAG {
            prop_assert!(
                msg.contains(&format!("`{top}`")),
                "a retyped value under {:?} not named: {:?}",
                top,
                msg
            );
        }
    }
    if let (Ok(_), Mutation::Delete, Some(Seg::Key(k))) = (&r, m, path.last()) {
        prop_assert!(
            optional.contains(&k.as_str()),
            "a message without its required {:?} parsed",
            k
        );
    }
    Ok(())
}

/// What the line reader must give for `input` under `max`: each newline-terminated piece (and a
/// last unterminated one) as a line when it fits, else `TooLong`.
fn expected_lines(input: &[u8], max: usize) -> Vec<Option<Vec<u8>>> {
    let mut pieces: Vec<&[u8]> = input.split(|&b| b == b'\n').collect();
    if pieces.last().is_some_and(|p| p.is_empty()) {
        pieces.pop();
    }
    pieces
        .into_iter()
        .map(|p| (p.len() <= max).then(|| p.to_vec()))
        .collect()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn request_random_line(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        // Whether it parses does not matter here: parse_line checks the error or the round trip.
        let _ = parse_line::<Request>(&String::from_utf8_lossy(&bytes))?;
    }

    #[test]
    fn reply_random_line(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = parse_line::<Reply>(&String::from_utf8_lossy(&bytes))?;
    }

    #[test]
    fn request_mutated(i in any::<prop::sample::Index>(), which in any::<prop::sample::Index>(), m in mutation()) {
        // `op` is the tag: deleting it is named too (`missing field `op``).
        mutated::<Request>(requests(), i, which, &m, &["draft", "drafts", "probe"])?;
    }

    #[test]
    fn reply_mutated(i in any::<prop::sample::Index>(), which in any::<prop::sample::Index>(), m in mutation()) {
        mutated::<Reply>(replies(), i, which, &m, &["probe_logit", "id"])?;
    }

    #[test]
    fn protocol_damaged_line(i in any::<prop::sample::Index>(), d in text_damage(), d2 in text_damage(), reply in any::<bool>()) {
        let examples = if reply { replies() } else { requests() };
        let line = i.get(&examples).to_string();
        let bytes = damage(&damage(line.as_bytes(), d), d2);
        let text = String::from_utf8_lossy(&bytes);
        if reply {
            let _ = parse_line::<Reply>(&text)?;
        } else {
            let _ = parse_line::<Request>(&text)?;
        }
    }

    /// The bounded reader: never a line over the limit, never a newline inside one, exactly
    /// the pieces between newlines, and it ends (each call consumes input or reports the end).
    #[test]
    fn bounded_line_reader(
        input in proptest::collection::vec(prop_oneof![4 => any::<u8>(), 1 => Just(b'\n')], 0..600),
        cap in 1usize..64,
        max in 0usize..80,
    ) {
        let mut r = BufReader::with_capacity(cap, &input[..]);
        let mut got = vec![];
        let t = Instant::now();
        loop {
            prop_assert!(got.len() <= input.len() + 1, "the reader does not end");
            match read_line(&mut r, || max).unwrap() {
                Bounded::Eof => break,
                Bounded::Line(l) => {
                    prop_assert!(l.len() <= max && !l.contains(&b'\n'));
                    got.push(Some(l));
                }
                Bounded::TooLong => {
                    skip_line(&mut r).unwrap();
                    got.push(None);
                }
            }
        }
        prop_assert!(t.elapsed() < BOUND);
        prop_assert_eq!(got, expected_lines(&input, max));
    }
}
