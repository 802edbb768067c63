//! Timelines of traced decode steps: kernels built with `-DFD_TRACE` (see `kernels/common.cuh`)
//! stamp, per block, the global timer and the SM's cycle counter when the block starts (event 0),
//! passes `pdl_wait` (1) and ends (2), plus `FD_MARK(n)` points (3..). `fastdecode bench --trace`
//! writes them as CSV; this module reads them back, groups them into launches and tells what each
//! kernel adds to a step (`fastdecode timeline`), or draws the step as a waterfall.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use fastdecode_trace::kind_name;

use crate::error::{CudaError, Result};

/// One stamp of a traced kernel (`fd_stamp` in common.cuh).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRecord {
    /// The kernel module (`dense`, `moe`, ...).
    pub module: String,
    /// The GPU's global timer, ns.
    pub ns: u64,
    /// Kernel id (top 4 of 24 bits, `FD_TRACE_KERNEL`'s first argument) and tag (the rest).
    pub kind: u32,
    /// 0 block start, 1 past pdl_wait, 2 block end, 3.. FD_MARK points.
    pub event: u32,
    /// Linear block index.
    pub block: u32,
    /// The SM's cycle counter (comparable within a block only).
    pub clock: u64,
}

/// One launch: when its blocks started, passed their wait and ended (ns), and its marks.
#[derive(Clone, Debug)]
pub struct Launch {
    pub kind: u32,
    pub blocks: usize,
    pub first_start: u64,
    /// The first block past `pdl_wait`; the first start when the kernel never waits.
    pub first_wait: u64,
    pub last_end: u64,
    /// Per FD_MARK event, each block's time (its last, for a mark inside a loop).
    pub marks: BTreeMap<u32, HashMap<u32, u64>>,
    /// The SM clock each block ran at (its cycle span over its timer span), MHz, for blocks
    /// that ran long enough (> 2 µs) for the timer's 32 ns steps to matter little.
    pub sm_mhz: Vec<f64>,
    /// Every block's steps from one of its events to its next: (from, to, µs).
    pub phases: Vec<(u32, u32, f64)>,
}

/// The records grouped into launches, in launch order. A kind's blocks start once per launch, so a
/// block that starts again opens the kind's next launch. Launches without an end are dropped.
pub fn launches(records: &[TraceRecord]) -> Vec<Launch> {
    let mut recs: Vec<&TraceRecord> = records.iter().collect();
    recs.sort_by_key(|r| (r.ns, r.event));
    struct Open {
        /// Each started block's start (timer, cycle counter).
        started: HashMap<u32, (u64, u64)>,
        /// Each block's latest event and its time.
        last: HashMap<u32, (u32, u64)>,
        l: Launch,
        waits: Vec<u64>,
    }
    let mut done: Vec<Launch> = vec![];
    let mut open: HashMap<u32, Open> = HashMap::new();
    let close = |o: Open, done: &mut Vec<Launch>| {
        let mut l = o.l;
        if l.last_end > 0 {
            l.first_wait = o.waits.iter().copied().min().unwrap_or(l.first_start);
            done.push(l);
        }
    };
    for r in recs {
        if r.event == 0
            && open
                .get(&r.kind)
                .is_some_and(|o| o.started.contains_key(&r.block))
        {
            let o = open.remove(&r.kind).expect("checked above");
            close(o, &mut done);
        }
        let o = open.entry(r.kind).or_insert_with(|| Open {
            started: HashMap::new(),
            last: HashMap::new(),
            l: Launch {
                kind: r.kind,
                blocks: 0,
                first_start: r.ns,
                first_wait: r.ns,
                last_end: 0,
                marks: BTreeMap::new(),
                sm_mhz: vec![],
                phases: vec![],
            },
            waits: vec![],
        });
        if let Some((from, t)) = o.last.insert(r.block, (r.event, r.ns)) {
            o.l.phases.push((from, r.event, micros(r.ns, t)));
        }
        match r.event {
            0 => {
                o.started.insert(r.block, (r.ns, r.clock));
                o.l.blocks += 1;
                o.l.first_start = o.l.first_start.min(r.ns);
            }
            1 => o.waits.push(r.ns),
            2 => {
                o.l.last_end = o.l.last_end.max(r.ns);
                if let Some(&(t0, c0)) = o.started.get(&r.block) {
                    let dt = r.ns.saturating_sub(t0);
                    if dt > 2000 {
                        o.l.sm_mhz
                            .push(r.clock.wrapping_sub(c0) as f64 / dt as f64 * 1e3);
                    }
                }
            }
            e => {
                o.l.marks.entry(e).or_default().insert(r.block, r.ns);
            }
        }
    }
    for (_, o) in open {
        close(o, &mut done);
    }
    done.sort_by_key(|l| l.first_start);
    done
}

/// What one kernel kind costs a step, medians over its launches (µs).
#[derive(Clone, Debug)]
pub struct KernelCost {
    pub kind: u32,
    pub launches: usize,
    /// Its last end minus the previous launch's last end: what it adds to the step.
    pub step_us: f64,
    /// Its first wait minus the previous launch's last end: the dependency.
    pub wait_us: f64,
    /// Its last end minus its first wait: the work after the dependency.
    pub run_us: f64,
    /// Its launches' share of the summed step time.
    pub share: f64,
    /// The SM clock it ran at (each block's cycle span over its timer span, median), MHz.
    pub sm_mhz: Option<f64>,
    /// Per FD_MARK event: (min, median, max) over the blocks of µs after the first wait.
    pub marks: BTreeMap<u32, [f64; 3]>,
    /// A block's steps between consecutive events (from, to), in the order they first occur:
    /// median and 90th percentile over all its blocks and launches, µs. Unlike the marks, these
    /// are measured from each block's own previous event, so blocks that start or pass their
    /// wait late do not blur them.
    pub phases: Vec<(u32, u32, [f64; 2])>,
}

/// a - b in µs. The timer reads ~1.7e18 ns, beyond f64's exact integers: subtract first.
fn micros(a: u64, b: u64) -> f64 {
    (a as i64).wrapping_sub(b as i64) as f64 / 1e3
}

/// The median (the mean of the middle two for an even count).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Per kernel kind, what it adds to a step, most expensive first. The first launch has no
/// predecessor and only counts for its marks.
pub fn costs(records: &[TraceRecord]) -> Vec<KernelCost> {
    let ls = launches(records);
    // Per kind: each launch's (step, wait, run), and per mark each launch's (min, median, max).
    type PerKind = (Vec<[f64; 3]>, BTreeMap<u32, Vec<[f64; 3]>>);
    let mut per: BTreeMap<u32, PerKind> = BTreeMap::new();
    let mut mhz: HashMap<u32, Vec<f64>> = HashMap::new();
    // Per kind, each phase's durations, phases in the order they first occur.
    type Steps = Vec<((u32, u32), Vec<f64>)>;
    let mut phases: HashMap<u32, Steps> = HashMap::new();
    let mut prev_end: Option<u64> = None;
    for l in &ls {
        mhz.entry(l.kind).or_default().extend(&l.sm_mhz);
        let ph = phases.entry(l.kind).or_default();
        for &(from, to, us) in &l.phases {
            match ph.iter_mut().find(|(k, _)| *k == (from, to)) {
                Some((_, v)) => v.push(us),
                None => ph.push(((from, to), vec![us])),
            }
        }
        let e = per.entry(l.kind).or_default();
        if let Some(p) = prev_end {
            e.0.push([
                micros(l.last_end, p),
                micros(l.first_wait, p),
                micros(l.last_end, l.first_wait),
            ]);
        }
        for (ev, ts) in &l.marks {
            let mut v: Vec<f64> = ts.values().map(|&t| micros(t, l.first_wait)).collect();
            // Over the blocks: min, the upper middle one, max.
            v.sort_by(f64::total_cmp);
            e.1.entry(*ev)
                .or_default()
                .push([v[0], v[v.len() / 2], v[v.len() - 1]]);
        }
        prev_end = Some(l.last_end);
    }
    let total: f64 = per.values().flat_map(|(s, _)| s.iter().map(|x| x[0])).sum();
    let mut out: Vec<KernelCost> = per
        .into_iter()
        .filter(|(_, (s, _))| !s.is_empty())
        .map(|(kind, (s, m))| {
            let col = |i: usize| median(&mut s.iter().map(|x| x[i]).collect::<Vec<_>>());
            KernelCost {
                kind,
                launches: s.len(),
                step_us: col(0),
                wait_us: col(1),
                run_us: col(2),
                share: s.iter().map(|x| x[0]).sum::<f64>() / total,
                sm_mhz: mhz
                    .get_mut(&kind)
                    .filter(|v| !v.is_empty())
                    .map(|v| median(v)),
                marks: m
                    .into_iter()
                    .map(|(ev, v)| {
                        let c = |i: usize| median(&mut v.iter().map(|x| x[i]).collect::<Vec<_>>());
                        (ev, [c(0), c(1), c(2)])
                    })
                    .collect(),
                phases: phases
                    .remove(&kind)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|((from, to), mut v)| {
                        // median() sorts v in place; the 90th percentile is then the nearest
                        // rank: the smallest value with 90 % of them at or below it.
                        let m = median(&mut v);
                        let p90 = v[(v.len() * 9).div_ceil(10).max(1) - 1];
                        (from, to, [m, p90])
                    })
                    .collect(),
            }
        })
        .collect();
    out.sort_by(|a, b| (b.share).total_cmp(&a.share));
    out
}

/// A trace event as the table names it: start, wait, end, or the mark's number.
fn event_name(e: u32) -> String {
    match e {
        0 => "start".into(),
        1 => "wait".into(),
        2 => "end".into(),
        n => n.to_string(),
    }
}

/// The costs as a table, with each kernel's marks and per-block phases under it.
pub fn table(costs: &[KernelCost]) -> String {
    let mut s = format!(
        "{:<26} {:>8} {:>8} {:>8} {:>8} {:>6} {:>7}\n",
        "kernel (tag)", "launches", "step µs", "wait µs", "run µs", "share", "SM MHz"
    );
    for c in costs {
        let mhz = c.sm_mhz.map_or("-".to_string(), |m| format!("{m:.0}"));
        let _ = writeln!(
            s,
            "{:<26} {:>8} {:>8.2} {:>8.2} {:>8.2} {:>5.1}% {:>7}",
            kind_name(c.kind),
            c.launches,
            c.step_us,
            c.wait_us,
            c.run_us,
            100.0 * c.share,
            mhz
        );
        for (ev, m) in &c.marks {
            let _ = writeln!(
                s,
                "    mark {ev}: {:.2} / {:.2} / {:.2} µs after the wait",
                m[0], m[1], m[2]
            );
        }
        if !c.phases.is_empty() {
            let steps: Vec<String> = c
                .phases
                .iter()
                .map(|(from, to, v)| {
                    format!(
                        "{}→{} {:.2} / {:.2}",
                        event_name(*from),
                        event_name(*to),
                        v[0],
                        v[1]
                    )
                })
                .collect();
            let _ = writeln!(s, "    per block, median / p90 µs: {}", steps.join(", "));
        }
    }
    s
}

/// The first `window_us` of the launches as an SVG waterfall: a row per launch, pale from its
/// first block's start to its first wait (resident, prefetching, waiting for its predecessor),
/// dark from there to its last block's end.
pub fn waterfall_svg(launches: &[Launch], window_us: f64) -> String {
    let Some(t0) = launches.iter().map(|l| l.first_start).min() else {
        return String::from("<svg xmlns=\"http://www.w3.org/2000/svg\"/>\n");
    };
    let at = |t: u64| (t.saturating_sub(t0)) as f64 / 1e3;
    let rows: Vec<&Launch> = launches
        .iter()
        .filter(|l| at(l.first_start) <= window_us)
        .collect();
    let (px, row_h, label_w) = (4.0, 16.0, 200.0);
    let width = label_w + window_us * px + 20.0;
    let height = (rows.len() as f64 + 2.0) * row_h + 10.0;
    let x = |us: f64| label_w + us.min(window_us) * px;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
         font-family=\"monospace\" font-size=\"11\">\n<rect width=\"{width:.0}\" \
         height=\"{height:.0}\" fill=\"white\"/>\n"
    );
    // A tick every 10 µs, labelled every 50.
    let mut us = 0.0;
    while us <= window_us {
        let _ = writeln!(
            s,
            "<line x1=\"{:.1}\" y1=\"{row_h}\" x2=\"{:.1}\" y2=\"{:.0}\" stroke=\"#eee\"/>",
            x(us),
            x(us),
            height - 5.0
        );
        if (us as u64).is_multiple_of(50) {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{}\">{us:.0} µs</text>",
                x(us) + 2.0,
                row_h - 4.0
            );
        }
        us += 10.0;
    }
    for (i, l) in rows.iter().enumerate() {
        let y = (i as f64 + 1.0) * row_h + 4.0;
        let (start, wait, end) = (at(l.first_start), at(l.first_wait), at(l.last_end));
        let name = kind_name(l.kind);
        let _ = writeln!(s, "<text x=\"4\" y=\"{:.0}\">{name}</text>", y + 11.0);
        let _ = writeln!(
            s,
            "<rect x=\"{:.1}\" y=\"{y:.0}\" width=\"{:.1}\" height=\"{:.0}\" fill=\"#c6dbef\"/>",
            x(start),
            (x(wait) - x(start)).max(0.5),
            row_h - 4.0
        );
        let _ = writeln!(
            s,
            "<rect x=\"{:.1}\" y=\"{y:.0}\" width=\"{:.1}\" height=\"{:.0}\" fill=\"#2171b5\">\
             <title>{name}: waits {:.2} µs, runs {:.2} µs</title></rect>",
            x(wait),
            (x(end) - x(wait)).max(0.5),
            row_h - 4.0,
            wait - start,
            end - wait
        );
    }
    s.push_str("</svg>\n");
    s
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> CudaError {
    CudaError::Shape(format!("{}: {e}", path.display()))
}

/// Writes the records as CSV (header `module,ns,kind,event,block,clock`), atomically
/// (`fastdecode_model::checkpoint::write_atomic`): an interrupted run leaves no half-written file.
pub fn write_csv(path: &Path, records: &[TraceRecord]) -> Result<()> {
    let mut w = csv::Writer::from_writer(vec![]);
    for r in records {
        w.serialize(r).map_err(|e| io_err(path, e))?;
    }
    let bytes = w.into_inner().map_err(|e| io_err(path, e))?;
    Ok(fastdecode_model::checkpoint::write_atomic(path, &bytes)?)
}

/// Reads records written by `write_csv`; a malformed line is an error naming the file and line.
pub fn read_csv(path: &Path) -> Result<Vec<TraceRecord>> {
    let mut r = csv::Reader::from_path(path).map_err(|e| io_err(path, e))?;
    let recs = r
        .deserialize()
        .collect::<std::result::Result<Vec<TraceRecord>, _>>()
        .map_err(|e| io_err(path, e))?;
    if recs.is_empty() {
        return Err(io_err(path, "no trace records"));
    }
    Ok(recs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ns: u64, kind: u32, event: u32, block: u32, clock: u64) -> TraceRecord {
        TraceRecord {
            module: "m".into(),
            ns,
            kind,
            event,
            block,
            clock,
        }
    }

    /// Two kinds alternating, A (2 blocks) then B (1 block), three rounds 100 µs apart: A starts
    /// at 0, waits at 1 µs, ends at 11 µs (block 1 at 10); B starts at 5, waits at 12, ends at 20
    /// and marks event 3 at 14. Clocks tick 2 per ns.
    fn trace() -> Vec<TraceRecord> {
        let (a, b) = (2 << 20 | 2048, 3 << 20);
        let mut v = vec![];
        for round in 0..3u64 {
            let t = round * 100_000;
            for blk in 0..2 {
                v.push(rec(t, a, 0, blk, 2 * t));
                v.push(rec(t + 1000 + 10 * blk as u64, a, 1, blk, 0));
                let end = t + 10_000 + 1000 * blk as u64;
                v.push(rec(end, a, 2, blk, 2 * end));
            }
            v.push(rec(t + 5000, b, 0, 0, 2 * (t + 5000)));
            v.push(rec(t + 12_000, b, 1, 0, 0));
            v.push(rec(t + 14_000, b, 3, 0, 0));
            v.push(rec(t + 20_000, b, 2, 0, 2 * (t + 20_000)));
        }
        v
    }

    #[test]
    fn launches_split_on_a_repeated_block_start() {
        let ls = launches(&trace());
        assert_eq!(ls.len(), 6);
        assert_eq!(
            ls.iter().map(|l| l.kind >> 20).collect::<Vec<_>>(),
            [2, 3, 2, 3, 2, 3]
        );
        assert_eq!(ls[0].blocks, 2);
        assert_eq!(
            (ls[0].first_start, ls[0].first_wait, ls[0].last_end),
            (0, 1000, 11_000)
        );
        assert_eq!(ls[1].marks[&3][&0], 14_000);
    }

    #[test]
    fn costs_measure_from_the_previous_launch() {
        let c = costs(&trace());
        let a = c.iter().find(|k| k.kind >> 20 == 2).unwrap();
        let b = c.iter().find(|k| k.kind >> 20 == 3).unwrap();
        // B follows A: ends 9 µs after A's end, waits 1 µs after it, runs 8 µs.
        assert_eq!(
            (b.launches, b.step_us, b.wait_us, b.run_us),
            (3, 9.0, 1.0, 8.0)
        );
        // A follows the previous round's B (80 µs before its start): only two launches count.
        assert_eq!(
            (a.launches, a.step_us, a.wait_us, a.run_us),
            (2, 91.0, 81.0, 10.0)
        );
        assert!((a.share + b.share - 1.0).abs() < 1e-12);
        assert_eq!(b.marks[&3], [2.0, 2.0, 2.0]);
        assert_eq!(a.sm_mhz.map(|m| m.round()), Some(2000.0));
        // Most expensive first, and the table names both.
        assert_eq!(c[0].kind >> 20, 2);
        let t = table(&c);
        assert!(
            t.contains("gemv_bf16 (2048)") && t.contains("attend_decode"),
            "{t}"
        );
        assert!(t.contains("mark 3: 2.00 / 2.00 / 2.00"), "{t}");
        // Per block, from each block's own previous event: A's two blocks wait 1.00 and 1.01 µs
        // after their start and end 9.00 and 9.99 µs after their wait; B's one block steps
        // 7, 2 and 6 µs.
        assert_eq!(
            b.phases,
            vec![(0, 1, [7.0, 7.0]), (1, 3, [2.0, 2.0]), (3, 2, [6.0, 6.0])]
        );
        assert_eq!(a.phases.len(), 2);
        assert_eq!((a.phases[0].0, a.phases[0].1), (0, 1));
        assert!((a.phases[0].2[0] - 1.005).abs() < 1e-9 && (a.phases[0].2[1] - 1.01).abs() < 1e-9);
        assert!((a.phases[1].2[0] - 9.495).abs() < 1e-9 && (a.phases[1].2[1] - 9.99).abs() < 1e-9);
        assert!(
            t.contains("per block, median / p90 µs: start→wait 7.00 / 7.00, wait→3 2.00 / 2.00, 3→end 6.00 / 6.00"),
            "{t}"
        );
    }

    #[test]
    fn waterfall_draws_the_launches_in_the_window() {
        let ls = launches(&trace());
        let svg = waterfall_svg(&ls, 50.0);
        // Only the first round starts within 50 µs: two rows, each a pale and a dark bar.
        assert_eq!(svg.matches("fill=\"#2171b5\"").count(), 2);
        assert_eq!(svg.matches("fill=\"#c6dbef\"").count(), 2);
        assert!(
            svg.contains("attend_decode: waits 7.00 µs, runs 8.00 µs"),
            "{svg}"
        );
        assert_eq!(waterfall_svg(&ls, 300.0).matches("<title>").count(), 6);
    }

    #[test]
    fn csv_round_trips_and_bad_files_name_themselves() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.csv");
        let recs = trace();
        write_csv(&p, &recs).unwrap();
        // Nothing but the file itself is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert_eq!(read_csv(&p).unwrap(), recs);
        std::fs::write(&p, "module,ns,kind,event,block,clock\nm,1,2,x,0,0\n").unwrap();
        let e = read_csv(&p).unwrap_err().to_string();
        assert!(e.contains("t.csv") && e.contains("line: 2"), "{e}");
        let e = read_csv(&dir.path().join("none.csv"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("none.csv"), "{e}");
        std::fs::write(&p, "module,ns,kind,event,block,clock\n").unwrap();
        assert!(read_csv(&p)
            .unwrap_err()
            .to_string()
            .contains("no trace records"));
    }
}
