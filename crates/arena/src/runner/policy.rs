//! The policy stage: what a bundle may contain. Every entry a regular file, not setuid or
//! setgid, at a plain relative path (no absolute path, no `..`, no `.`/empty components, valid
//! UTF-8) on the track's surface and outside the frozen model (weights, manifests); within the
//! byte caps (total, per file, growth over the base versions). The first breach is the finding.

use std::collections::BTreeSet;

use crate::bundle::{Entry, Kind};
use crate::track::Track;

/// A policy finding: a category (`policy:…`) and the public detail (it names the solver's own
/// path, never anything hidden).
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub category: &'static str,
    pub detail: String,
}

fn finding(category: &'static str, detail: String) -> Finding {
    Finding { category, detail }
}

/// A changed file that passed policy.
#[derive(Debug, Clone)]
pub struct File {
    pub path: String,
    pub data: Vec<u8>,
    pub mode: u32,
}

fn plain_path(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('/')
        && !p.contains('\\')
        && !p.contains('\0')
        && p.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
}

/// Judges `entries` against `track`; `base_size(path)` is the file's size in the base tree
/// (`None`: the bundle adds it).
pub fn check(
    track: &Track,
    entries: &[Entry],
    base_size: &dyn Fn(&str) -> Option<u64>,
) -> Result<Vec<File>, Finding> {
    let caps = &track.caps;
    let mut seen = BTreeSet::new();
    let (mut total, mut growth) = (0u64, 0i64);
    let mut out = vec![];
    for e in entries {
        let p = &e.path;
        if !e.raw_ok {
            return Err(finding(
                "policy:path",
                format!("{p}: a path that is not UTF-8"),
            ));
        }
        if !plain_path(p.trim_end_matches('/')) {
            return Err(finding(
                "policy:path",
                format!("{p}: only relative paths without '..', '.' or empty parts"),
            ));
        }
        match e.kind {
            Kind::File => {}
            Kind::Symlink | Kind::Hardlink => {
                return Err(finding(
                    "policy:link",
                    format!("{p}: is {}; bundles hold regular files only", e.kind.name()),
                ))
            }
            k => {
                return Err(finding(
                    "policy:special_file",
                    format!("{p}: is {}; bundles hold regular files only", k.name()),
                ))
            }
        }
        if e.mode & 0o7000 != 0 {
            return Err(finding(
                "policy:setuid",
                format!("{p}: mode {:o} has a setuid, setgid or sticky bit", e.mode),
            ));
        }
        if track.frozen(p) {
            return Err(finding(
                "policy:frozen",
                format!("{p}: the model's weights and manifests are frozen"),
            ));
        }
        if !track.on_surface(p) {
            return Err(finding(
                "policy:off_surface",
                format!(
                    "{p}: not on the surface of track {} ({})",
                    track.name,
                    track.surface.join(", ")
                ),
            ));
        }
        if !seen.insert(p.clone()) {
            return Err(finding("policy:path", format!("{p}: twice in the bundle")));
        }
        let n = e.data.len() as u64;
        if n > caps.file_bytes {
            return Err(finding(
                "policy:too_large",
                format!(
                    "{p}: {n} bytes, more than the {} allowed per file",
                    caps.file_bytes
                ),
            ));
        }
        total += n;
        growth += n as i64 - base_size(p).unwrap_or(0) as i64;
        out.push(File {
            path: p.clone(),
            data: e.data.clone(),
            mode: e.mode & 0o777,
        });
    }
    if total > caps.total_bytes {
        return Err(finding(
            "policy:too_large",
            format!(
                "{total} bytes in all, more than the {} allowed",
                caps.total_bytes
            ),
        ));
    }
    if growth > caps.growth_bytes as i64 {
        return Err(finding(
            "policy:too_large",
            format!(
                "the changed files grow by {growth} bytes, more than the {} allowed",
                caps.growth_bytes
            ),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn track() -> Track {
        crate::track::repo_tracks().remove("serial-tiny").unwrap()
    }

    fn file(path: &str, n: usize) -> Entry {
        Entry {
            path: path.into(),
            raw_ok: true,
            kind: Kind::File,
            mode: 0o644,
            data: vec![b'x'; n],
        }
    }

    fn category(entries: Vec<Entry>) -> &'static str {
        match check(&track(), &entries, &|_| Some(100)) {
            Ok(_) => "ok",
            Err(f) => f.category,
        }
    }

    #[test]
    fn each_breach_has_its_category() {
        assert_eq!(category(vec![file("crates/cpu/src/ops.rs", 10)]), "ok");
        assert_eq!(category(vec![]), "ok");
        assert_eq!(
            category(vec![file("crates/clock/src/price.rs", 1)]),
            "policy:off_surface"
        );
        for p in [
            "/etc/passwd",
            "crates/cpu/src/../../x",
            "crates/cpu/src/./a.rs",
            "crates//a",
        ] {
            assert_eq!(category(vec![file(p, 1)]), "policy:path", "{p}");
        }
        let mut l = file("crates/cpu/src/ops.rs", 0);
        l.kind = Kind::Symlink;
        assert_eq!(category(vec![l.clone()]), "policy:link");
        l.kind = Kind::Hardlink;
        assert_eq!(category(vec![l.clone()]), "policy:link");
        l.kind = Kind::Device;
        assert_eq!(category(vec![l.clone()]), "policy:special_file");
        l.kind = Kind::Fifo;
        assert_eq!(category(vec![l]), "policy:special_file");
        let mut s = file("crates/cpu/src/ops.rs", 1);
        s.mode = 0o4755;
        assert_eq!(category(vec![s]), "policy:setuid");
        assert_eq!(
            category(vec![file("assets/laguna-tiny/model.safetensors", 1)]),
            "policy:frozen"
        );
        assert_eq!(
            category(vec![
                file("crates/cpu/src/a.rs", 1),
                file("crates/cpu/src/a.rs", 1)
            ]),
            "policy:path"
        );
        let mut bad = file("crates/cpu/src/ops.rs", 1);
        bad.raw_ok = false;
        assert_eq!(category(vec![bad]), "policy:path");
    }

    #[test]
    fn the_caps_hold() {
        let t = track();
        let cap = t.caps.file_bytes as usize;
        assert_eq!(
            category(vec![file("crates/cpu/src/a.rs", cap + 1)]),
            "policy:too_large"
        );
        // Growth: new files count whole, changed ones by what they add to the base version.
        let many: Vec<Entry> = (0..2)
            .map(|i| file(&format!("crates/cpu/src/new{i}.rs"), cap))
            .collect();
        assert!(check(&t, &many, &|_| None).is_err());
        assert!(check(&t, &many, &|_| Some(cap as u64)).is_ok());
    }
}
