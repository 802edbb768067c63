//! `fastdecode timeline`: what each kernel adds to a traced decode step (`bench --trace`), and
//! the step as an SVG waterfall.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::Args;
use fastdecode_cuda::timeline;

#[derive(Args)]
pub struct TimelineArgs {
    /// CSV written by `fastdecode bench --trace`.
    trace: PathBuf,
    /// Also draw the start of the timeline as an SVG waterfall here: a row per launch, pale while
    /// its blocks wait for their predecessor, dark while they run.
    #[arg(long)]
    svg: Option<PathBuf>,
    /// Microseconds of the timeline to draw.
    #[arg(long, default_value_t = 300.0)]
    window: f64,
}

pub fn run(a: TimelineArgs) -> Result<()> {
    if a.window.is_nan() || a.window <= 0.0 {
        bail!("--window must be a positive number of microseconds");
    }
    let recs = timeline::read_csv(&a.trace)?;
    print!("{}", timeline::table(&timeline::costs(&recs)));
    if let Some(svg) = &a.svg {
        let text = timeline::waterfall_svg(&timeline::launches(&recs), a.window);
        crate::common::write_file(svg, &text)?;
    }
    Ok(())
}
