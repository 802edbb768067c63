//! The checks before anything is built: policy (what the bundle may hold) and review (what its
//! added code may do).

use std::time::Duration;

use anyhow::Result;
use serde_json::{json, Value};

use super::{failed, ok, Outcome, Runner};
use crate::api::Job;
use crate::bundle;
use crate::runner::policy;
use crate::runner::review::{self, External};

impl Runner {
    pub(super) fn policy(&self, job: &Job) -> Result<Outcome> {
        let tree = self.tree(&job.base_commit)?;
        let bytes = std::fs::read(self.artifact(&job.bundle_digest, false)?)?;
        let entries = match bundle::read(&bytes, job.track.caps.total_bytes) {
            Ok(e) => e,
            Err(e) => return Ok(failed("policy:malformed", format!("{e:#}"))),
        };
        let size = |p: &str| {
            std::fs::symlink_metadata(tree.join(p))
                .ok()
                .filter(|m| m.is_file())
                .map(|m| m.len())
        };
        Ok(match policy::check(&job.track, &entries, &size) {
            Ok(files) => {
                let bytes: usize = files.iter().map(|f| f.data.len()).sum();
                let names: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
                // A no-op changes nothing: its line names no files (and ends in no colon).
                let line = if names.is_empty() {
                    "no file changed".to_string()
                } else {
                    format!(
                        "{} file(s), {bytes} bytes: {}",
                        files.len(),
                        names.join(", ")
                    )
                };
                ok(line, json!({"files": names}))
            }
            Err(f) => failed(f.category, f.detail),
        })
    }

    pub(super) fn review(&self, job: &Job) -> Result<Outcome> {
        let tree = self.tree(&job.base_commit)?;
        let mut changes = vec![];
        for (p, data, _) in self.bundle_files(job)? {
            let old = std::fs::read(tree.join(&p)).unwrap_or_default();
            changes.push((
                p,
                String::from_utf8_lossy(&old).into_owned(),
                String::from_utf8_lossy(&data).into_owned(),
            ));
        }
        if let Some((rule, detail)) = review::builtin(&changes)? {
            return Ok(failed(format!("review:{rule}"), detail));
        }
        let mut said = "built-in rules: no finding".to_string();
        if let Some(cmd) = &self.opts.reviewer {
            let mut text = String::new();
            for (p, old, new) in &changes {
                text += &format!("--- {p}\n");
                for l in review::added_lines(old, new) {
                    text += &format!("+{l}\n");
                }
            }
            match review::external(cmd, &text, Duration::from_secs(600)) {
                External::Approved => said += "; reviewer: approved",
                External::Finding(why) => return Ok(failed("review:reviewer", why)),
                External::Unavailable(why) => {
                    return Ok(failed("infra:review_unavailable", why));
                }
            }
        }
        Ok(ok(said, Value::Null))
    }
}
