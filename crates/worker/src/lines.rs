//! Lines of bounded length. Both ends of the protocol read lines from a process they do not
//! trust; a line without an end (or one far longer than any reply or request can be) must not
//! make the reader's memory grow with it.

use std::io::{self, BufRead};

/// What one bounded read got.
#[derive(Debug, PartialEq, Eq)]
pub enum Bounded {
    /// A whole line, without its newline (a last line without a newline counts too).
    Line(Vec<u8>),
    /// More than the limit arrived before a newline; what did arrive is dropped, and the rest
    /// of the line is still unread.
    TooLong,
    /// The input ended.
    Eof,
}

/// Reads one line of at most `max()` bytes (not counting its newline) from `r`. The limit is
/// asked again for every chunk that arrives, so a reader waiting for a line gets the limit set
/// when its data comes, not the one set when it began waiting.
pub fn read_line(r: &mut impl BufRead, max: impl Fn() -> usize) -> io::Result<Bounded> {
    let mut line = vec![];
    loop {
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(if line.is_empty() {
                Bounded::Eof
            } else {
                Bounded::Line(line)
            });
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        if line.len() + take > max() {
            return Ok(Bounded::TooLong);
        }
        line.extend_from_slice(&buf[..take]);
        r.consume(if done { take + 1 } else { take });
        if done {
            return Ok(Bounded::Line(line));
        }
    }
}

/// Discards the rest of the current line (after `TooLong`), holding none of it.
pub fn skip_line(r: &mut impl BufRead) -> io::Result<()> {
    loop {
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return Ok(());
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                r.consume(i + 1);
                return Ok(());
            }
            None => {
                let n = buf.len();
                r.consume(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_bounded_and_the_rest_can_be_skipped() {
        let mut r = io::BufReader::with_capacity(4, &b"ab\ncdefgh\nij"[..]);
        let five = || 5;
        assert_eq!(
            read_line(&mut r, five).unwrap(),
            Bounded::Line(b"ab".to_vec())
        );
        assert_eq!(read_line(&mut r, five).unwrap(), Bounded::TooLong);
        skip_line(&mut r).unwrap();
        assert_eq!(
            read_line(&mut r, five).unwrap(),
            Bounded::Line(b"ij".to_vec())
        );
        assert_eq!(read_line(&mut r, five).unwrap(), Bounded::Eof);
    }
}
