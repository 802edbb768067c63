//! An SVG plot of every pair of a priced run: each pair's score (filled when the baseline ran
//! first, hollow when the candidate did; grey when the pair was not accepted), with the overall
//! score, its 95 % interval, 1.0 and the floor.

use std::fmt::Write;

use crate::price::PriceResult;

pub fn svg(r: &PriceResult) -> String {
    let (w, h, m) = (720.0, 360.0, 50.0);
    let scores: Vec<(usize, f64, bool, bool)> = r
        .pairs
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            p.score
                .or_else(|| raw_score(r, i))
                .map(|s| (i, s, p.accepted, p.candidate_first))
        })
        .collect();
    let mut lo = r.floor.min(1.0) - 0.05;
    let mut hi = 1.05f64;
    for &(_, s, _, _) in &scores {
        lo = lo.min(s);
        hi = hi.max(s);
    }
    if let Some([a, b]) = r.ci95 {
        lo = lo.min(a);
        hi = hi.max(b);
    }
    let n = r.pairs.len().max(1) as f64;
    let x = |i: f64| m + (w - 2.0 * m) * (i + 0.5) / n;
    let y = |v: f64| h - m - (h - 2.0 * m) * (v - lo) / (hi - lo).max(1e-9);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    if let Some([a, b]) = r.ci95 {
        let _ = writeln!(
            s,
            r##"<rect x="{m}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#cfe3ff"/>"##,
            y(b),
            w - 2.0 * m,
            (y(a) - y(b)).max(1.0)
        );
    }
    let line = |s: &mut String, v: f64, color: &str, label: &str| {
        let _ = writeln!(
            s,
            r#"<line x1="{m}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="{color}" stroke-dasharray="4 3"/>"#,
            w - m,
            y(v),
            y(v)
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" fill="{color}">{label} {v:.3}</text>"#,
            w - m + 4.0,
            y(v) + 4.0
        );
    };
    line(&mut s, 1.0, "#444", "1.0");
    line(&mut s, r.floor, "#c00", "floor");
    if let Some(v) = r.score {
        line(&mut s, v, "#06c", "score");
    }
    for &(i, v, accepted, cand_first) in &scores {
        let color = if accepted { "#06c" } else { "#999" };
        let fill = if cand_first { "white" } else { color };
        let _ = writeln!(
            s,
            r#"<circle cx="{:.1}" cy="{:.1}" r="4" stroke="{color}" fill="{fill}"/>"#,
            x(i as f64),
            y(v)
        );
    }
    let _ = writeln!(
        s,
        r#"<line x1="{m}" x2="{m}" y1="{m}" y2="{:.1}" stroke="black"/>"#,
        h - m
    );
    let _ = writeln!(
        s,
        r#"<line x1="{m}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="black"/>"#,
        w - m,
        h - m,
        h - m
    );
    let _ = writeln!(
        s,
        r#"<text x="{m}" y="{:.1}">{lo:.3}</text><text x="{m}" y="{:.1}">{hi:.3}</text>"#,
        h - m + 16.0,
        m - 6.0
    );
    let _ = writeln!(
        s,
        r#"<text x="{m}" y="20">{} track: per-pair score (filled: baseline first, hollow: candidate first, grey: not accepted); band: 95 % CI</text>"#,
        format!("{:?}", r.track).to_lowercase()
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">pair</text>"#,
        w / 2.0,
        h - 12.0
    );
    s.push_str("</svg>\n");
    s
}

/// The score of a pair that was not accepted (for the plot only).
fn raw_score(r: &PriceResult, i: usize) -> Option<f64> {
    use crate::price::{Role, Track};
    let p = &r.pairs[i];
    let get = |role: Role| p.phases.iter().find(|x| x.role == role);
    let reference = match r.track {
        Track::Serial => get(Role::Baseline)?,
        Track::Dflash => get(Role::Noop)?,
    };
    let c = get(Role::Candidate)?;
    Some(reference.min_window_seconds / c.min_window_seconds)
}
