//! The record's plots, as SVG written on the server (no script needed to read them): a track's
//! frontier over time (the record line, each promotion a point, other ranked submissions beside
//! it), a pricing's pairs (each pair's score with the overall score, its interval, 1.0 and the
//! floor) and the transfer ledger (each submission's local score against the arena's, both
//! intervals, the line y = x), and a profile run's per-op bars and kernel waterfall (drawn from
//! the numbers the runner parsed, never an SVG of the candidate's). All with axes, units and
//! labels; every solver-supplied string (names, machine descriptions, op names) escaped.

use std::fmt::Write;

use crate::api::{FrontierPoint, LeaderboardRow, LedgerRow, PairPoint};
use crate::profile::{OpTime, Timeline};

const W: f64 = 760.0;
const H: f64 = 340.0;
/// Margins: left (room for the y labels), right, top (the title), bottom (x labels, axis name).
const L: f64 = 70.0;
const R: f64 = 110.0;
const T: f64 = 40.0;
const B: f64 = 50.0;

/// Text for an SVG text node or attribute.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// Round tick values covering [lo, hi], about `n` of them, and how many decimals they need.
pub fn ticks(lo: f64, hi: f64, n: usize) -> (Vec<f64>, usize) {
    let span = (hi - lo).max(1e-9);
    let raw = span / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw * (1.0 - 1e-9))
        .unwrap_or(10.0 * mag);
    let mut decimals = (-step.log10().floor()).max(0.0) as usize;
    if (step / 10f64.powi(-(decimals as i32)) - 2.5).abs() < 1e-9 {
        decimals += 1;
    }
    let mut out = vec![];
    let mut k = (lo / step).ceil();
    while k * step <= hi + step * 1e-9 && out.len() < 100 {
        out.push(k * step);
        k += 1.0;
    }
    (out, decimals)
}

/// (year, month, day) of a day count since 1970-01-01 (proleptic Gregorian).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = (if mp < 10 { mp + 3 } else { mp - 9 }) as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// `2026-12-01 22:15 UTC` of Unix milliseconds.
pub fn datetime(ms: i64) -> String {
    format!("{} UTC", &datetime_seconds(ms)[..16])
}

/// `2026-12-01 22:15:07` of Unix milliseconds (UTC).
pub fn datetime_seconds(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (y, m, d) = civil(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        s / 3600,
        s % 3600 / 60,
        s % 60
    )
}

/// A time tick's label: the clock time when the plot spans under two days, else the date.
fn time_label(ms: i64, span_ms: i64) -> String {
    let full = datetime(ms);
    if span_ms < 2 * 86_400_000 {
        full[11..16].to_string()
    } else {
        full[5..10].to_string()
    }
}

/// Ticks at round times (whole minutes, hours or days) covering [t0, t1], at most about 7.
fn time_ticks(t0: i64, t1: i64) -> Vec<i64> {
    const MIN: i64 = 60_000;
    let steps = [
        MIN,
        2 * MIN,
        5 * MIN,
        10 * MIN,
        15 * MIN,
        30 * MIN,
        60 * MIN,
        120 * MIN,
        360 * MIN,
        720 * MIN,
        1440 * MIN,
        2 * 1440 * MIN,
        7 * 1440 * MIN,
        30 * 1440 * MIN,
        365 * 1440 * MIN,
    ];
    let step = steps
        .iter()
        .copied()
        .find(|s| (t1 - t0) / s <= 7)
        .unwrap_or(365 * 1440 * MIN);
    let mut out = vec![];
    let mut t = t0.div_euclid(step) * step + step;
    while t <= t1 && out.len() < 100 {
        out.push(t);
        t += step;
    }
    out
}

struct Frame {
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
}

impl Frame {
    fn x(&self, v: f64) -> f64 {
        L + (W - L - R) * (v - self.x0) / (self.x1 - self.x0).max(1e-12)
    }
    fn y(&self, v: f64) -> f64 {
        H - B - (H - T - B) * (v - self.y0) / (self.y1 - self.y0).max(1e-12)
    }
}

fn open(s: &mut String, title: &str, label: &str) {
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{}" font-family="sans-serif" font-size="12">"#,
        esc(label)
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{L}" y="22" font-size="14" font-weight="bold">{}</text>"#,
        esc(title)
    );
}

/// The y axis with its ticks, grid lines and name.
fn y_axis(s: &mut String, f: &Frame, name: &str) {
    let (ticks, dec) = ticks(f.y0, f.y1, 6);
    for t in ticks {
        let y = f.y(t);
        let _ = writeln!(
            s,
            r##"<line x1="{L}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end">{t:.dec$}</text>"##,
            W - R,
            L - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        s,
        r#"<line x1="{L}" x2="{L}" y1="{T}" y2="{:.1}" stroke="black"/>"#,
        H - B
    );
    let _ = writeln!(
        s,
        r#"<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">{}</text>"#,
        (T + H - B) / 2.0,
        esc(name)
    );
}

/// The x axis line and its name.
fn x_axis(s: &mut String, name: &str) {
    let _ = writeln!(
        s,
        r#"<line x1="{L}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="black"/>"#,
        W - R,
        H - B,
        H - B
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
        (L + W - R) / 2.0,
        H - 10.0,
        esc(name)
    );
}

/// Dashed horizontal reference lines (value, colour, name), each labelled at the right with its
/// value; labels of lines closer than a text line are spread apart (in order, within the plot),
/// so that "baseline 1.000", "floor 0.950" and a no-op's score never print over each other.
fn references(s: &mut String, f: &Frame, lines: &[(f64, &str, &str)]) {
    const LINE: f64 = 14.0;
    let mut at: Vec<(f64, usize)> = lines
        .iter()
        .enumerate()
        .map(|(i, l)| (f.y(l.0), i))
        .collect();
    at.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut label_y: Vec<f64> = at.iter().map(|a| a.0).collect();
    for i in 1..label_y.len() {
        label_y[i] = label_y[i].max(label_y[i - 1] + LINE);
    }
    // Pushed below the plot's bottom: shift back up, keeping the spacing.
    if let Some(&last) = label_y.last() {
        let over = last - (H - B);
        if over > 0.0 {
            label_y.iter_mut().for_each(|y| *y -= over);
        }
    }
    for (&(y, i), ly) in at.iter().zip(label_y) {
        let (v, color, label) = lines[i];
        let _ = writeln!(
            s,
            r#"<line x1="{L}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="{color}" stroke-dasharray="5 4"/><text class="reference" x="{:.1}" y="{:.1}" fill="{color}">{} {v:.3}</text>"#,
            W - R,
            W - R + 6.0,
            ly + 4.0,
            esc(label)
        );
    }
}

/// The frontier over time: the record line through the baseline and each promotion (labelled
/// with its solver), the other ranked submissions as hollow grey points (a promoted one is its
/// promotion's point only), up to `now_ms`.
pub fn frontier(points: &[FrontierPoint], ranked: &[LeaderboardRow], now_ms: i64) -> String {
    let others: Vec<&LeaderboardRow> = ranked
        .iter()
        .filter(|o| {
            !points
                .iter()
                .any(|p| p.submission.as_deref() == Some(o.submission.as_str()))
        })
        .collect();
    let mut s = String::new();
    open(
        &mut s,
        "The record over time",
        "frontier: best score over time, each promotion a point",
    );
    let times = points
        .iter()
        .map(|p| p.created_ms)
        .chain(others.iter().map(|o| o.created_ms))
        .chain([now_ms]);
    let (t0, t1) = times.fold((i64::MAX, i64::MIN), |(a, b), t| (a.min(t), b.max(t)));
    // At least a minute wide, so a young track's points do not sit on one line.
    let t1 = t1.max(t0 + 60_000);
    let pad = (t1 - t0) / 20;
    let (t0, t1) = (t0 - pad, t1 + pad);
    let scores = points
        .iter()
        .map(|p| p.score)
        .chain(others.iter().map(|o| o.score))
        .chain([1.0]);
    let (lo, hi) = scores.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let pad = ((hi - lo) * 0.1).max(0.05);
    let f = Frame {
        x0: t0 as f64,
        x1: t1 as f64,
        y0: (lo - pad).max(0.0),
        y1: hi + pad,
    };
    y_axis(&mut s, &f, "score (speed-up over the pinned baseline, ×)");
    x_axis(&mut s, "time (UTC)");
    for t in time_ticks(t0, t1) {
        let x = f.x(t as f64);
        let _ = writeln!(
            s,
            r#"<line x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{:.1}" stroke="black"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            H - B,
            H - B + 5.0,
            H - B + 18.0,
            time_label(t, t1 - t0)
        );
    }
    references(&mut s, &f, &[(1.0, "#444", "baseline")]);
    for o in &others {
        let _ = writeln!(
            s,
            r##"<circle class="entry" cx="{:.1}" cy="{:.1}" r="3.5" fill="white" stroke="#999"><title>{} {:.4}</title></circle>"##,
            f.x(o.created_ms as f64),
            f.y(o.score),
            esc(&o.submission),
            o.score
        );
    }
    // The record line: flat until the next promotion, then up to it; on to now.
    let mut path = String::new();
    for (i, p) in points.iter().enumerate() {
        let (x, y) = (f.x(p.created_ms as f64), f.y(p.score));
        if i == 0 {
            let _ = write!(path, "M{x:.1},{y:.1}");
        } else {
            let _ = write!(path, " H{x:.1} V{y:.1}");
        }
    }
    if !points.is_empty() {
        let _ = write!(path, " H{:.1}", f.x(now_ms as f64));
        let _ = writeln!(
            s,
            r##"<path d="{path}" fill="none" stroke="#06c" stroke-width="2"/>"##
        );
    }
    for p in points {
        let (x, y) = (f.x(p.created_ms as f64), f.y(p.score));
        let who = match (&p.solver, p.seq) {
            (_, 0) => "baseline".to_string(),
            (Some(s), _) => s.clone(),
            (None, _) => "?".to_string(),
        };
        let _ = writeln!(
            s,
            r##"<circle class="promotion" cx="{x:.1}" cy="{y:.1}" r="5" fill="#06c"><title>{} {:.4}</title></circle><text x="{:.1}" y="{:.1}" fill="#06c">{} {:.3}</text>"##,
            esc(p.submission.as_deref().unwrap_or("baseline")),
            p.score,
            x + 7.0,
            y - 7.0,
            esc(&who),
            p.score
        );
    }
    let _ = writeln!(
        s,
        r##"<g transform="translate({:.1} {T})"><circle r="5" fill="#06c"/><text x="9" y="4">promotion</text><circle cy="18" r="3.5" fill="white" stroke="#999"/><text x="9" y="22">other entry</text></g>"##,
        W - R + 8.0
    );
    s.push_str("</svg>\n");
    s
}

/// One pricing's pairs under `title`: each pair's score in the order run (filled: baseline
/// first; hollow: candidate first; grey: not accepted), that pricing's score with its 95 %
/// interval, 1.0 and the floor.
pub fn pairs(
    title: &str,
    pairs: &[PairPoint],
    score: Option<f64>,
    ci95: Option<[f64; 2]>,
    floor: f64,
) -> String {
    let mut s = String::new();
    open(
        &mut s,
        title,
        "pairs: each pair's score with the overall score and its interval",
    );
    let vals = pairs
        .iter()
        .map(|p| p.score)
        .chain(score)
        .chain(ci95.into_iter().flatten())
        .chain([1.0, floor]);
    let (lo, hi) = vals.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let pad = ((hi - lo) * 0.08).max(0.02);
    let n = pairs.len().max(1) as f64;
    let f = Frame {
        x0: 0.5,
        x1: n + 0.5,
        y0: lo - pad,
        y1: hi + pad,
    };
    if let Some([a, b]) = ci95 {
        let _ = writeln!(
            s,
            r##"<rect x="{L}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#cfe3ff"/>"##,
            f.y(b),
            W - L - R,
            (f.y(a) - f.y(b)).max(1.0)
        );
    }
    y_axis(&mut s, &f, "pair score (speed-up, ×)");
    x_axis(&mut s, "pair (in the order run)");
    for t in ticks(1.0, n, 8.min(pairs.len().max(1))).0 {
        let x = f.x(t);
        let _ = writeln!(
            s,
            r#"<line x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{:.1}" stroke="black"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{t:.0}</text>"#,
            H - B,
            H - B + 5.0,
            H - B + 18.0
        );
    }
    let mut lines = vec![(1.0, "#444", "baseline"), (floor, "#c00", "floor")];
    lines.extend(score.map(|v| (v, "#06c", "score")));
    references(&mut s, &f, &lines);
    for (i, p) in pairs.iter().enumerate() {
        let color = if p.accepted { "#06c" } else { "#999" };
        let fill = if p.candidate_first { "white" } else { color };
        let _ = writeln!(
            s,
            r#"<circle class="pair" cx="{:.1}" cy="{:.1}" r="4" stroke="{color}" fill="{fill}"><title>pair {} {:.4}</title></circle>"#,
            f.x(i as f64 + 1.0),
            f.y(p.score),
            i + 1,
            p.score
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="{L}" y="{:.1}" fill="#555">filled: baseline ran first · hollow: candidate first · grey: not accepted · band: 95 % CI</text>"##,
        T - 4.0
    );
    s.push_str("</svg>\n");
    s
}

/// The transfer ledger: each row's local score (x, the solver's machine) against the arena's
/// ranked score (y), each with its 95 % interval as an error bar (horizontal: local; vertical:
/// ranked), and the line y = x where a measurement transfers as it was. Below the line, the
/// solver's machine promised more than the arena found. The row `this` (a submission's own
/// page) is drawn larger, in orange. Both axes share one scale, so the line is the diagonal.
pub fn ledger(rows: &[LedgerRow], this: Option<&str>) -> String {
    let mut s = String::new();
    open(
        &mut s,
        "Local against ranked",
        "transfer ledger: each submission's local score against the arena's, with intervals and y = x",
    );
    let vals = rows
        .iter()
        .flat_map(|r| {
            [r.local.score, r.ranked_score]
                .into_iter()
                .chain(r.local.ci95)
                .chain(r.ranked_ci95.into_iter().flatten())
        })
        .filter(|v| v.is_finite())
        .chain([1.0]);
    let (lo, hi) = vals.fold((f64::MAX, f64::MIN), |(a, b), v| (a.min(v), b.max(v)));
    let pad = ((hi - lo) * 0.08).max(0.02);
    let (lo, hi) = ((lo - pad).max(0.0), hi + pad);
    let f = Frame {
        x0: lo,
        x1: hi,
        y0: lo,
        y1: hi,
    };
    y_axis(&mut s, &f, "ranked score (the arena's, ×)");
    x_axis(&mut s, "local score (the solver's machine, ×)");
    let (xt, dec) = ticks(lo, hi, 6);
    for t in xt {
        let x = f.x(t);
        let _ = writeln!(
            s,
            r#"<line x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{:.1}" stroke="black"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{t:.dec$}</text>"#,
            H - B,
            H - B + 5.0,
            H - B + 18.0
        );
    }
    let _ = writeln!(
        s,
        r##"<line class="identity" x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#444" stroke-dasharray="5 4"/><text x="{:.1}" y="{:.1}" fill="#444">y = x</text>"##,
        f.x(lo),
        f.y(lo),
        f.x(hi),
        f.y(hi),
        f.x(hi) + 6.0,
        f.y(hi) + 4.0
    );
    for r in rows {
        let mine = this == Some(r.submission.as_str());
        let color = if mine { "#e67300" } else { "#06c" };
        let (x, y) = (f.x(r.local.score), f.y(r.ranked_score));
        let [a, b] = r.local.ci95;
        let _ = writeln!(
            s,
            r#"<line class="local-ci" x1="{:.1}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="{color}"/>"#,
            f.x(a),
            f.x(b)
        );
        if let Some([a, b]) = r.ranked_ci95 {
            let _ = writeln!(
                s,
                r#"<line class="ranked-ci" x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{:.1}" stroke="{color}"/>"#,
                f.y(a),
                f.y(b)
            );
        }
        let ranked_ci = r
            .ranked_ci95
            .map(|[a, b]| format!(" [{a:.4}, {b:.4}]"))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            r#"<circle class="{}" cx="{x:.1}" cy="{y:.1}" r="{}" fill="{color}"><title>{} by {}: local {:.4} [{:.4}, {:.4}] on {}; ranked {:.4}{ranked_ci} ({})</title></circle>"#,
            if mine { "ledger this" } else { "ledger" },
            if mine { 6 } else { 4 },
            esc(&r.submission),
            esc(&r.solver),
            r.local.score,
            a,
            b,
            esc(&r.local.machine_line()),
            r.ranked_score,
            esc(&r.status)
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="{L}" y="{:.1}" fill="#555">bars: 95 % CIs (across: local, up: ranked) · below the line: the local machine promised more</text>"##,
        T - 4.0
    );
    if this.is_some() {
        let _ = writeln!(
            s,
            r##"<g transform="translate({:.1} {T})"><circle r="6" fill="#e67300"/><text x="9" y="4">this one</text><circle cy="18" r="4" fill="#06c"/><text x="9" y="22">others</text></g>"##,
            W - R + 8.0
        );
    }
    s.push_str("</svg>\n");
    s
}

/// The most launches a timeline's waterfall draws (the earliest).
pub const WATERFALL_MAX: usize = 300;

/// A profile's per-op times as horizontal bars, the busiest first, each with its value and
/// calls (`unit`: `ms/token`, `ms/prefill`). Drawn here from the parsed numbers; every name
/// escaped (they are in a safe charset already).
pub fn profile_ops(title: &str, unit: &str, ops: &[OpTime]) -> String {
    let (w, left, right, row) = (W, 230.0, 150.0, 18.0);
    let h = T + 20.0 + row * ops.len().max(1) as f64;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{}" font-family="sans-serif" font-size="12">"#,
        esc(title)
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="8" y="22" font-size="14" font-weight="bold">{} ({})</text>"#,
        esc(title),
        esc(unit)
    );
    let max = ops.iter().map(|o| o.ms).fold(0.0, f64::max);
    let total: f64 = ops.iter().map(|o| o.ms).sum();
    if ops.is_empty() {
        let _ = writeln!(
            s,
            r#"<text x="8" y="{:.1}">no per-op times</text>"#,
            T + 14.0
        );
    }
    for (i, o) in ops.iter().enumerate() {
        let y = T + row * i as f64;
        let bw = if max > 0.0 {
            (w - left - right) * o.ms / max
        } else {
            0.0
        };
        let share = if total > 0.0 {
            100.0 * o.ms / total
        } else {
            0.0
        };
        let _ = writeln!(
            s,
            r##"<g class="op"><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text><rect x="{left}" y="{:.1}" width="{bw:.1}" height="{:.1}" fill="#4477aa"/><text x="{:.1}" y="{:.1}">{:.4} ({share:.1} %, {:.0} calls)</text></g>"##,
            left - 6.0,
            y + 13.0,
            esc(&o.op),
            y + 3.0,
            row - 5.0,
            left + bw + 6.0,
            y + 13.0,
            o.ms,
            o.calls
        );
    }
    s.push_str("</svg>\n");
    s
}

/// A timeline's launches as a waterfall: one row per launch (the earliest `WATERFALL_MAX`),
/// a bar from its first block's start to its last block's end, on a µs axis; kernel names from
/// the arena's own table, escaped.
pub fn waterfall(t: &Timeline) -> String {
    let shown = &t.launches[..t.launches.len().min(WATERFALL_MAX)];
    let (w, left, right, row) = (W, 200.0, 30.0, 12.0);
    let h = T + 40.0 + row * shown.len().max(1) as f64;
    let end = shown.iter().map(|l| l.end_us).fold(0.0, f64::max).max(1e-3);
    let x = |us: f64| left + (w - left - right) * us / end;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="kernel timeline of two decode steps" font-family="sans-serif" font-size="10">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let more = t.launches.len() - shown.len() + t.left_out;
    let _ = writeln!(
        s,
        r#"<text x="8" y="22" font-size="14" font-weight="bold">Kernel timeline of two decode steps ({} launches{})</text>"#,
        shown.len(),
        if more > 0 {
            format!(", {more} more not drawn")
        } else {
            String::new()
        }
    );
    let (ticks, dec) = ticks(0.0, end, 6);
    for tk in ticks {
        let _ = writeln!(
            s,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{T}" y2="{1:.1}" stroke="#eee"/><text x="{0:.1}" y="{2:.1}" text-anchor="middle">{tk:.dec$} µs</text>"##,
            x(tk),
            h - 30.0,
            h - 16.0
        );
    }
    for (i, l) in shown.iter().enumerate() {
        let y = T + row * i as f64;
        let _ = writeln!(
            s,
            r##"<g class="launch"><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text><rect x="{:.2}" y="{:.1}" width="{:.2}" height="{:.1}" fill="#cc6677"><title>{} blocks, {:.2}–{:.2} µs</title></rect></g>"##,
            left - 6.0,
            y + 9.0,
            esc(&l.kernel),
            x(l.start_us),
            y + 2.0,
            (x(l.end_us) - x(l.start_us)).max(0.5),
            row - 3.0,
            l.blocks,
            l.start_us,
            l.end_us
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{LocalMachine, LocalResult};

    fn ledger_row(id: &str, solver: &str, local: f64, ranked: f64, machine: &str) -> LedgerRow {
        LedgerRow {
            submission: id.into(),
            solver: solver.into(),
            track: "serial-tiny".into(),
            mode: crate::api::Mode::Leaderboard,
            local: LocalResult {
                score: local,
                ci95: [local - 0.02, local + 0.03],
                pairs: 12,
                track: "serial".into(),
                machine: LocalMachine {
                    cpu_model: Some(machine.into()),
                    ..Default::default()
                },
            },
            ranked_score: ranked,
            ranked_ci95: Some([ranked - 0.01, ranked + 0.01]),
            status: "held".into(),
            created_ms: 0,
        }
    }

    /// The numbers of attribute `name` in `svg`'s elements whose class is `class`.
    fn attrs(svg: &str, class: &str, name: &str) -> Vec<f64> {
        svg.lines()
            .flat_map(|l| l.split('<'))
            .filter(|e| e.contains(&format!("class=\"{class}\"")))
            .filter_map(|e| {
                let v = e.split(&format!(" {name}=\"")).nth(1)?;
                v.split('"').next()?.parse().ok()
            })
            .collect()
    }

    #[test]
    fn the_ledger_draws_each_point_its_intervals_and_the_diagonal_escaping_machines() {
        let rows = vec![
            ledger_row("s-1", "alice", 1.20, 1.05, "AMD EPYC 7B13"),
            ledger_row(
                "s-2",
                "<b>bob</b>",
                1.10,
                1.11,
                "<script>alert(1)</script> & \"Xeon\"",
            ),
        ];
        let svg = ledger(&rows, Some("s-2"));
        assert_eq!(svg.matches("<circle class=\"ledger").count(), 2, "{svg}");
        assert_eq!(svg.matches("class=\"local-ci\"").count(), 2);
        assert_eq!(svg.matches("class=\"ranked-ci\"").count(), 2);
        assert_eq!(svg.matches("class=\"ledger this\"").count(), 1);
        // The line y = x: from the scale's corner to its corner, the same value on both axes.
        let (x1, y1) = (
            attrs(&svg, "identity", "x1")[0],
            attrs(&svg, "identity", "y1")[0],
        );
        let (x2, y2) = (
            attrs(&svg, "identity", "x2")[0],
            attrs(&svg, "identity", "y2")[0],
        );
        assert!((x1 - L).abs() < 0.2 && (y1 - (H - B)).abs() < 0.2, "{svg}");
        assert!((x2 - (W - R)).abs() < 0.2 && (y2 - T).abs() < 0.2, "{svg}");
        // A point above its local score's x by as much as its ranked score is below: the first
        // (local 1.20, ranked 1.05) lies below the diagonal, the second on it.
        let (cx, cy) = (attrs(&svg, "ledger", "cx"), attrs(&svg, "ledger", "cy"));
        let on_diagonal = |x: f64, y: f64| (x - L) / (W - L - R) + (y - T) / (H - T - B);
        assert!(on_diagonal(cx[0], cy[0]) > 1.05, "{cx:?} {cy:?}");
        assert!((on_diagonal(x2, y2) - 1.0).abs() < 1e-3);
        // The local interval spans the point's x; the ranked one its y.
        let (lx1, lx2) = (attrs(&svg, "local-ci", "x1"), attrs(&svg, "local-ci", "x2"));
        assert!(lx1[0] < cx[0] && cx[0] < lx2[0]);
        let (ry1, ry2) = (
            attrs(&svg, "ranked-ci", "y1"),
            attrs(&svg, "ranked-ci", "y2"),
        );
        assert!(ry2[0] < cy[0] && cy[0] < ry1[0]);
        // Hostile names and machines are text, never markup.
        assert!(!svg.contains("<script") && !svg.contains("<b>"), "{svg}");
        assert!(svg.contains("&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;Xeon&quot;"));
        assert!(svg.contains("by &lt;b&gt;bob&lt;/b&gt;"));
        // No rows: axes and the diagonal, no point.
        let empty = ledger(&[], None);
        assert!(empty.contains("class=\"identity\"") && !empty.contains("class=\"ledger"));
    }

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        let (t, d) = ticks(0.93, 1.58, 6);
        assert_eq!(d, 1);
        assert!((t[0] - 1.0).abs() < 1e-12, "{t:?}");
        assert!(t.iter().all(|v| (0.93..=1.58).contains(v)), "{t:?}");
        let (t, d) = ticks(0.0, 1.0, 4);
        assert_eq!((t.len(), d), (5, 2), "{t:?}");
        assert!((t[1] - 0.25).abs() < 1e-12);
    }

    #[test]
    fn time_ticks_fall_on_whole_minutes_and_hours() {
        let t0 = 1_000_000_000_000; // 2001-09-09 01:46:40 UTC
        let t = time_ticks(t0, t0 + 5 * 60_000);
        assert!(t.iter().all(|v| v % 60_000 == 0) && t.len() >= 4, "{t:?}");
        let t = time_ticks(t0, t0 + 6 * 3_600_000);
        assert!(
            t.iter().all(|v| v % 3_600_000 == 0) && t.len() >= 5,
            "{t:?}"
        );
    }

    #[test]
    fn dates_are_utc_calendar_dates() {
        assert_eq!(datetime(0), "1970-01-01 00:00 UTC");
        // 2000-02-29 12:34 UTC, a leap day.
        assert_eq!(datetime(951_827_640_000), "2000-02-29 12:34 UTC");
        assert_eq!(datetime(1_798_761_599_000), "2026-12-31 23:59 UTC");
        assert_eq!(datetime_seconds(1_798_761_599_000), "2026-12-31 23:59:59");
    }

    #[test]
    fn the_frontier_draws_each_promotion_and_escapes_names() {
        let p = |seq, score, t, who: Option<&str>| FrontierPoint {
            seq,
            submission: who.map(|w| format!("s-{w}")),
            solver: who.map(str::to_string),
            score,
            created_ms: t,
        };
        let pts = [
            p(0, 1.0, 1_000_000, None),
            p(1, 1.4, 2_000_000, Some("alice")),
            p(2, 1.6, 3_000_000, Some("<b>")),
        ];
        let row = |id: &str, score, status: &str| LeaderboardRow {
            rank: 0,
            submission: id.to_string(),
            solver: "x".into(),
            model: None,
            score,
            rank_score: score,
            ci95: None,
            gain: None,
            gap_to_above: None,
            status: status.into(),
            created_ms: 2_500_000,
        };
        // The promoted ones are their promotions' points only; the held one is an entry.
        let ranked = [
            row("s-<b>", 1.6, "promoted"),
            row("s-held", 1.3, "held"),
            row("s-alice", 1.4, "promoted"),
        ];
        let svg = frontier(&pts, &ranked, 4_000_000);
        assert_eq!(svg.matches(r#"class="promotion""#).count(), 3);
        assert_eq!(svg.matches(r#"class="entry""#).count(), 1, "{svg}");
        assert!(svg.contains("<title>s-held 1.3000</title>"));
        assert!(svg.contains("alice 1.400"));
        assert!(svg.contains("&lt;b&gt;") && !svg.contains("<b>"));
        assert!(svg.contains("score (speed-up over the pinned baseline, ×)"));
        assert!(svg.contains("time (UTC)"));
        // The record line climbs twice: two vertical moves.
        assert_eq!(svg.matches(" V").count(), 2, "{svg}");
    }

    #[test]
    fn the_pairs_plot_marks_order_and_acceptance() {
        let pp = |score, accepted, candidate_first| PairPoint {
            score,
            accepted,
            candidate_first,
        };
        let svg = pairs(
            "Pairs of the pricing",
            &[
                pp(1.02, true, false),
                pp(0.98, true, true),
                pp(0.5, false, false),
            ],
            Some(1.0),
            Some([0.97, 1.03]),
            0.95,
        );
        assert_eq!(svg.matches(r#"class="pair""#).count(), 3);
        assert!(
            svg.contains(r##"stroke="#06c" fill="white""##),
            "hollow: candidate first"
        );
        assert!(
            svg.contains(r##"stroke="#999" fill="#999""##),
            "grey: not accepted"
        );
        assert!(svg.contains("floor 0.950") && svg.contains("score 1.000"));
        assert!(svg.contains("pair (in the order run)"));
    }

    /// The y of each reference label (`name value`) in `svg`, in the order drawn.
    fn label_ys(svg: &str) -> Vec<(String, f64)> {
        svg.lines()
            .filter_map(|l| {
                let t = &l[l.find(r#"<text class="reference""#)?..];
                let y = t.split(" y=\"").nth(1)?.split('"').next()?.parse().ok()?;
                let name = t.split('>').nth(1)?.split('<').next()?.to_string();
                Some((name, y))
            })
            .collect()
    }

    #[test]
    fn reference_labels_never_overlap_even_when_their_lines_nearly_meet() {
        let pp = |score| PairPoint {
            score,
            accepted: true,
            candidate_first: false,
        };
        // Pairs spread from 0.45 to 1.5 put 1.0, the floor and a score between them a few
        // pixels apart; and the floor at the plot's bottom edge pushes labels upward.
        for (floor, score) in [(0.95, 0.97), (0.95, 1.0), (0.99, 0.995), (0.45, 0.451)] {
            let svg = pairs(
                "t",
                &[pp(0.45), pp(1.5), pp(0.97)],
                Some(score),
                Some([score - 0.01, score + 0.01]),
                floor,
            );
            let mut ys = label_ys(&svg);
            assert_eq!(ys.len(), 3, "{svg}");
            ys.sort_by(|a, b| a.1.total_cmp(&b.1));
            for w in ys.windows(2) {
                assert!(
                    w[1].1 - w[0].1 >= 14.0,
                    "floor {floor}, score {score}: {ys:?}"
                );
            }
            assert!(ys.iter().all(|y| y.1 <= H - B + 4.0 && y.1 >= T), "{ys:?}");
        }
    }
    #[test]
    fn a_profile_is_drawn_from_its_numbers_with_names_escaped() {
        let ops = vec![
            OpTime {
                op: "moe".into(),
                ms: 2.0,
                calls: 4.0,
            },
            OpTime {
                op: "<script>".into(),
                ms: 1.0,
                calls: 1.0,
            },
        ];
        let svg = profile_ops("Decode step", "ms/token", &ops);
        assert_eq!(svg.matches(r#"class="op""#).count(), 2);
        assert!(
            svg.contains("&lt;script&gt;") && !svg.contains("<script"),
            "{svg}"
        );
        assert!(svg.contains("66.7 %"), "{svg}");
        let t = Timeline {
            launches: (0..WATERFALL_MAX + 5)
                .map(|i| crate::profile::Launch {
                    kernel: "gemv_bf16".into(),
                    start_us: i as f64,
                    end_us: i as f64 + 0.5,
                    blocks: 2,
                })
                .collect(),
            kernels: vec![],
            left_out: 7,
        };
        let svg = waterfall(&t);
        assert_eq!(svg.matches(r#"class="launch""#).count(), WATERFALL_MAX);
        assert!(svg.contains("12 more not drawn"), "{svg}");
    }
}
