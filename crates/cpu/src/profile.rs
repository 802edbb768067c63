//! Per-op wall time of the CPU forward (`fastdecode bench --profile`): while a thread has
//! `start`ed, each op of `TargetModel::forward` adds its time and a count under its name; `take`
//! returns the totals and stops. Off, an op costs one thread-local look.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Instant;

/// Op name → (milliseconds, calls).
pub type Totals = BTreeMap<&'static str, (f64, usize)>;

thread_local! {
    static TOTALS: RefCell<Option<Totals>> = const { RefCell::new(None) };
}

/// Starts (or restarts) this thread's totals.
pub fn start() {
    TOTALS.with(|t| *t.borrow_mut() = Some(Totals::new()));
}

/// This thread's totals since `start` (empty if none), and stops.
pub fn take() -> Totals {
    TOTALS.with(|t| t.borrow_mut().take().unwrap_or_default())
}

/// Runs `f`, adding its time to `name` while this thread is profiled.
pub fn timed<T>(name: &'static str, f: impl FnOnce() -> T) -> T {
    if TOTALS.with(|t| t.borrow().is_none()) {
        return f();
    }
    let t0 = Instant::now();
    let out = f();
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    TOTALS.with(|t| {
        if let Some(m) = t.borrow_mut().as_mut() {
            let e = m.entry(name).or_default();
            e.0 += ms;
            e.1 += 1;
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_are_counted_only_between_start_and_take() {
        assert_eq!(timed("x", || 1), 1);
        assert!(take().is_empty());
        start();
        timed("a", || ());
        timed("a", || ());
        timed("b", || ());
        let t = take();
        assert_eq!((t["a"].1, t["b"].1), (2, 1));
        timed("a", || ());
        assert!(take().is_empty());
    }
}
