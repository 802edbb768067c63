//! Per-kernel time breakdown: CUDA events recorded between the ops of a forward, so each op's
//! device time is the gap between its event and the previous one (launch gaps included).

use std::collections::BTreeMap;

use cudarc::driver::{sys::CUevent_flags, CudaEvent, CudaStream};

use crate::error::Result;

#[derive(Default)]
pub struct Profiler {
    pending: Vec<(&'static str, CudaEvent)>,
    /// op name → (milliseconds, launches)
    pub totals: BTreeMap<&'static str, (f64, usize)>,
}

impl Profiler {
    /// Records an event after the op `name` (use "start" first).
    pub fn mark(&mut self, name: &'static str, stream: &CudaStream) -> Result<()> {
        let ev = stream
            .context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        ev.record(stream)?;
        self.pending.push((name, ev));
        Ok(())
    }

    /// Waits for the recorded events and adds the gaps between them to the totals.
    pub fn collect(&mut self) -> Result<()> {
        if let Some((_, last)) = self.pending.last() {
            last.synchronize()?;
        }
        for w in self.pending.windows(2) {
            let ms = w[0].1.elapsed_ms(&w[1].1)? as f64;
            let e = self.totals.entry(w[1].0).or_default();
            e.0 += ms;
            e.1 += 1;
        }
        self.pending.clear();
        Ok(())
    }
}

/// Marks the end of the op `name` when a forward is being profiled; nothing otherwise.
pub fn mark(prof: &mut Option<Profiler>, name: &'static str, stream: &CudaStream) -> Result<()> {
    match prof {
        Some(p) => p.mark(name, stream),
        None => Ok(()),
    }
}

/// Runs `f` as the range that a profiler started with `--profile-from-start off` records (Nsight
/// Compute: `ncu --profile-from-start off`), so a profile of the bench can take the DFlash rounds
/// alone instead of the thousands of one-row launches before them. Without a profiler attached
/// both calls do nothing, so their results are ignored.
pub fn profiled_range<T>(f: impl FnOnce() -> T) -> T {
    // SAFETY: neither call takes arguments; they act on the current context, which `Gpu` made.
    let _ = unsafe { cudarc::driver::sys::cuProfilerStart() };
    let out = f();
    let _ = unsafe { cudarc::driver::sys::cuProfilerStop() };
    out
}
