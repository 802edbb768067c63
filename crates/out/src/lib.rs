//! What the commands print on stdout goes through `out!` and `outln!`, never `print!`: a full
//! stdout (`> /dev/full`) or, where SIGPIPE is ignored, a closed one is an error the command
//! returns (`error: writing to stdout: …`, exit 1), not a panic. The crates that print (the
//! `fastdecode` binary, the arena's commands) deny `clippy::print_stdout` so nothing prints
//! around them, and take the macros with `#[macro_use] extern crate fastdecode_out`.

use std::io::Write;

/// Writes `text` to stdout and flushes it: the caller learns here whether it arrived.
pub fn write(text: std::fmt::Arguments) -> anyhow::Result<()> {
    let mut o = std::io::stdout().lock();
    o.write_fmt(text)
        .and_then(|()| o.flush())
        .map_err(|e| anyhow::anyhow!("writing to stdout: {e}"))
}

/// `print!` that returns the write's result.
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => { $crate::write(format_args!($($t)*)) };
}

/// `println!` that returns the write's result.
#[macro_export]
macro_rules! outln {
    () => { $crate::write(format_args!("\n")) };
    ($($t:tt)*) => { $crate::write(format_args!("{}\n", format_args!($($t)*))) };
}
