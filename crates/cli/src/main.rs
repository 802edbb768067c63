//! `fastdecode`: the one command-line entry point.

#![deny(clippy::print_stdout)] // stdout goes through out!/outln! (fastdecode_out)

#[macro_use]
extern crate fastdecode_out;

mod bench;
mod check;
mod common;
mod cuda_bench;
mod gate_cmds;
mod generate;
mod kernels;
mod model_cmds;
mod price;
mod pricing;
mod selftest;
mod timeline;
mod worker;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "fastdecode",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("FASTDECODE_GIT_COMMIT"), ")"),
    about = "An exact, fast inference engine for Laguna mixture-of-experts models, with DFlash speculative decoding.",
    long_about = "An exact, fast inference engine for Laguna mixture-of-experts models.\n\n\
        Model directories hold config.json, *.safetensors (HF or NVFP4 runtime layout), an optional \
        tokenizer.json, an optional drafter/ (DFlash drafter) and a MANIFEST. Commands that take \
        --model use the bundled default model when it is omitted."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Write a synthetic checkpoint (target + drafter + tokenizer + MANIFEST) with seeded random weights.
    Synth(model_cmds::SynthArgs),
    /// Convert an HF-layout checkpoint to the NVFP4 runtime layout (byte-reproducible).
    Transform(model_cmds::TransformArgs),
    /// Print a model's summary, or its canonical tensor inventory.
    Inspect(model_cmds::InspectArgs),
    /// Check every file of a model directory against its MANIFEST and print the directory digest.
    Verify(model_cmds::VerifyArgs),
    /// Generate text greedily, serially or with DFlash speculative decoding.
    Generate(generate::GenerateArgs),
    /// Measure prefill and decode speed, serial and DFlash, and the drafts' acceptance.
    Bench(bench::BenchArgs),
    /// Compare a GPU backend with the CPU reference: logits and teacher-forced greedy agreement.
    Check(check::CheckArgs),
    /// Serve the engine to a parent process over the worker line protocol (stdin/stdout).
    Worker(worker::WorkerArgs),
    /// Compile the CUDA kernel modules for a GPU architecture ahead of use (no GPU needed with
    /// --arch); workers load them from `$FASTDECODE_KERNELS`.
    Kernels(kernels::KernelsArgs),
    /// Golden traces: reference continuations with per-step top-2 logits.
    #[command(subcommand)]
    Golden(gate_cmds::GoldenCmd),
    /// The behaviour gate: a candidate build against a reference build on golden traces.
    Gate(gate_cmds::GateArgs),
    /// Find the optimisation flag whose switch makes a build diverge from golden traces.
    Bisect(gate_cmds::BisectArgs),
    /// Price a candidate build against the pinned baseline build in paired, timed worker runs.
    Price(Box<price::PriceArgs>),
    /// Tabulate a decode-step timeline written by `bench --trace` (and draw it with --svg).
    Timeline(timeline::TimelineArgs),
    /// The arena: its service, runners, status, operator commands and a local demo.
    #[cfg(feature = "arena")]
    #[command(subcommand)]
    Arena(fastdecode_arena::cli::ArenaCmd),
    /// Submit the working tree's changes on a track's surface to an arena and follow them to a
    /// verdict (exit 0 only when it passed).
    #[cfg(feature = "arena")]
    Submit(fastdecode_arena::cli::SubmitArgs),
}

/// A run stopped by SIGINT, SIGTERM or SIGHUP first removes the output it was staging (a
/// directory of goldens, a file before its rename: `files::remove_partial_outputs`), then ends
/// as the signal's default action would. Started after the environment is set: it is a thread.
fn remove_partial_outputs_on_signals() {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else {
        // Without the handler a signal still ends the run, as it did before.
        return;
    };
    std::thread::spawn(move || {
        if let Some(signal) = signals.forever().next() {
            fastdecode_model::files::remove_partial_outputs();
            let _ = signal_hook::low_level::emulate_default_handler(signal);
            std::process::exit(128 + signal);
        }
    });
}

fn main() {
    // Die quietly on a closed pipe (`fastdecode inspect ... | head`) like other Unix tools,
    // instead of panicking on the failed write.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of one signal before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    // CUDA kernels load with their modules, not at first launch (CUDA's lazy default): loaded
    // lazily, the decode step's speed moved by ~1 % with a kernel it never launches, whose first
    // use changed where the step's own kernels were placed (BENCHMARKS.md, seventeenth
    // measurement). Set here, before any thread or CUDA call exists; a user's setting wins.
    if std::env::var_os("CUDA_MODULE_LOADING").is_none() {
        std::env::set_var("CUDA_MODULE_LOADING", "EAGER");
    }
    remove_partial_outputs_on_signals();
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Synth(a) => model_cmds::synth(a),
        Cmd::Transform(a) => model_cmds::transform(a),
        Cmd::Inspect(a) => model_cmds::inspect(a),
        Cmd::Verify(a) => model_cmds::verify(a),
        Cmd::Generate(a) => generate::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Kernels(a) => kernels::run(a),
        Cmd::Worker(a) => worker::serve(a, std::io::stdin().lock(), std::io::stdout().lock()),
        Cmd::Golden(c) => gate_cmds::golden(c),
        Cmd::Gate(a) => gate_cmds::gate(a),
        Cmd::Bisect(a) => gate_cmds::bisect(a),
        Cmd::Price(a) => price::run(*a),
        Cmd::Check(a) => check::run(a),
        Cmd::Timeline(a) => timeline::run(a),
        #[cfg(feature = "arena")]
        Cmd::Arena(c) => {
            // Runners drive workers, and every command here writes to sockets: a peer that
            // closes must come back as an error, not kill the process through SIGPIPE.
            common::parent_of_workers();
            fastdecode_arena::cli::arena(c)
        }
        #[cfg(feature = "arena")]
        Cmd::Submit(a) => fastdecode_arena::cli::submit(a),
    };
    if let Err(e) = result {
        eprintln!("error: {}", one_line(&e));
        std::process::exit(1);
    }
}

/// An error and its causes on one line, as `{:#}` writes them, less a cause whose text the line
/// already ends with (a database error, among others, quotes its source's text).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_cause_already_quoted_is_written_once() {
        let inner = std::io::Error::other("file is not a database");
        let quoting =
            anyhow::Error::new(inner).context("from the database: file is not a database");
        let e = quoting.context("--database sqlite://a.db");
        assert_eq!(
            super::one_line(&e),
            "--database sqlite://a.db: from the database: file is not a database"
        );
        let plain = anyhow::anyhow!("no such file").context("reading x");
        assert_eq!(super::one_line(&plain), "reading x: no such file");
    }
}
