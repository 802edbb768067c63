//! `fastdecode timeline`: what each kernel adds to a traced decode step (`bench --trace`), and
//! the step as an SVG waterfall.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
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
    /// Microseconds of the timeline to draw (more than 0, at most 100000).
    #[arg(long, allow_negative_numbers = true, default_value_t = 300.0, value_parser = window_us)]
    window: f64,
}

/// The drawing has a tick every 10 µs: a window bounds its size.
fn window_us(s: &str) -> std::result::Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if !(v > 0.0 && v <= 100_000.0) {
        return Err(format!("{s} is not in (0, 100000] microseconds"));
    }
    Ok(v)
}

pub fn run(a: TimelineArgs) -> Result<()> {
    if let Some(svg) = &a.svg {
        crate::common::outputs_apart(&[("--svg", svg)], &[("trace", &a.trace)])?;
        fastdecode_model::files::check_output_file(svg).context("--svg")?;
    }
    // A FIFO or a device given as the trace must not hang or stream forever, nor a huge file
    // fill memory.
    let len = fastdecode_model::files::open_regular(&a.trace)?
        .metadata()
        .map_err(|e| fastdecode_model::Error::io(&a.trace, e))?
        .len();
    if len > fastdecode_model::files::MAX_TEXT_BYTES {
        bail!("{}: {len} bytes, larger than any trace", a.trace.display());
    }
    let recs = timeline::read_csv(&a.trace)?;
    out!("{}", timeline::table(&timeline::costs(&recs)))?;
    if let Some(svg) = &a.svg {
        let text = timeline::waterfall_svg(&timeline::launches(&recs), a.window);
        crate::common::write_file(svg, &text)?;
    }
    Ok(())
}
