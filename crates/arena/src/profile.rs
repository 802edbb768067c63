//! A `profile` run's profile (issue 49): the candidate's per-op times (`fastdecode bench
//! --profile --json`: the prefill's and a decode step's time per op) and, on a CUDA track, its
//! per-kernel timeline of two decode steps (`bench --trace`'s CSV of per-block stamps).
//!
//! Everything here comes from the candidate's own build, which is hostile: the runner reads at
//! most a bounded prefix of what it printed, takes only numbers that are finite and within
//! bounds, keeps op names in a safe charset and short, names kernels from the `fastdecode_trace`
//! table (the trace's numeric kernel id, never a string of the candidate's), and caps how many
//! rows it keeps. The service checks the parsed profile again (`Profile::check`) before storing it.
//! Nothing in it is rendered raw: the pages escape its names and the SVGs are drawn by the
//! service from these numbers (`server::plots`). It goes to its solver only, and nothing that
//! prices, ranks or promotes reads it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The most bytes of the bench's output the runner reads.
pub const OUTPUT_MAX: usize = 1 << 20;
/// The most bytes of a trace's CSV the runner reads: the engine's most records (`RECORDS_MAX`)
/// at about 80 bytes a line.
pub const TRACE_MAX: usize = 160 << 20;
/// The most ops a table may list.
pub const OPS_MAX: usize = 64;
/// The most characters an op name keeps.
pub const NAME_MAX: usize = 48;
/// The most launches a timeline keeps (the earliest).
pub const LAUNCHES_MAX: usize = 2000;
/// The most kernels a timeline's table lists.
pub const KERNELS_MAX: usize = 64;
/// The most records of a trace read: the most the engine's trace buffer holds (`FD_TRACE_CAP`
/// in `crates/cuda/kernels/common.cuh`), so an honest trace is never refused for its size.
pub const RECORDS_MAX: usize = 1 << 21;
/// The most milliseconds an op may take (per token or per prefill), and microseconds a
/// timeline may span.
pub const MS_MAX: f64 = 1e7;
/// The most calls (launches) an op may count per token or prefill.
pub const CALLS_MAX: f64 = 1e9;
/// The most characters of a profile's note (the runner's or the service's words).
pub const NOTE_MAX: usize = 1000;

/// What a profile run returns its solver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// The track's backend (`cpu`, `cuda`): the arena's word, not the candidate's.
    pub backend: String,
    /// Prompt length of the profiled prefill (the track's window; a random prompt, never a
    /// hidden one).
    pub prompt_tokens: usize,
    /// Time per op of one decode step (ms per token), the busiest first.
    pub decode: Vec<OpTime>,
    /// Time per op of the prefill (ms per prefill), the busiest first.
    pub prefill: Vec<OpTime>,
    /// The per-kernel timeline of two decode steps (CUDA tracks), when the build gave one.
    #[serde(default)]
    pub timeline: Option<Timeline>,
    /// What the profile holds and lacks, in the runner's words (why there is no timeline: a
    /// CPU track has none; why there is no table: what the build did).
    pub note: String,
}

/// One op's time: milliseconds and calls per token (or per prefill).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpTime {
    pub op: String,
    pub ms: f64,
    pub calls: f64,
}

/// Two traced decode steps: each launch (its kernel, first block start and last block end in
/// µs from the first launch, blocks) and each kernel's share.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timeline {
    pub launches: Vec<Launch>,
    pub kernels: Vec<KernelTime>,
    /// Launches beyond `LAUNCHES_MAX` left out.
    #[serde(default)]
    pub left_out: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Launch {
    pub kernel: String,
    pub start_us: f64,
    pub end_us: f64,
    pub blocks: u32,
}

/// A kernel's launches in the timeline and their summed span (first start to last end, µs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelTime {
    pub kernel: String,
    pub launches: u32,
    pub busy_us: f64,
}

/// `s` in the safe charset (ASCII letters, digits, space and `_-.:/()[]+,=#`; anything else
/// becomes `?`), at most `NAME_MAX` characters; never empty.
pub fn safe_name(s: &str) -> String {
    let out: String = s
        .chars()
        .take(NAME_MAX)
        .map(|c| {
            if c.is_ascii_alphanumeric() || " _-.:/()[]+,=#".contains(c) {
                c
            } else {
                '?'
            }
        })
        .collect();
    if out.trim().is_empty() {
        "?".into()
    } else {
        out
    }
}

fn safe(s: &str) -> bool {
    safe_name(s) == s
}

/// A number of the candidate's: finite, from 0 to `max`.
fn bounded(v: &Value, what: &str, max: f64) -> Result<f64, String> {
    match v.as_f64() {
        Some(x) if x.is_finite() && (0.0..=max).contains(&x) => Ok(x),
        // Never the value itself: it is the candidate's text.
        _ => Err(format!("{what}: not a number from 0 to {max}")),
    }
}

/// A breakdown of the bench's JSON (`[{"op", "ms", "launches"}]`), checked and bounded, the
/// busiest first.
fn ops_of(v: &Value, key: &str) -> Result<Vec<OpTime>, String> {
    let rows = v[key]
        .as_array()
        .ok_or_else(|| format!("{key}: no per-op table"))?;
    if rows.len() > OPS_MAX {
        return Err(format!("{key}: {} ops, more than {OPS_MAX}", rows.len()));
    }
    let mut out = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let op = r["op"]
                .as_str()
                .ok_or_else(|| format!("{key}[{i}].op: not a string"))?;
            Ok(OpTime {
                op: safe_name(op),
                ms: bounded(&r["ms"], &format!("{key}[{i}].ms"), MS_MAX)?,
                calls: bounded(&r["launches"], &format!("{key}[{i}].launches"), CALLS_MAX)?,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    out.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    Ok(out)
}

/// The bench's JSON object in its output: the first line that opens an object and parses as
/// one (a build may print notes before it), looked for in at most 16 places.
fn bench_json(text: &str) -> Option<Value> {
    let mut at = 0;
    for _ in 0..16 {
        let rest = &text[at..];
        let i = if rest.starts_with('{') {
            0
        } else {
            rest.find("\n{")? + 1
        };
        let mut it = serde_json::Deserializer::from_str(&rest[i..]).into_iter::<Value>();
        if let Some(Ok(v)) = it.next() {
            if v.is_object() {
                return Some(v);
            }
        }
        at += i + 1;
    }
    None
}

/// The per-op tables (decode, prefill) of `fastdecode bench --profile --json`'s output (what the
/// candidate's build printed), or why none: oversized output, no JSON object, a missing or
/// oversized table, a number that is not finite or out of bounds.
pub fn ops_from_bench(output: &[u8]) -> Result<(Vec<OpTime>, Vec<OpTime>), String> {
    if output.len() > OUTPUT_MAX {
        return Err(format!("the profile printed more than {OUTPUT_MAX} bytes"));
    }
    let text = String::from_utf8_lossy(output);
    let v = bench_json(&text).ok_or("the profile printed no JSON report")?;
    Ok((
        ops_of(&v, "decode_breakdown_ms_per_token")?,
        ops_of(&v, "prefill_breakdown_ms")?,
    ))
}

/// A timeline from `bench --trace`'s CSV (`module,ns,kind,event,block,clock`, one stamp per
/// block event): each line's numbers parsed (a line that is not is refused), the module column
/// ignored, blocks grouped into launches as `fastdecode timeline` does (a kind's block that
/// starts again opens its next launch; a launch with no end is dropped), the earliest
/// `LAUNCHES_MAX` kept.
pub fn timeline_from_csv(csv: &[u8]) -> Result<Timeline, String> {
    use std::collections::{HashMap, HashSet};
    if csv.len() > TRACE_MAX {
        return Err(format!("the trace is more than {TRACE_MAX} bytes"));
    }
    let text = std::str::from_utf8(csv).map_err(|_| "the trace is not UTF-8".to_string())?;
    let mut recs: Vec<(u64, u32, u32, u32)> = vec![];
    for (i, line) in text.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        if recs.len() >= RECORDS_MAX {
            return Err(format!("the trace has more than {RECORDS_MAX} records"));
        }
        // An honest line is under 100 bytes; a long one is not split (into millions of fields).
        if line.len() > 256 {
            return Err(format!("trace line {}: longer than a record", i + 1));
        }
        let f: Vec<&str> = line.split(',').collect();
        let num = |j: usize| -> Result<u64, String> {
            f.get(j)
                .and_then(|x| x.trim().parse::<u64>().ok())
                .ok_or_else(|| format!("trace line {}: not a record", i + 1))
        };
        if f.len() != 6 {
            return Err(format!("trace line {}: not a record", i + 1));
        }
        let small =
            |x: u64| u32::try_from(x).map_err(|_| format!("trace line {}: out of range", i + 1));
        recs.push((num(1)?, small(num(2)?)?, small(num(3)?)?, small(num(4)?)?));
        num(5)?;
    }
    recs.sort_by_key(|r| (r.0, r.2));
    struct Open {
        started: HashSet<u32>,
        start: u64,
        end: u64,
        blocks: u32,
    }
    let mut done: Vec<(u32, Open)> = vec![];
    let mut open: HashMap<u32, Open> = HashMap::new();
    for (ns, kind, event, block) in recs {
        if event == 0 && open.get(&kind).is_some_and(|o| o.started.contains(&block)) {
            let o = open.remove(&kind).expect("checked above");
            done.push((kind, o));
        }
        let o = open.entry(kind).or_insert_with(|| Open {
            started: HashSet::new(),
            start: ns,
            end: 0,
            blocks: 0,
        });
        match event {
            0 => {
                if o.started.insert(block) {
                    o.blocks = o.blocks.saturating_add(1);
                }
                o.start = o.start.min(ns);
            }
            2 => o.end = o.end.max(ns),
            _ => {}
        }
    }
    done.extend(open);
    done.retain(|(_, o)| o.end > 0 && o.end >= o.start);
    done.sort_by_key(|(_, o)| o.start);
    let t0 = done.first().map(|(_, o)| o.start).unwrap_or(0);
    let us = |ns: u64| (ns - t0) as f64 / 1e3;
    let left_out = done.len().saturating_sub(LAUNCHES_MAX);
    let launches: Vec<Launch> = done
        .iter()
        .take(LAUNCHES_MAX)
        .filter(|(_, o)| us(o.end) <= MS_MAX)
        .map(|(kind, o)| Launch {
            kernel: fastdecode_trace::kind_name(*kind),
            start_us: us(o.start),
            end_us: us(o.end),
            blocks: o.blocks,
        })
        .collect();
    if launches.is_empty() {
        return Err("the trace holds no whole launch".into());
    }
    let mut kernels: Vec<KernelTime> = vec![];
    for l in &launches {
        match kernels.iter_mut().find(|k| k.kernel == l.kernel) {
            Some(k) => {
                k.launches += 1;
                k.busy_us += l.end_us - l.start_us;
            }
            None => kernels.push(KernelTime {
                kernel: l.kernel.clone(),
                launches: 1,
                busy_us: l.end_us - l.start_us,
            }),
        }
    }
    kernels.sort_by(|a, b| b.busy_us.total_cmp(&a.busy_us));
    kernels.truncate(KERNELS_MAX);
    Ok(Timeline {
        launches,
        kernels,
        left_out,
    })
}

impl Profile {
    /// Whether it is within every bound the runner's parsing keeps (the service's second look
    /// before storing one): the backend a known word, names in the safe charset, finite numbers
    /// within bounds, row counts capped, the note short.
    pub fn check(&self) -> Result<(), String> {
        if !matches!(self.backend.as_str(), "cpu" | "cuda") {
            return Err(format!("backend {:?}: cpu or cuda", self.backend));
        }
        if self.prompt_tokens > 1 << 20 {
            return Err("prompt_tokens: too many".into());
        }
        if self.note.chars().count() > NOTE_MAX || self.note.chars().any(char::is_control) {
            return Err(format!(
                "note: at most {NOTE_MAX} characters, none of them control characters"
            ));
        }
        let num = |x: f64, max: f64| x.is_finite() && (0.0..=max).contains(&x);
        for (what, ops) in [("decode", &self.decode), ("prefill", &self.prefill)] {
            if ops.len() > OPS_MAX {
                return Err(format!("{what}: more than {OPS_MAX} ops"));
            }
            for o in ops {
                if !safe(&o.op) || !num(o.ms, MS_MAX) || !num(o.calls, CALLS_MAX) {
                    return Err(format!("{what}: an op out of bounds"));
                }
            }
        }
        if let Some(t) = &self.timeline {
            if t.launches.len() > LAUNCHES_MAX || t.kernels.len() > KERNELS_MAX {
                return Err("timeline: too many launches or kernels".into());
            }
            for l in &t.launches {
                if !safe(&l.kernel)
                    || !num(l.start_us, MS_MAX)
                    || !num(l.end_us, MS_MAX)
                    || l.end_us < l.start_us
                {
                    return Err("timeline: a launch out of bounds".into());
                }
            }
            for k in &t.kernels {
                if !safe(&k.kernel) || !num(k.busy_us, MS_MAX * LAUNCHES_MAX as f64) {
                    return Err("timeline: a kernel out of bounds".into());
                }
            }
        }
        Ok(())
    }

    /// A profile with neither table nor timeline: `why` (the runner's or the service's words).
    pub fn unavailable(backend: &str, prompt_tokens: usize, why: &str) -> Profile {
        Profile {
            backend: backend.into(),
            prompt_tokens,
            decode: vec![],
            prefill: vec![],
            timeline: None,
            note: why
                .chars()
                .filter(|c| !c.is_control())
                .take(NOTE_MAX)
                .collect(),
        }
    }

    /// The tables as text (what `fastdecode submit` and `arena status` print).
    pub fn table(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let _ = writeln!(s, "profile ({}): {}", self.backend, self.note);
        for (what, unit, ops) in [
            ("decode step", "ms/token", &self.decode),
            ("prefill", "ms/prefill", &self.prefill),
        ] {
            if ops.is_empty() {
                continue;
            }
            let total: f64 = ops.iter().map(|o| o.ms).sum();
            let _ = writeln!(s, "  {what} ({} tokens of prompt):", self.prompt_tokens);
            for o in ops {
                let share = if total > 0.0 {
                    100.0 * o.ms / total
                } else {
                    0.0
                };
                let _ = writeln!(
                    s,
                    "    {:<40} {:>10.4} {unit} {:>5.1} % {:>8.0} calls",
                    o.op, o.ms, share, o.calls
                );
            }
        }
        if let Some(t) = &self.timeline {
            let _ = writeln!(s, "  kernels of two decode steps (timeline):");
            for k in &t.kernels {
                let _ = writeln!(
                    s,
                    "    {:<40} {:>10.1} µs {:>5} launches",
                    k.kernel, k.busy_us, k.launches
                );
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench(decode: &str) -> Vec<u8> {
        format!(
            "note: something first\n{{\n  \"backend\": \"cpu\",\n  \
             \"decode_breakdown_ms_per_token\": {decode},\n  \
             \"prefill_breakdown_ms\": [{{\"op\": \"moe\", \"ms\": 2.0, \"launches\": 4}}]\n}}\n"
        )
        .into_bytes()
    }

    #[test]
    fn a_bench_report_gives_its_tables_the_busiest_first() {
        let (d, p) = ops_from_bench(&bench(
            r#"[{"op": "attention", "ms": 0.5, "launches": 4}, {"op": "moe", "ms": 1.5, "launches": 4}]"#,
        ))
        .unwrap();
        assert_eq!(
            d.iter().map(|o| o.op.as_str()).collect::<Vec<_>>(),
            ["moe", "attention"]
        );
        assert_eq!((p[0].ms, p[0].calls), (2.0, 4.0));
    }

    #[test]
    fn hostile_bench_output_is_refused_or_bounded() {
        let refused = |out: Vec<u8>, why: &str| {
            let e = ops_from_bench(&out).unwrap_err();
            assert!(e.contains(why), "{e}");
        };
        // Oversized output, whatever it holds.
        refused(vec![b' '; OUTPUT_MAX + 1], "more than");
        // No report at all; a report without the table.
        refused(b"garbage\n{ not json\n".to_vec(), "no JSON report");
        refused(b"{\"backend\": \"cpu\"}\n".to_vec(), "no per-op table");
        // NaN is not JSON: the candidate can only write it as a string or null; both refused,
        // as are infinities spelt as huge numbers, negatives and non-numbers.
        refused(
            bench(r#"[{"op": "a", "ms": NaN, "launches": 1}]"#),
            "no JSON report",
        );
        for bad in [r#""NaN""#, "null", "-1", "1e300", r#""1.0""#] {
            refused(
                bench(&format!(r#"[{{"op": "a", "ms": {bad}, "launches": 1}}]"#)),
                "not a number from",
            );
        }
        refused(
            bench(r#"[{"op": "a", "ms": 1, "launches": 1e12}]"#),
            "launches",
        );
        refused(
            bench(r#"[{"op": 7, "ms": 1, "launches": 1}]"#),
            "not a string",
        );
        // Too many ops.
        let many: Vec<String> = (0..OPS_MAX + 1)
            .map(|i| format!(r#"{{"op": "op{i}", "ms": 1, "launches": 1}}"#))
            .collect();
        refused(bench(&format!("[{}]", many.join(","))), "more than 64");
        // Odd names are kept in the safe charset, short.
        let long = "x".repeat(500);
        let (d, _) = ops_from_bench(&bench(&format!(
            r#"[{{"op": "<script>alert('x')</script>", "ms": 1, "launches": 1}},
                {{"op": "{long}", "ms": 0.5, "launches": 1}},
                {{"op": "\u0000\n\u202e", "ms": 0.25, "launches": 1}}]"#
        )))
        .unwrap();
        assert_eq!(d[0].op, "?script?alert(?x?)?/script?");
        assert_eq!(d[1].op.len(), NAME_MAX);
        assert_eq!(d[2].op, "???");
        for o in &d {
            assert!(!o.op.contains(['<', '>', '&', '"', '\'']), "{o:?}");
        }
    }

    fn csv(rows: &[(u64, u32, u32, u32)]) -> Vec<u8> {
        let mut s = "module,ns,kind,event,block,clock\n".to_string();
        for (ns, kind, event, block) in rows {
            s += &format!("<b>,{ns},{kind},{event},{block},0\n");
        }
        s.into_bytes()
    }

    #[test]
    fn a_trace_becomes_launches_named_by_the_arenas_table() {
        let gemv = 2 << 20;
        let t = timeline_from_csv(&csv(&[
            (1000, gemv, 0, 0),
            (1100, gemv, 0, 1),
            (3000, gemv, 2, 0),
            (3500, gemv, 2, 1),
            // The same kernel again: its block 0 starts once more.
            (4000, gemv, 0, 0),
            (5000, gemv, 2, 0),
            // An unknown id with a tag: a number, not the module's text.
            (6000, 99 << 20 | 5, 0, 0),
            (7000, 99 << 20 | 5, 2, 0),
        ]))
        .unwrap();
        let l: Vec<(&str, f64, f64, u32)> = t
            .launches
            .iter()
            .map(|l| (l.kernel.as_str(), l.start_us, l.end_us, l.blocks))
            .collect();
        assert_eq!(
            l,
            [
                ("gemv_bf16", 0.0, 2.5, 2),
                ("gemv_bf16", 3.0, 4.0, 1),
                ("kernel 99", 5.0, 6.0, 1)
            ]
        );
        assert_eq!(t.kernels[0].kernel, "gemv_bf16");
        assert_eq!((t.kernels[0].launches, t.kernels[0].busy_us), (2, 3.5));
        let p = Profile {
            timeline: Some(t),
            ..Profile::unavailable("cuda", 8, "x")
        };
        p.check().unwrap();
    }

    #[test]
    fn a_hostile_trace_is_refused() {
        for (bad, why) in [
            (b"h\n1,2,3\n".to_vec(), "not a record"),
            (b"h\nm,-1,0,0,0,0\n".to_vec(), "not a record"),
            (b"h\nm,NaN,0,0,0,0\n".to_vec(), "not a record"),
            (b"h\nm,1,99999999999,0,0,0\n".to_vec(), "out of range"),
            (b"h\n\xff\xfe\n".to_vec(), "not UTF-8"),
            (b"h\nm,1,1,0,0,0\n".to_vec(), "no whole launch"),
            (
                [b"h\n".to_vec(), vec![b','; 100_000]].concat(),
                "longer than a record",
            ),
            (vec![b'0'; TRACE_MAX + 1], "more than"),
        ] {
            let e = timeline_from_csv(&bad).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn the_services_check_refuses_what_parsing_would_not_make() {
        let ok = Profile {
            decode: vec![OpTime {
                op: "moe".into(),
                ms: 1.0,
                calls: 2.0,
            }],
            ..Profile::unavailable("cpu", 8, "per-op times")
        };
        ok.check().unwrap();
        let bad = |f: &dyn Fn(&mut Profile)| {
            let mut p = ok.clone();
            f(&mut p);
            assert!(p.check().is_err(), "{p:?}");
        };
        bad(&|p| p.backend = "<svg>".into());
        bad(&|p| p.decode[0].op = "<b>".into());
        bad(&|p| p.decode[0].ms = f64::NAN);
        bad(&|p| p.decode[0].calls = f64::INFINITY);
        bad(&|p| p.decode[0].ms = -1.0);
        bad(&|p| p.note = "x\u{1b}[2J".into());
        bad(&|p| p.prefill = vec![p.decode[0].clone(); OPS_MAX + 1]);
    }
    /// The contract with the engine's own trace writer and grouping
    /// (`fastdecode_cuda::timeline`): what `bench --trace` writes reads back as the launches
    /// and kernel names `fastdecode timeline` finds, for any records.
    mod against_the_engine {
        use super::super::*;
        use fastdecode_cuda::timeline as engine;
        use proptest::prelude::*;

        fn record() -> impl Strategy<Value = engine::TraceRecord> {
            (
                0u64..200,
                prop::sample::select(vec![1u32 << 20, 2 << 20 | 7, 6 << 20, 13 << 20 | 1]),
                prop::sample::select(vec![0u32, 1, 2, 3]),
                0u32..4,
            )
                .prop_map(|(t, kind, event, block)| engine::TraceRecord {
                    module: "moe".into(),
                    ns: 1000 + 10 * t,
                    kind,
                    event,
                    block,
                    clock: t * 3,
                })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]
            #[test]
            fn a_written_trace_reads_back_as_the_engines_launches(
                recs in prop::collection::vec(record(), 1..120)
            ) {
                let dir = tempfile::tempdir().unwrap();
                let path = dir.path().join("trace.csv");
                engine::write_csv(&path, &recs).unwrap();
                let mut want: Vec<(String, u64, u64, u32)> = engine::launches(&recs)
                    .iter()
                    .map(|l| (fastdecode_trace::kind_name(l.kind), l.first_start, l.last_end, l.blocks as u32))
                    .collect();
                match timeline_from_csv(&std::fs::read(&path).unwrap()) {
                    Err(e) => prop_assert!(want.is_empty(), "{e}: {want:?}"),
                    Ok(t) => {
                        let t0 = want.iter().map(|w| w.1).min().unwrap();
                        let us = |ns: u64| (ns - t0) as f64 / 1e3;
                        let mut got: Vec<(String, f64, f64, u32)> = t
                            .launches
                            .iter()
                            .map(|l| (l.kernel.clone(), l.start_us, l.end_us, l.blocks))
                            .collect();
                        let mut want: Vec<(String, f64, f64, u32)> = want
                            .drain(..)
                            .map(|(k, a, b, n)| (k, us(a), us(b), n))
                            .collect();
                        let key = |x: &(String, f64, f64, u32)| (x.1.to_bits(), x.2.to_bits(), x.0.clone(), x.3);
                        got.sort_by_key(key);
                        want.sort_by_key(key);
                        prop_assert_eq!(got, want);
                    }
                }
            }
        }
    }
}
