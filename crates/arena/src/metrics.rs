//! The metrics a pricing keeps on the record (the clock's result, under the original challenge's
//! names), each with what it means: the runner copies these keys, the pages show them as a table
//! with the meaning beside each value.

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

/// What the metric `key` means; an empty string for a key this version does not know (an older
/// record's).
pub fn meaning(key: &str) -> &'static str {
    METRICS.iter().find(|m| m.0 == key).map_or("", |m| m.1)
}
