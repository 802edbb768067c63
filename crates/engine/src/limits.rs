//! What a run may ask of a model and of the machine, checked before anything is allocated: the
//! sequence (prompt and new tokens) must fit the model's `max_position_embeddings`, and the
//! memory the run needs beyond the weights must fit in what the machine has available.

use fastdecode_model::{Error, LagunaConfig, Result};

/// Checks that `prompt_len` prompt tokens followed by `new_tokens` new ones fit the model. The
/// message gives the numbers; callers add the option or field that asked for them.
pub fn check_length(cfg: &LagunaConfig, prompt_len: usize, new_tokens: usize) -> Result<()> {
    let max = cfg.max_position_embeddings;
    match prompt_len.checked_add(new_tokens) {
        Some(total) if total <= max => Ok(()),
        total => Err(Error::Input(format!(
            "a prompt of {prompt_len} tokens and {new_tokens} new tokens make {} positions, more \
             than the model's max_position_embeddings {max}",
            total.map_or_else(|| "too many".to_string(), |t| t.to_string())
        ))),
    }
}

/// Bytes the OS says a new allocation can have without swapping (Linux `MemAvailable`); `None`
/// where it does not say.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Runs needing less than this are not checked against the machine's memory: any machine runs
/// them, and a timed window then never pays for asking the OS.
const CHECKED_ABOVE: u64 = 1 << 30;

/// Checks that a run needing `bytes` of host memory (`None`: more than 64 bits can count) fits in
/// the memory available now; `what` says what the bytes are for.
pub fn check_memory(bytes: Option<u64>, what: &str) -> Result<()> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    if bytes.is_some_and(|b| b < CHECKED_ABOVE) {
        return Ok(());
    }
    match (bytes, available_memory()) {
        (None, _) => Err(Error::Input(format!(
            "{what} would need more memory than can be counted"
        ))),
        (Some(b), Some(avail)) if b > avail => Err(Error::Input(format!(
            "{what} needs about {:.1} GiB of memory, but only {:.1} GiB is available",
            gib(b),
            gib(avail)
        ))),
        _ => Ok(()),
    }
}
