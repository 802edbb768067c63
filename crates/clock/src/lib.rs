//! The clock: paired pricing of a candidate build against a pinned baseline build (`price`): the
//! noise model and each phase's robust statistic (`noise`), the score, its interval and when to
//! stop adding pairs (`score`), the interval (`stats`), quiescence checks and window telemetry
//! (`telemetry`), the plot (`plot`) and the pinned baseline built from git (`baseline`).

pub mod baseline;
pub mod noise;
pub mod plot;
pub mod price;
pub mod score;
pub mod stats;
pub mod telemetry;
