//! The clock: paired pricing of a candidate build against a pinned baseline build (`price`), with
//! quiescence checks and window telemetry (`telemetry`), the statistics (`stats`), the plot
//! (`plot`) and the pinned baseline built from git (`baseline`).

pub mod baseline;
pub mod plot;
pub mod price;
pub mod stats;
pub mod telemetry;
