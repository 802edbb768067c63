//! Machine state around and during timed windows: CPU load from `/proc`, and GPU utilisation and
//! temperature through NVML when a GPU is present (NVML is loaded at run time, so machines without
//! one simply report no GPU).
//!
//! Sampling fits the window: the interval is a fraction of the window's expected length, so a short
//! window is sampled faster, and a window is never judged by how many samples it got. The sampler
//! is also the stall guard: a worker that makes no progress (no CPU time, and no GPU activity) for
//! `stall_seconds` is declared stalled.
//!
//! The sampler also reads how long the worker's threads waited on a run queue during the
//! window (`/proc/PID/task/TID/schedstat`, kept by the kernel): time they were ready to run but
//! something else had the CPU. That is the dominant noise of a shared machine (measured on the
//! 2-core development machine: a worker running 66 % of a window's wall time took 1.5 times as
//! long), and a window that waited more than a sliver of its length is marked disturbed. That
//! only decides whether a phase is re-run (none of its windows clean), never the time itself, so
//! a build that inflates its own waits (threads fighting its main thread) cannot gain by it.
//!
//! Of those waits, the clock excuses only what the worker's own tree cannot have caused
//! (`excused_wait`): the run-queue wait of the tree's busiest thread less the CPU time everything
//! else of the tree ran in the window (its other threads and processes, those that exited
//! before the window ended included: a process's CPU clock keeps them). A thread waits for its
//! own siblings only while one of them runs, so what remains was another process's doing; a
//! tree that oversubscribes the CPUs with its own threads has nothing excused.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::Nvml;
use serde::Serialize;

use fastdecode_worker::Tick;

/// Samples aimed at per window; the interval is the expected window length divided by this.
pub const SAMPLES_PER_WINDOW: u32 = 64;
/// Each sample reads two `/proc` files in the parent; on a 2-core machine sampling a short window
/// every 0.2 ms took enough CPU to make the worker itself wait on a run queue.
const MIN_INTERVAL: Duration = Duration::from_millis(2);
const MAX_INTERVAL: Duration = Duration::from_millis(100);

/// The machine a pricing ran on, as `result.json` records it: what a solver's local pricing
/// carries to an arena's transfer ledger (issue 49), to say which machine measured it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Machine {
    /// `/proc/cpuinfo`'s first `model name` (none where it has none).
    pub cpu_model: Option<String>,
    /// Logical CPUs this process may use.
    pub cpus: usize,
    /// The GPUs' names (none without NVML or a GPU).
    pub gpus: Vec<String>,
    /// The candidate worker's backend (`cpu`, `cuda`), once one has started.
    pub backend: Option<String>,
}

impl Machine {
    /// This machine, its backend not yet known.
    pub fn here(t: &Telemetry) -> Machine {
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        });
        Machine {
            cpu_model,
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            gpus: t.gpu_names(),
            backend: None,
        }
    }
}

/// Aggregate CPU jiffies: (busy, total) from the first line of `/proc/stat`.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let v: Vec<u64> = text
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    if v.len() < 5 {
        return None;
    }
    let total: u64 = v.iter().sum();
    let idle = v[3] + v[4];
    Some((total - idle, total))
}

/// The processes of the tree rooted at `pid`: it and all its descendants. A sandboxed worker is
/// a grandchild of the process its parent spawned (the sandbox's own processes idle above it),
/// so what the clock observes of a worker is its whole tree.
pub fn process_tree(pid: u32) -> Vec<u32> {
    let mut children: std::collections::HashMap<u32, Vec<u32>> = Default::default();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(pp) = std::fs::read_to_string(format!("/proc/{p}/stat"))
            .ok()
            .and_then(|s| parent_of(&s))
        {
            children.entry(pp).or_default().push(p);
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        tree.extend(children.get(&tree[i]).into_iter().flatten());
        i += 1;
    }
    tree
}

/// The parent pid in a `/proc/PID/stat` line (the field after the state, past the command name,
/// which may hold spaces and parentheses).
fn parent_of(stat: &str) -> Option<u32> {
    stat[stat.rfind(')')? + 2..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Seconds run and seconds waited on a run queue by every thread of every process of `tree`
/// (`/proc/PID/task/TID/schedstat`: nanoseconds); `None` where the kernel keeps no schedstat.
fn tree_schedstat(tree: &[u32]) -> Option<(f64, f64)> {
    let (mut run, mut wait, mut any) = (0u64, 0u64, false);
    for pid in tree {
        for t in std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) else {
                continue;
            };
            let mut f = s.split_whitespace().map(|x| x.parse::<u64>().ok());
            if let (Some(Some(r)), Some(Some(w))) = (f.next(), f.next()) {
                (run, wait, any) = (run + r, wait + w, true);
            }
        }
    }
    any.then_some((run as f64 * 1e-9, wait as f64 * 1e-9))
}

/// Seconds the threads of `pid`'s process tree have waited on a run queue; `None` where the
/// kernel does not keep it.
pub fn runqueue_wait_seconds(pid: u32) -> Option<f64> {
    tree_schedstat(&process_tree(pid)).map(|(_, w)| w)
}

/// CPU time the processes of `tree` have run, in seconds: schedstat, else `stat`'s ticks.
fn tree_cpu_seconds(tree: &[u32]) -> Option<f64> {
    if let Some((run, _)) = tree_schedstat(tree) {
        return Some(run);
    }
    let mut ticks = None;
    for pid in tree {
        let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
        let Some(rest) = s.rfind(')').map(|i| &s[i + 2..]) else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        let t = f.get(11).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0)
            + f.get(12).and_then(|x| x.parse::<u64>().ok()).unwrap_or(0);
        ticks = Some(ticks.unwrap_or(0) + t);
    }
    ticks.map(|t| t as f64 / 100.0)
}

/// A process's CPU time in nanoseconds by its CPU clock (`clock_getcpuclockid`): every thread it
/// ever had, those that have exited included. `None` once it is gone.
fn process_cpu_ns(pid: u32) -> Option<u64> {
    let mut clock: libc::clockid_t = 0;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: both pointers are to live locals of the types the calls write.
    unsafe {
        if libc::clock_getcpuclockid(pid as libc::pid_t, &mut clock) != 0
            || libc::clock_gettime(clock, &mut ts) != 0
        {
            return None;
        }
    }
    Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// The CPU ticks of a process's reaped children (`/proc/PID/stat`'s cutime + cstime).
fn reaped_children_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<u64> = s[s.rfind(')')? + 2..]
        .split_whitespace()
        .skip(13)
        .take(2)
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    Some(f.iter().sum())
}

/// A worker tree's CPU accounts at one instant, read at a window's two ends for its excused wait
/// (`excused_wait`): every thread's run and run-queue wait (schedstat, nanoseconds) and every
/// process's CPU clock with its reaped children's ticks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TreeAccounts {
    /// Thread id → (run, run-queue wait), nanoseconds.
    pub threads: HashMap<u32, (u64, u64)>,
    /// Process id → (CPU clock nanoseconds, reaped children's CPU ticks).
    pub processes: HashMap<u32, (u64, u64)>,
    /// Whether every process whose threads were read had its clock read too: else some of the
    /// tree's CPU time is out of sight.
    pub complete: bool,
}

impl TreeAccounts {
    /// The accounts of the processes `tree`; `None` where the kernel keeps no schedstat.
    pub fn read(tree: &[u32]) -> Option<TreeAccounts> {
        let mut a = TreeAccounts {
            complete: true,
            ..Default::default()
        };
        for &pid in tree {
            // The clock first: a thread that exits after it is read is in the clock and in no
            // schedstat, as one that exits before.
            let clock = match (process_cpu_ns(pid), reaped_children_ticks(pid)) {
                (Some(c), Some(k)) => {
                    a.processes.insert(pid, (c, k));
                    true
                }
                _ => false,
            };
            let threads = a.threads.len();
            for t in std::fs::read_dir(format!("/proc/{pid}/task"))
                .into_iter()
                .flatten()
                .flatten()
            {
                let Some(tid) = t.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                    continue;
                };
                let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) else {
                    continue;
                };
                let mut f = s.split_whitespace().map(|x| x.parse::<u64>().ok());
                if let (Some(Some(r)), Some(Some(w))) = (f.next(), f.next()) {
                    a.threads.insert(tid, (r, w));
                }
            }
            // A process gone before its clock was read has no threads left to read either.
            a.complete &= clock || a.threads.len() == threads;
        }
        (!a.threads.is_empty()).then_some(a)
    }

    /// From `self` (a window's start) to `end` (its end): each thread's (run, run-queue wait)
    /// seconds, a thread born in the window counted whole, and the CPU seconds the whole tree
    /// ran, its exited threads included. That is unknown (`None`) when a process of `self` is
    /// gone by `end`, any process reaped a child in between, or a process's clock could not be
    /// read: CPU time spent out of sight.
    pub fn since(&self, end: &TreeAccounts) -> (Vec<(f64, f64)>, Option<f64>) {
        let ns = |x: u64| x as f64 * 1e-9;
        let threads = end
            .threads
            .iter()
            .map(|(tid, &(r1, w1))| {
                let (r0, w0) = self.threads.get(tid).copied().unwrap_or((0, 0));
                (ns(r1.saturating_sub(r0)), ns(w1.saturating_sub(w0)))
            })
            .collect();
        let gone = !(self.complete && end.complete)
            || self
                .processes
                .iter()
                .any(|(pid, &(_, k0))| end.processes.get(pid).is_none_or(|&(_, k1)| k1 != k0));
        let cpu = (!gone).then(|| {
            end.processes
                .iter()
                .map(|(pid, &(c1, k1))| match self.processes.get(pid) {
                    Some(&(c0, _)) => ns(c1.saturating_sub(c0)),
                    // Born in the window: its whole time, and its reaped children's too.
                    None => ns(c1) + k1 as f64 / 100.0,
                })
                .sum()
        });
        (threads, cpu)
    }
}

/// The seconds of a window's run-queue waits that the worker's tree did not cause itself, from
/// its threads' (run, wait) seconds in the window and the CPU seconds the whole tree ran
/// (`TreeAccounts::since`): the wait of its busiest thread (most run + wait) less what the rest
/// of the tree ran. A thread waits for its own siblings only while one of them has a CPU, so
/// the rest of the wait was for another process's; a tree that made its own waits (more of its
/// threads ready than CPUs) ran at least as long as they lasted and has none excused. Nothing
/// is excused where the tree's CPU time is unknown.
pub fn excused_wait(threads: &[(f64, f64)], tree_cpu_seconds: Option<f64>) -> f64 {
    let Some(cpu) = tree_cpu_seconds else {
        return 0.0;
    };
    let Some((run, wait)) = busiest(threads) else {
        return 0.0;
    };
    (wait - (cpu - run).max(0.0)).max(0.0)
}

/// The (run, wait) of the thread that ran and waited longest.
fn busiest(threads: &[(f64, f64)]) -> Option<(f64, f64)> {
    threads
        .iter()
        .copied()
        .max_by(|a, b| (a.0 + a.1).total_cmp(&(b.0 + b.1)))
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct GpuState {
    pub utilisation_pct: u32,
    pub temperature_c: u32,
}

/// Handles to what can be observed on this machine.
pub struct Telemetry {
    nvml: Option<Nvml>,
}

impl Default for Telemetry {
    fn default() -> Self {
        Self::new()
    }
}

impl Telemetry {
    pub fn new() -> Self {
        let nvml = Nvml::init()
            .ok()
            .filter(|n| n.device_count().map(|c| c > 0).unwrap_or(false));
        Telemetry { nvml }
    }

    pub fn has_gpu(&self) -> bool {
        self.nvml.is_some()
    }

    /// The GPUs' names (NVML's), in device order; none without NVML.
    pub fn gpu_names(&self) -> Vec<String> {
        let Some(n) = self.nvml.as_ref() else {
            return vec![];
        };
        (0..n.device_count().unwrap_or(0))
            .filter_map(|i| n.device_by_index(i).ok()?.name().ok())
            .collect()
    }

    /// The hottest and busiest of the GPUs (device 0 on a one-GPU runner).
    pub fn gpu(&self) -> Option<GpuState> {
        let n = self.nvml.as_ref()?;
        let mut out: Option<GpuState> = None;
        for i in 0..n.device_count().ok()? {
            let d = n.device_by_index(i).ok()?;
            let s = GpuState {
                utilisation_pct: d.utilization_rates().ok()?.gpu,
                temperature_c: d.temperature(TemperatureSensor::Gpu).ok()?,
            };
            out = Some(match out {
                None => s,
                Some(o) => GpuState {
                    utilisation_pct: o.utilisation_pct.max(s.utilisation_pct),
                    temperature_c: o.temperature_c.max(s.temperature_c),
                },
            });
        }
        out
    }

    /// Fraction of all CPU time that was busy over `over`.
    pub fn cpu_busy(&self, over: Duration) -> Option<f64> {
        let (b0, t0) = cpu_jiffies()?;
        std::thread::sleep(over);
        let (b1, t1) = cpu_jiffies()?;
        (t1 > t0).then(|| (b1 - b0) as f64 / (t1 - t0) as f64)
    }
}

/// When the machine counts as quiet enough to start a phase.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct QuietParams {
    /// Largest busy fraction of all CPUs (the parent itself is idle while it checks).
    pub max_cpu_busy: f64,
    pub max_gpu_util_pct: u32,
    pub max_gpu_temp_c: u32,
    /// How long to wait for quiet before giving up on this phase (its pair is then not accepted).
    pub max_wait_seconds: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct QuietCheck {
    pub quiet: bool,
    pub waited_seconds: f64,
    pub cpu_busy: Option<f64>,
    pub gpu: Option<GpuState>,
}

/// Waits until the CPU (and GPU, when present) is idle and cool, up to `max_wait_seconds`.
pub fn quiesce(t: &Telemetry, p: &QuietParams) -> QuietCheck {
    let start = Instant::now();
    loop {
        let cpu = t.cpu_busy(Duration::from_millis(50));
        let gpu = t.gpu();
        let quiet = cpu.is_none_or(|c| c <= p.max_cpu_busy)
            && gpu.is_none_or(|g| {
                g.utilisation_pct <= p.max_gpu_util_pct && g.temperature_c <= p.max_gpu_temp_c
            });
        let waited = start.elapsed().as_secs_f64();
        if quiet || waited >= p.max_wait_seconds {
            return QuietCheck {
                quiet,
                waited_seconds: waited,
                cpu_busy: cpu,
                gpu,
            };
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What was seen during one window.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WindowTelemetry {
    pub samples: usize,
    pub interval_seconds: f64,
    /// Mean busy fraction of all CPUs over the window (from the first to the last sample).
    pub system_cpu_busy: Option<f64>,
    /// The worker's CPU seconds per wall second over the window.
    pub worker_cpu_share: Option<f64>,
    /// Seconds the worker's threads waited on a run queue during the window, all added up.
    pub runqueue_wait_seconds: Option<f64>,
    /// Of them, what the worker's own tree cannot have caused (`excused_wait`): what a window
    /// less its waits takes out.
    pub excused_wait_seconds: Option<f64>,
    /// CPU seconds the worker's tree ran beside its busiest thread (its other threads and
    /// processes, those that exited in the window included); `None` where unknown.
    pub other_cpu_seconds: Option<f64>,
    pub max_gpu_util_pct: Option<u32>,
    pub max_gpu_temp_c: Option<u32>,
}

/// One sample: when, the system's CPU jiffies (busy, total), the worker's CPU seconds.
type Point = (Instant, Option<(u64, u64)>, Option<f64>);

/// Samples a worker during a window (`Tick` for `Worker::window`).
pub struct Sampler<'a> {
    telemetry: &'a Telemetry,
    interval: Duration,
    stall: Duration,
    start: Instant,
    first: Option<Point>,
    last: Option<Point>,
    last_progress: Instant,
    last_cpu: Option<f64>,
    wait_at_begin: Option<f64>,
    /// The worker's tree's CPU accounts when the window begins (`excused_wait`).
    accounts_at_begin: Option<TreeAccounts>,
    /// The worker's process tree, found when the window begins.
    tree: Vec<u32>,
    out: WindowTelemetry,
}

impl<'a> Sampler<'a> {
    /// `expected`: the window's expected length (from earlier windows), which sets the interval.
    pub fn new(telemetry: &'a Telemetry, expected: Duration, stall_seconds: f64) -> Self {
        let interval = (expected / SAMPLES_PER_WINDOW).clamp(MIN_INTERVAL, MAX_INTERVAL);
        let now = Instant::now();
        Sampler {
            telemetry,
            interval,
            stall: Duration::from_secs_f64(stall_seconds),
            start: now,
            first: None,
            last: None,
            last_progress: now,
            last_cpu: None,
            wait_at_begin: None,
            accounts_at_begin: None,
            tree: vec![],
            out: WindowTelemetry {
                interval_seconds: interval.as_secs_f64(),
                ..Default::default()
            },
        }
    }

    fn sample(&mut self, pid: u32) -> bool {
        if self.tree.is_empty() {
            self.tree = process_tree(pid);
        }
        let now = Instant::now();
        let cpu = tree_cpu_seconds(&self.tree);
        let s = (now, cpu_jiffies(), cpu);
        if self.first.is_none() {
            self.first = Some(s);
        }
        self.last = Some(s);
        self.out.samples += 1;
        let mut progress = cpu.is_some_and(|c| self.last_cpu.is_none_or(|l| c > l));
        if let Some(g) = self.telemetry.gpu() {
            progress |= g.utilisation_pct > 0;
            self.out.max_gpu_util_pct = Some(
                self.out
                    .max_gpu_util_pct
                    .unwrap_or(0)
                    .max(g.utilisation_pct),
            );
            self.out.max_gpu_temp_c =
                Some(self.out.max_gpu_temp_c.unwrap_or(0).max(g.temperature_c));
        }
        if cpu.is_some() {
            self.last_cpu = cpu;
        }
        if progress || cpu.is_none() {
            self.last_progress = now;
        }
        now - self.last_progress < self.stall
    }

    /// Takes the closing sample (the worker has replied) and returns the summary.
    pub fn finish(mut self, pid: u32) -> WindowTelemetry {
        self.sample(pid);
        let waited = tree_schedstat(&self.tree).map(|(_, w)| w);
        if let (Some(a), Some(b)) = (self.wait_at_begin, waited) {
            self.out.runqueue_wait_seconds = Some(b - a);
        }
        // The tree as it is now (a child born in the window included), and every process it
        // had when the window began.
        let mut tree = process_tree(pid);
        let earlier: Vec<u32> = self
            .tree
            .iter()
            .copied()
            .filter(|p| !tree.contains(p))
            .collect();
        tree.extend(earlier);
        if let (Some(a), Some(b)) = (&self.accounts_at_begin, TreeAccounts::read(&tree)) {
            let (threads, cpu) = a.since(&b);
            self.out.excused_wait_seconds = Some(excused_wait(&threads, cpu));
            let run = busiest(&threads).map_or(0.0, |t| t.0);
            self.out.other_cpu_seconds = cpu.map(|c| (c - run).max(0.0));
        }
        if let (Some((t0, j0, c0)), Some((t1, j1, c1))) = (self.first, self.last) {
            let dt = (t1 - t0).as_secs_f64();
            if let (Some((b0, a0)), Some((b1, a1))) = (j0, j1) {
                if a1 > a0 {
                    self.out.system_cpu_busy = Some((b1 - b0) as f64 / (a1 - a0) as f64);
                }
            }
            if let (Some(c0), Some(c1)) = (c0, c1) {
                if dt > 0.0 {
                    self.out.worker_cpu_share = Some((c1 - c0) / dt);
                }
            }
        }
        self.out
    }

    /// Takes the opening sample, right before the request is sent.
    pub fn begin(&mut self, pid: u32) {
        self.tree = process_tree(pid);
        self.wait_at_begin = tree_schedstat(&self.tree).map(|(_, w)| w);
        self.accounts_at_begin = TreeAccounts::read(&self.tree);
        self.start = Instant::now();
        self.last_progress = self.start;
        self.sample(pid);
    }
}

impl Tick for Sampler<'_> {
    fn interval(&self) -> Duration {
        self.interval
    }
    fn tick(&mut self, pid: u32) -> Result<(), String> {
        if self.sample(pid) {
            Ok(())
        } else {
            Err(format!(
                "no progress (CPU or GPU) for {:.1} s, {:.1} s into the window",
                self.stall.as_secs_f64(),
                self.start.elapsed().as_secs_f64()
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker behind a sandbox is a grandchild of what its parent spawned: the tree holds it,
    /// and its CPU time is the tree's (the processes above it idle).
    #[test]
    fn the_tree_of_a_process_holds_its_grandchildren_and_their_cpu() {
        let mut c = std::process::Command::new("sh")
            .args([
                "-c",
                "sh -c 'i=0; while [ $i -lt 2000000 ]; do i=$((i+1)); done' & wait",
            ])
            .spawn()
            .unwrap();
        let pid = c.id();
        let mut tree = vec![];
        for _ in 0..100 {
            tree = process_tree(pid);
            if tree.len() >= 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(tree.len() >= 2 && tree[0] == pid, "{tree:?}");
        let before = tree_cpu_seconds(&tree).unwrap();
        let mut after = before;
        for _ in 0..200 {
            std::thread::sleep(Duration::from_millis(20));
            after = tree_cpu_seconds(&tree).unwrap_or(after);
            if after > before {
                break;
            }
        }
        assert!(
            after > before,
            "the busy grandchild's CPU time: {before} then {after}"
        );
        // The spawned shell itself only waits: its own CPU time is not what moved.
        let own = tree_cpu_seconds(&tree[..1]).unwrap();
        assert!(own < after, "{own} {after}");
        c.kill().unwrap();
        let _ = c.wait();
        assert_eq!(parent_of("12 (a) b) S 7 12"), Some(7));
    }

    /// What each kind of tree has excused of its waits (seconds; deterministic: figures, no
    /// machine). A single-threaded worker that waited for another process (the CI no-op of
    /// `price::tests`: half of an 80 ms window) has all of its wait excused, its idle threads
    /// and the sandbox's processes above it changing nothing.
    #[test]
    fn a_worker_that_waited_for_another_process_has_its_wait_excused() {
        let one = [(0.040, 0.040), (0.0, 0.0), (0.0, 0.0)];
        assert!((excused_wait(&one, Some(0.040)) - 0.040).abs() < 1e-12);
        // Its parent's trouble reading the tree excuses nothing, nor does a tree with no thread.
        assert_eq!(excused_wait(&one, None), 0.0);
        assert_eq!(excused_wait(&[], Some(0.040)), 0.0);
    }

    /// A worker that oversubscribes the CPUs with its own threads made its waits itself. On 2
    /// CPUs, three busy helpers beside a decode of 35 ms: every thread runs half of the 70 ms
    /// window and waits the other half. Whether the helpers are still alive when the window ends
    /// (seen in schedstat) or were joined before the reply (seen only in the process's CPU
    /// clock, which keeps exited threads), the rest of the tree ran 105 ms, more than the 35 ms
    /// the decoding thread waited: nothing is excused.
    #[test]
    fn a_worker_whose_own_threads_made_its_waits_has_none_excused() {
        let live = [(0.035, 0.035); 4];
        assert_eq!(excused_wait(&live, Some(0.140)), 0.0);
        assert_eq!(excused_wait(&live[..1], Some(0.140)), 0.0);
        // One helper beside the decode on a machine where another process also had a CPU:
        // the decoding thread waited 40 ms, the helper ran 15 ms of them; 25 ms stay excused
        // (whoever else ran, it was not the tree).
        let mixed = [(0.035, 0.040), (0.015, 0.030)];
        assert!((excused_wait(&mixed, Some(0.050)) - 0.025).abs() < 1e-12);
        // The busiest thread is the one whose wait counts, whichever it is.
        let helper_busiest = [(0.010, 0.020), (0.030, 0.060)];
        assert!((excused_wait(&helper_busiest, Some(0.040)) - 0.050).abs() < 1e-12);
    }

    fn accounts(threads: &[(u32, u64, u64)], processes: &[(u32, u64, u64)]) -> TreeAccounts {
        TreeAccounts {
            threads: threads.iter().map(|&(t, r, w)| (t, (r, w))).collect(),
            processes: processes.iter().map(|&(p, c, k)| (p, (c, k))).collect(),
            complete: true,
        }
    }

    /// A window's accounts from its two ends (nanoseconds in, seconds out): a thread born in
    /// the window counts whole, one that exited counts only in its process's clock; a process
    /// born in the window counts whole; the tree's CPU is unknown when a process went away,
    /// reaped a child in between, or kept its clock unread (time spent out of sight).
    #[test]
    fn a_window_accounts_for_threads_and_processes_born_and_gone() {
        let ms = 1_000_000u64;
        let begin = accounts(
            &[(10, 100 * ms, 5 * ms), (11, 7 * ms, 0), (20, ms, 0)],
            &[(10, 200 * ms, 3), (20, ms, 0)],
        );
        // Thread 11 exited after running 30 ms (only the clock of process 10 has it); thread 12
        // was born and ran 10 ms; process 30 was born and ran 4 ms.
        let end = accounts(
            &[
                (10, 135 * ms, 45 * ms),
                (12, 10 * ms, 2 * ms),
                (20, ms, 0),
                (30, 4 * ms, 0),
            ],
            &[(10, 275 * ms, 3), (20, ms, 0), (30, 4 * ms, 0)],
        );
        let (mut threads, cpu) = begin.since(&end);
        threads.sort_by(|a, b| a.0.total_cmp(&b.0));
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        let want = [(0.0, 0.0), (0.004, 0.0), (0.010, 0.002), (0.035, 0.040)];
        assert!(
            threads
                .iter()
                .zip(want)
                .all(|(t, w)| close(t.0, w.0) && close(t.1, w.1)),
            "{threads:?}"
        );
        let cpu = cpu.unwrap();
        assert!(close(cpu, 0.079), "{cpu}");
        // 44 ms of the rest of the tree against 40 ms of waiting: nothing excused.
        assert_eq!(excused_wait(&threads, Some(cpu)), 0.0);
        // Process 20 went away, or process 10 reaped a child: unknown.
        let mut gone = end.clone();
        gone.processes.remove(&20);
        assert_eq!(begin.since(&gone).1, None);
        let mut reaped = end.clone();
        reaped.processes.insert(10, (275 * ms, 4));
        assert_eq!(begin.since(&reaped).1, None);
        // A process whose threads were read but not its clock: unknown, not nothing.
        let blind = TreeAccounts {
            complete: false,
            ..end.clone()
        };
        assert_eq!(begin.since(&blind).1, None);
    }

    /// What the window accounts read on this machine: a process's CPU clock keeps the time of
    /// its threads that have exited, which no schedstat lists any more. A thread of this test
    /// burns 40 ms of its own CPU time and is joined between two reads of this process.
    #[test]
    fn the_cpu_clock_of_a_process_keeps_its_exited_threads() {
        let me = std::process::id();
        let Some(begin) = TreeAccounts::read(&[me]) else {
            eprintln!("this kernel keeps no schedstat: nothing to read");
            return;
        };
        std::thread::spawn(|| {
            let own = || {
                let mut ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                // SAFETY: a live local of the type the call writes.
                unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
                ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
            };
            let t0 = own();
            let mut x = 0u64;
            while own() - t0 < 0.040 {
                for i in 0..10_000u64 {
                    x = std::hint::black_box(x.wrapping_add(i));
                }
            }
        })
        .join()
        .unwrap();
        let end = TreeAccounts::read(&[me]).unwrap();
        let (threads, cpu) = begin.since(&end);
        let live: f64 = threads.iter().map(|t| t.0).sum();
        let cpu = cpu.expect("this process is still here");
        assert!(
            cpu - live >= 0.030,
            "the process ran {cpu} s, its live threads {live} s"
        );
    }
}
