//! What the running stage is doing, as the heartbeat tells the service: the stage's own words
//! (`compiling the candidate`) or the line a trusted child keeps in a file (the clock's pairs so
//! far, its interval and the time budget left), each with how long the stage has run. Never the
//! candidate's own output: what it prints can reach no page.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Where a stage's progress comes from.
enum Source {
    Words(String),
    /// A line a trusted child rewrites whole (`price --progress-file`); empty or absent until
    /// its first write.
    File(PathBuf),
}

/// The progress of the job this runner works on, shared with its heartbeat thread.
#[derive(Clone)]
pub(super) struct Progress(Arc<Mutex<(Instant, Option<Source>)>>);

impl Progress {
    pub fn new() -> Progress {
        Progress(Arc::new(Mutex::new((Instant::now(), None))))
    }

    /// A new stage starts: nothing said yet, its clock at zero.
    pub fn start(&self) {
        *self.lock() = (Instant::now(), None);
    }

    pub fn say(&self, words: impl Into<String>) {
        self.lock().1 = Some(Source::Words(words.into()));
    }

    /// From now on the line is the one `path` holds.
    pub fn follow(&self, path: PathBuf) {
        self.lock().1 = Some(Source::File(path));
    }

    /// The line to send, e.g. `compiling the candidate (41 s)`; none before the stage says
    /// anything.
    pub fn line(&self) -> Option<String> {
        let g = self.lock();
        let words = match &g.1 {
            None => return None,
            Some(Source::Words(w)) => w.clone(),
            Some(Source::File(p)) => std::fs::read_to_string(p).ok()?.trim().to_string(),
        };
        if words.is_empty() {
            return None;
        }
        Some(format!("{words} ({:.0} s)", g.0.elapsed().as_secs_f64()))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Instant, Option<Source>)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_is_the_stage_words_or_the_file_with_the_time_run() {
        let p = Progress::new();
        assert_eq!(p.line(), None);
        p.say("compiling the candidate");
        assert_eq!(p.line().unwrap(), "compiling the candidate (0 s)");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("progress");
        p.follow(f.clone());
        assert_eq!(p.line(), None, "no file yet");
        std::fs::write(&f, "3/30 pairs; pair 4 Candidate\n").unwrap();
        assert_eq!(p.line().unwrap(), "3/30 pairs; pair 4 Candidate (0 s)");
        p.start();
        assert_eq!(p.line(), None, "a new stage says nothing yet");
    }
}
