//! The metrics a pricing keeps on the record (the clock's result, under the original challenge's
//! names), each with what it means, and how a person reads one: the runner copies these keys,
//! `submit`'s table and the pages print them with `text`, the pages with the meaning beside.

/// (key in the clock's result, what it means), in the order shown.
pub const METRICS: &[(&str, &str)] = &[
    ("score", "The speed-up over the baseline: the baseline's mean window time over the candidate's (above 1 is faster)."),
    ("ci95", "The score's 95 % confidence interval."),
    ("half_width", "Half the interval's width, relative to the score: the precision reached."),
    ("floor", "A change fails as slower when its whole interval is below this score, and is inconclusive while its interval straddles it."),
    ("stopping_reason", "Why the clock stopped adding pairs: the target precision reached, or a budget of pairs, time or attempts spent."),
    ("pairs_used", "Pairs that entered the score."),
    ("accepted_pair_count", "Pairs whose windows were all quiet enough to count."),
    ("attempted_pair_count", "Pairs run, counted or not."),
    ("elapsed_seconds", "The pricing's wall-clock time, start-ups included."),
    ("ratio_of_means", "The score, under the original challenge's name."),
    ("raw_ratio_of_means", "DFlash: the baseline's serial window over the candidate's DFlash window, before the no-op's reference divides it out."),
    ("noop_reference", "DFlash: the same ratio for the unchanged engine, so that the score credits only the change."),
    ("median", "The median of the pairs' own scores."),
    ("min", "The lowest of the pairs' own scores."),
    ("baseline_seconds_per_token", "The baseline's mean window per emitted token, prefill included."),
    ("candidate_seconds_per_token", "The candidate's mean window per emitted token, prefill included."),
    ("noop_seconds_per_token", "DFlash: the unchanged engine's mean window per emitted token."),
    ("prompt_tokens", "Tokens of each window's prompt."),
    ("decode_tokens", "Tokens each window decodes."),
    ("block_size", "DFlash: tokens drafted and verified per round."),
    ("robust_statistic", "How each phase's windows become one time."),
    ("ci_method", "How the interval is computed."),
];

/// A metric as a person reads it, in `submit`'s table and on the pages: a count as an integer
/// (`30`, though it came as `30.0`), any other number to four significant digits, an interval as
/// `[1.823, 2.152]`.
pub fn text(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Number(n) if n.is_i64() || n.is_u64() => n.to_string(),
        Value::Number(n) => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            if f.fract() == 0.0 && f.abs() < 1e15 {
                format!("{f:.0}")
            } else {
                let magnitude = f.abs().log10().floor() as i64;
                format!("{f:.*}", (3 - magnitude).clamp(0, 12) as usize)
            }
        }
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(text).collect::<Vec<_>>().join(", ")
        ),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn metrics_read_as_counts_and_rounded_figures() {
        for (value, want) in [
            (json!(30), "30"),
            (json!(30.0), "30"),
            (json!(1.823430539285372), "1.823"),
            (json!(0.000123456), "0.0001235"),
            (json!(2345.67), "2346"),
            (json!(-0.5), "-0.5000"),
            (
                json!([1.823430539285372, 2.152118391512025]),
                "[1.823, 2.152]",
            ),
            (json!("ratio"), "ratio"),
        ] {
            assert_eq!(text(&value), want, "{value}");
        }
    }

    #[test]
    fn every_metric_is_explained_in_a_sentence() {
        assert!(METRICS.iter().all(|m| m.1.ends_with('.')));
    }
}
