//! The red-team corpus (`redteam/` at the repository root): submissions that cheat, each with
//! the stage and category that must stop it, and honest controls that must pass, run end to end
//! against a real arena by `fastdecode arena redteam`. A case is one TOML file (`Case`); its
//! bundle is made here against the track's current base: edits of the base's files (find and
//! replace), or raw entries that `submit` never sends (links, devices, odd paths, big files).
//!
//! Every cheat is posted before any control, so each is judged against the base it was written
//! for even when a control is promoted.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::api::{encode_bundle, Accepted, NewSubmission, SubmissionView, TrackView};
use crate::bundle::{pack, Content};
use crate::http::Api;
use crate::service::db::now_ms;
use crate::{client, git};

/// What an honest control must end as.
pub const PASSED: &str = "passed";

/// The stage and category of a cheat that passes (its output is exact) but is never promoted:
/// one that only moves work where the clock does not look.
pub const PROMOTION: &str = "promotion";
pub const NOT_PROMOTED: &str = "not_promoted";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    /// One line: what the cheat does.
    pub description: String,
    pub track: String,
    /// The stage that must end it (`policy`, `review`, `build`, `gate`, `price`); `verdict` for
    /// a control; `promotion` (category `not_promoted`) for a cheat that must pass at no gain.
    pub stage: String,
    /// Its failure category as the verdict names it (`policy:link`, `gate:dflash_inexact`,
    /// `violation:…`); `passed` for a control.
    pub category: String,
    /// A patch (a path in the repository, as `git apply` takes it) applied to the base.
    pub patch: Option<String>,
    #[serde(default)]
    pub edit: Vec<Edit>,
    #[serde(default)]
    pub entry: Vec<RawEntry>,
    /// Texts the candidate writes that must appear nowhere in the submission's public record
    /// (its API view and its page).
    #[serde(default)]
    pub absent: Vec<String>,
}

/// A change to a file of the base: `find` (exactly once in it) becomes `replace`; an empty
/// `find` appends `replace` (to a new file, or to the end of one).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Edit {
    pub path: String,
    #[serde(default)]
    pub find: String,
    pub replace: String,
}

/// An entry sent as it is: exactly one of `text` (a file, with `mode`), `size` (a file of that
/// many zero bytes), `symlink`, `hardlink` (their targets), `device` or `fifo`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawEntry {
    pub path: String,
    pub text: Option<String>,
    pub mode: Option<u32>,
    pub size: Option<u64>,
    pub symlink: Option<String>,
    pub hardlink: Option<String>,
    #[serde(default)]
    pub device: bool,
    #[serde(default)]
    pub fifo: bool,
}

impl Case {
    pub fn parse(text: &str, file: &Path) -> Result<Case> {
        let c: Case = toml::from_str(text).with_context(|| file.display().to_string())?;
        let at = |what: String| anyhow::anyhow!("{}: {what}", file.display());
        let sources = [c.patch.is_some(), !c.edit.is_empty(), !c.entry.is_empty()];
        if sources.iter().filter(|&&s| s).count() != 1 {
            return Err(at(
                "a case has a patch, edits or raw entries (exactly one of the three)".into(),
            ));
        }
        if (c.stage == PROMOTION) != (c.category == NOT_PROMOTED) {
            return Err(at(format!(
                "stage {:?} with category {:?}: a cheat that must pass unpromoted is stage \
                 \"promotion\" with category \"not_promoted\"",
                c.stage, c.category
            )));
        }
        if (c.category == PASSED) != (c.stage == "verdict") {
            return Err(at(format!(
                "stage {:?} with category {:?}: a control is stage \"verdict\" with category \
                 \"passed\", a cheat names the stage and category that stop it",
                c.stage, c.category
            )));
        }
        for e in &c.entry {
            let kinds = [
                e.text.is_some(),
                e.size.is_some(),
                e.symlink.is_some(),
                e.hardlink.is_some(),
                e.device,
                e.fifo,
            ];
            if kinds.iter().filter(|&&k| k).count() != 1 {
                return Err(at(format!(
                    "entry {}: exactly one of text, size, symlink, hardlink, device, fifo",
                    e.path
                )));
            }
        }
        Ok(c)
    }

    pub fn control(&self) -> bool {
        self.category == PASSED
    }

    fn expected(&self) -> String {
        format!("{} {}", self.stage, self.category)
    }

    /// The bundle's entries against `base` of the repository `repo`.
    pub fn entries(&self, repo: &Path, base: &str) -> Result<Vec<(String, Content)>> {
        let mut out: Vec<(String, Content)> = vec![];
        if let Some(p) = &self.patch {
            return patched(repo, base, &repo.join(p)).with_context(|| format!("patch {p}"));
        }
        for e in &self.edit {
            // Several edits of one file apply in order to the same text.
            let old = match out.iter().position(|(p, _)| p == &e.path) {
                Some(i) => match out.remove(i).1 {
                    Content::File(d, _) => String::from_utf8(d)?,
                    _ => unreachable!("edits make files only"),
                },
                None => match git::contents(repo, base, &e.path)? {
                    Some(b) => String::from_utf8(b)
                        .with_context(|| format!("{} at {base}: not UTF-8", e.path))?,
                    None => String::new(),
                },
            };
            let new = if e.find.is_empty() {
                old + &e.replace
            } else {
                match old.matches(&e.find).count() {
                    1 => old.replacen(&e.find, &e.replace, 1),
                    n => bail!(
                        "edit of {}: its find text is {n} times in the base {base}, not once",
                        e.path
                    ),
                }
            };
            out.push((e.path.clone(), Content::File(new.into_bytes(), 0o644)));
        }
        for e in &self.entry {
            let c = if let Some(t) = &e.text {
                Content::File(t.clone().into_bytes(), e.mode.unwrap_or(0o644))
            } else if let Some(n) = e.size {
                Content::File(vec![0; n as usize], e.mode.unwrap_or(0o644))
            } else if let Some(t) = &e.symlink {
                Content::Symlink(t.clone())
            } else if let Some(t) = &e.hardlink {
                Content::Hardlink(t.clone())
            } else if e.device {
                Content::Device
            } else {
                Content::Fifo
            };
            out.push((e.path.clone(), c));
        }
        Ok(out)
    }
}

/// The files `patch` changes, as they are after it is applied to `base`: `git apply` in a
/// scratch directory holding those files as `base` has them.
fn patched(repo: &Path, base: &str, patch: &Path) -> Result<Vec<(String, Content)>> {
    // git is given a copy read here, so a patch that is a FIFO or a device is refused by name
    // rather than waited on by git; the copy's path is absolute (git runs in the scratch
    // directory).
    let mut copy = tempfile::NamedTempFile::new()?;
    std::io::Write::write_all(&mut copy, &crate::store::read_regular(patch)?)?;
    let patch = copy
        .path()
        .to_str()
        .with_context(|| format!("the patch copy {} is not UTF-8", copy.path().display()))?;
    let tmp = tempfile::tempdir()?;
    let stat = git::output(tmp.path(), &["apply", "--numstat", patch])?;
    let paths: Vec<String> = String::from_utf8_lossy(&stat)
        .lines()
        .filter_map(|l| l.split('\t').nth(2).map(str::to_string))
        .collect();
    for p in &paths {
        if let Some(old) = git::contents(repo, base, p)? {
            let at = tmp.path().join(p);
            std::fs::create_dir_all(at.parent().expect("a file's directory"))?;
            std::fs::write(at, old)?;
        }
    }
    git::output(tmp.path(), &["apply", patch])?;
    paths
        .into_iter()
        .map(|p| {
            let data = std::fs::read(tmp.path().join(&p))?;
            Ok((p, Content::File(data, 0o644)))
        })
        .collect()
}

/// Every `*.toml` of `dir` by name (the file's stem).
pub fn load(dir: &Path) -> Result<Vec<(String, Case)>> {
    let mut out = vec![];
    let rd = std::fs::read_dir(dir).with_context(|| format!("the corpus {}", dir.display()))?;
    for e in rd {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "toml") {
            let text = crate::store::read_regular_text(&p)?;
            let name = p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            out.push((name, Case::parse(&text, &p)?));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    if out.is_empty() {
        bail!("the corpus {} has no case (*.toml)", dir.display());
    }
    Ok(out)
}

/// One case's result.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub case: String,
    pub description: String,
    pub expected: String,
    pub actual: String,
    /// The submission's final status.
    pub verdict: String,
    pub submission: String,
    pub ok: bool,
}

/// What a finished submission ended as: `STAGE CATEGORY` of its failure, or `verdict passed`
/// (for a case that expects to pass unpromoted, `promotion not_promoted` or `promotion promoted`).
pub fn actual(v: &SubmissionView, case: &Case) -> String {
    if client::passed(v) && case.stage == PROMOTION {
        let how = if v.status == "promoted" {
            "promoted"
        } else {
            NOT_PROMOTED
        };
        return format!("{PROMOTION} {how}");
    }
    if client::passed(v) {
        return format!("verdict {PASSED}");
    }
    let f = v.verdict.as_ref();
    let get = |k: &str| f.and_then(|f| f[k].as_str()).unwrap_or("?").to_string();
    format!("{} {}", get("stage"), get("category"))
}

/// Posts every case (cheats first, then controls), follows each to its verdict, and compares.
/// `progress` hears each verdict as it comes.
pub fn run(
    api: &Api,
    repo: &Path,
    cases: &[(String, Case)],
    mut progress: impl FnMut(&Row),
) -> Result<Vec<Row>> {
    let mut order: Vec<&(String, Case)> = cases.iter().filter(|c| !c.1.control()).collect();
    order.extend(cases.iter().filter(|c| c.1.control()));
    let run_id = now_ms();
    let mut posted = vec![];
    for (name, c) in order {
        let t: TrackView = api
            .get_json(&format!("/api/tracks/{}", c.track))
            .with_context(|| format!("case {name}: track {}", c.track))?;
        let entries = c
            .entries(repo, &t.current_base)
            .with_context(|| format!("case {name}"))?;
        let req = NewSubmission {
            track: c.track.clone(),
            note: format!("# red team: {name}\n\n{}\n", c.description),
            model: Some("redteam".into()),
            claimed_score: None,
            bundle: encode_bundle(&pack(&entries).with_context(|| format!("case {name}"))?),
            mode: Default::default(),
            local_result: None,
        };
        let key = format!("redteam-{name}-{run_id}");
        let acc: Accepted = api
            .post("/api/submissions", &req, &[("Idempotency-Key", &key)])
            .with_context(|| format!("case {name}: submitting"))?
            .with_context(|| format!("case {name}: the service answered nothing"))?;
        posted.push((name.clone(), c, acc.id));
    }
    let mut rows = vec![];
    for (name, c, id) in posted {
        // Quietly: the corpus prints one line a case.
        let v = client::poll(api, &id, |_| true)
            .with_context(|| format!("case {name}: following {id}"))?;
        let mut actual = actual(&v, c);
        if let Some(t) = shown(api, &id, &c.absent)? {
            actual = format!("{actual} (the record shows {t:?})");
        }
        let row = Row {
            ok: actual == c.expected(),
            case: name,
            description: c.description.clone(),
            expected: c.expected(),
            actual,
            verdict: v.status.clone(),
            submission: id,
        };
        progress(&row);
        rows.push(row);
    }
    Ok(rows)
}

/// The first of `texts` that the submission's public record (API view, page) shows.
fn shown(api: &Api, id: &str, texts: &[String]) -> Result<Option<String>> {
    if texts.is_empty() {
        return Ok(None);
    }
    let view = api
        .get_bytes(&format!("/api/submissions/{id}"))?
        .unwrap_or_default();
    let page = api
        .get_bytes(&format!("/submissions/{id}"))?
        .unwrap_or_default();
    let record = format!(
        "{}{}",
        String::from_utf8_lossy(&view),
        String::from_utf8_lossy(&page)
    );
    Ok(texts.iter().find(|t| record.contains(t.as_str())).cloned())
}

/// The table: case, expected, actual, verdict, and whether they agree.
pub fn table(rows: &[Row]) -> String {
    let w = |f: fn(&Row) -> &str, head: &str| {
        rows.iter()
            .map(|r| f(r).len())
            .chain([head.len()])
            .max()
            .unwrap_or(0)
    };
    let (wc, we, wa) = (
        w(|r| &r.case, "case"),
        w(|r| &r.expected, "expected"),
        w(|r| &r.actual, "actual"),
    );
    let mut s = format!(
        "{:<wc$}  {:<we$}  {:<wa$}  {:<9}  ok\n",
        "case", "expected", "actual", "verdict"
    );
    for r in rows {
        s += &format!(
            "{:<wc$}  {:<we$}  {:<wa$}  {:<9}  {}\n",
            r.case,
            r.expected,
            r.actual,
            r.verdict,
            if r.ok { "yes" } else { "NO" }
        );
    }
    let bad = rows.iter().filter(|r| !r.ok).count();
    s += &format!(
        "{} cases: {} as expected, {bad} not\n",
        rows.len(),
        rows.len() - bad
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(text: &str) -> Result<Case> {
        Case::parse(text, Path::new("redteam/x.toml"))
    }

    #[test]
    fn the_repository_corpus_loads_and_covers_both_sides() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../redteam");
        let cases = load(&dir).unwrap();
        let cheats = cases.iter().filter(|c| !c.1.control()).count();
        assert!(cheats >= 20, "{cheats} cheats");
        assert_eq!(cases.iter().filter(|c| c.1.control()).count(), 2);
        // Each cheat's edits apply to its track's pinned baseline.
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let tracks = crate::track::load_dir(&repo.join("tracks")).unwrap();
        for (name, c) in &cases {
            let t = tracks
                .get(&c.track)
                .unwrap_or_else(|| panic!("{name}: no track {}", c.track));
            let e = c
                .entries(&repo, &t.baseline)
                .unwrap_or_else(|e| panic!("{name}: {e:#}"));
            assert!(!e.is_empty(), "{name}");
        }
    }

    #[test]
    fn a_malformed_case_is_named() {
        let e = |t: &str| format!("{:#}", case(t).unwrap_err());
        let head = "description = \"d\"\ntrack = \"t\"\n";
        assert!(e(&format!(
            "{head}stage = \"policy\"\ncategory = \"policy:link\"\n"
        ))
        .contains("redteam/x.toml: a case has a patch, edits or raw entries"));
        assert!(e(&format!(
            "{head}stage = \"policy\"\ncategory = \"passed\"\n[[entry]]\npath = \"a\"\nfifo = true\n"
        ))
        .contains("a control is stage \"verdict\""));
        assert!(e(&format!(
            "{head}stage = \"policy\"\ncategory = \"policy:link\"\n[[entry]]\npath = \"a\"\nfifo = true\ndevice = true\n"
        ))
        .contains("entry a: exactly one of"));
        assert!(e(&format!("{head}stage = 3\n")).contains("redteam/x.toml"));
    }

    #[test]
    fn an_edit_must_find_its_text_once() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let g = |args: &[&str]| {
            let o = std::process::Command::new("git")
                .arg("-C")
                .arg(d)
                .args(args)
                .output()
                .unwrap();
            assert!(o.status.success(), "{o:?}");
            String::from_utf8(o.stdout).unwrap()
        };
        g(&["init", "-q"]);
        std::fs::write(d.join("a.rs"), "x\ny\ny\n").unwrap();
        g(&["add", "a.rs"]);
        g(&[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-qm",
            "a",
        ]);
        let base = g(&["rev-parse", "HEAD"]).trim().to_string();
        let c = |find: &str| {
            case(&format!(
                "description = \"d\"\ntrack = \"t\"\nstage = \"gate\"\ncategory = \"gate:x\"\n\
                 [[edit]]\npath = \"a.rs\"\nfind = \"{find}\"\nreplace = \"z\"\n\
                 [[edit]]\npath = \"a.rs\"\nreplace = \"w\\n\"\n"
            ))
            .unwrap()
        };
        let e = c("x").entries(d, &base).unwrap();
        match &e[..] {
            [(p, Content::File(data, 0o644))] => {
                assert_eq!(
                    (p.as_str(), data.as_slice()),
                    ("a.rs", b"z\ny\ny\nw\n".as_slice())
                )
            }
            _ => panic!("one file"),
        }
        let err = format!("{:#}", c("y").entries(d, &base).unwrap_err());
        assert!(
            err.contains("edit of a.rs: its find text is 2 times"),
            "{err}"
        );
    }
}
