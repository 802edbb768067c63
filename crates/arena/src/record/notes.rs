//! A submission's note: untrusted Markdown, bounded at intake and rendered once. Intake refuses
//! a note over 64 KiB, one whose elements nest deeper than `MAX_DEPTH` (block quotes, lists,
//! emphasis: the sanitiser's time grows faster than the depth, 30,000 nested `>` took seconds),
//! and one that renders to more than `MAX_HTML_BYTES`; it renders the note on a blocking thread,
//! never on the async executor, and stores the HTML with the submission. The pages serve what
//! is stored; a note stored before that (no HTML yet) is rendered on its first view, off the
//! executor, one at a time, and stored.

use anyhow::{Context, Result};
use pulldown_cmark::{html, Event, Options, Parser};
use sqlx::Row;

use crate::service::db::Db;

/// The most bytes of Markdown a note may have.
pub const MAX_BYTES: usize = 64 << 10;
/// The deepest its elements may nest (each block quote, list, list item, paragraph, emphasis
/// … is a level): 32 nested `>` and their paragraph are 33.
pub const MAX_DEPTH: usize = 32;
/// The most bytes of HTML a note may render to.
pub const MAX_HTML_BYTES: usize = 1 << 20;

const OPTIONS: Options = Options::ENABLE_TABLES.union(Options::ENABLE_STRIKETHROUGH);

/// How deep the elements of `events` nest.
fn depth(events: &[Event]) -> usize {
    let (mut d, mut max) = (0usize, 0usize);
    for e in events {
        match e {
            Event::Start(_) => {
                d += 1;
                max = max.max(d);
            }
            Event::End(_) => d = d.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// A note as sanitised HTML (no script, no event handler, no style; links get `rel="noopener
/// noreferrer"`), or why it is refused, naming `note`. Takes up to a few hundred milliseconds
/// of CPU: call it off the executor (`render_off_executor`).
pub fn render(markdown: &str) -> std::result::Result<String, String> {
    #[cfg(test)]
    watch::rendering(markdown);
    if markdown.trim().is_empty() || markdown.len() > MAX_BYTES {
        return Err(format!(
            "note: 1 byte to 64 KiB of Markdown (it has {} bytes)",
            markdown.len()
        ));
    }
    let events: Vec<Event> = Parser::new_ext(markdown, OPTIONS).collect();
    let d = depth(&events);
    if d > MAX_DEPTH {
        return Err(format!(
            "note: its Markdown nests {d} levels deep (block quotes, lists, emphasis, …); at \
             most {MAX_DEPTH}"
        ));
    }
    let too_big =
        || format!("note: it renders to more than {MAX_HTML_BYTES} bytes of HTML (1 MiB)");
    // Written up to the bound and no further (a table's short rows are padded to its header's
    // columns: a few bytes of Markdown can be kilobytes of HTML).
    let mut raw = Bounded(String::new());
    if html::write_html_fmt(&mut raw, events.into_iter()).is_err() {
        return Err(too_big());
    }
    let clean = ammonia::clean(&raw.0);
    if clean.len() > MAX_HTML_BYTES {
        return Err(too_big());
    }
    Ok(clean)
}

/// HTML up to `MAX_HTML_BYTES`: a write past it fails.
struct Bounded(String);

impl std::fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if self.0.len() + s.len() > MAX_HTML_BYTES {
            return Err(std::fmt::Error);
        }
        self.0.push_str(s);
        Ok(())
    }
}

/// `render` on a blocking thread, so that a slow note never holds the executor that answers
/// every other request.
pub async fn render_off_executor(markdown: String) -> Result<std::result::Result<String, String>> {
    tokio::task::spawn_blocking(move || render(&markdown))
        .await
        .context("rendering a note")
}

/// What a page shows for a note stored before these bounds that does not meet them.
fn not_shown(why: &str) -> String {
    let text = why
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    format!("<p><em>This note is not shown: {text}</em></p>")
}

/// The stored HTML of `id`'s note: `None` for no such submission, `Some(None)` when not
/// rendered yet.
async fn stored(db: &Db, id: &str) -> Result<Option<(String, Option<String>)>> {
    let r = sqlx::query("SELECT note, note_html FROM submissions WHERE id = $1")
        .bind(id)
        .fetch_optional(&db.pool)
        .await?;
    r.map(|r| Ok((r.try_get("note")?, r.try_get("note_html")?)))
        .transpose()
}

/// First views of unrendered notes take turns, so that each is rendered once however many
/// views of it arrive together.
static FIRST_VIEWS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The note of submission `id` as HTML, as stored; a note stored before intake rendered notes
/// is rendered now (off the executor, once) and stored. `None`: no such submission.
pub async fn html(db: &Db, id: &str) -> Result<Option<String>> {
    match stored(db, id).await? {
        None => return Ok(None),
        Some((_, Some(h))) => return Ok(Some(h)),
        Some((_, None)) => {}
    }
    let _turn = FIRST_VIEWS.lock().await;
    let Some((note, done)) = stored(db, id).await? else {
        return Ok(None);
    };
    if let Some(h) = done {
        return Ok(Some(h));
    }
    let h = render_off_executor(note)
        .await?
        .unwrap_or_else(|why| not_shown(&why));
    sqlx::query("UPDATE submissions SET note_html = $1 WHERE id = $2 AND note_html IS NULL")
        .bind(&h)
        .bind(id)
        .execute(&db.pool)
        .await?;
    Ok(Some(h))
}

/// Tests watch renders of the notes that carry their own marker (tests run in parallel, each
/// with its notes): how many, on which thread, or hold one while other requests go on.
#[cfg(test)]
pub(crate) mod watch {
    use std::sync::{Arc, Mutex};

    type Hook = Arc<dyn Fn() + Send + Sync>;

    static HOOKS: Mutex<Vec<(String, Hook)>> = Mutex::new(Vec::new());

    /// Calls `f` at the start of every render of a note containing `marker`.
    pub fn on(marker: &str, f: impl Fn() + Send + Sync + 'static) {
        HOOKS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((marker.to_string(), Arc::new(f)));
    }

    pub(super) fn rendering(markdown: &str) {
        let hooks: Vec<Hook> = HOOKS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(m, _)| markdown.contains(m.as_str()))
            .map(|(_, h)| h.clone())
            .collect();
        for h in hooks {
            h();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hostile_note_loses_its_script_and_keeps_its_text() {
        let html = render(
            "# Faster matvec\n\n**four rows** at a time.\n\n<script>document.title='pwned'</script>\n\n\
             <img src=x onerror=\"alert(1)\">\n\n[link](javascript:alert(2)) <a href=\"https://example.invalid\" onclick=\"x()\">ok</a>\n",
        )
        .unwrap();
        assert!(html.contains("<h1>Faster matvec</h1>"), "{html}");
        assert!(html.contains("<strong>four rows</strong>"), "{html}");
        for bad in ["<script", "pwned", "onerror", "onclick", "javascript:"] {
            assert!(!html.contains(bad), "{bad} survived: {html}");
        }
        assert!(html.contains("rel=\"noopener noreferrer\""), "{html}");
    }

    #[test]
    fn a_note_nested_past_the_bound_is_refused_naming_note() {
        // What the red team sent: 30,000 nested block quotes (813 KB and 2.4 s a view).
        let e = render(&(">".repeat(30_000) + " x\n")).unwrap_err();
        assert!(
            e.starts_with("note: ") && e.contains("30001 levels deep"),
            "{e}"
        );
        // 32 quotes and their paragraph are 33 levels; lists and emphasis count alike.
        let e = render(&(">".repeat(32) + " x\n")).unwrap_err();
        assert!(e.starts_with("note: ") && e.contains("33 levels"), "{e}");
        let e = render(&("> - ".repeat(16) + "x\n")).unwrap_err();
        assert!(e.starts_with("note: ") && e.contains("at most 32"), "{e}");
        let mut em = String::new();
        for i in 0..40 {
            em += if i % 2 == 0 { "*a " } else { "_b " };
        }
        em += "x";
        for i in (0..40).rev() {
            em += if i % 2 == 0 { " a*" } else { " b_" };
        }
        assert!(render(&em).unwrap_err().contains("41 levels"));
        for empty in ["", " \n\t"] {
            assert!(render(empty)
                .unwrap_err()
                .starts_with("note: 1 byte to 64 KiB"));
        }
        let e = render(&"x".repeat(MAX_BYTES + 1)).unwrap_err();
        assert!(e.starts_with("note: 1 byte to 64 KiB"), "{e}");
    }

    #[test]
    fn a_note_at_the_bounds_renders_to_bounded_html() {
        // At the depth bound: 31 quotes and their paragraph.
        let one = ">".repeat(31) + " x\n\n";
        let html = render(&one).unwrap();
        assert_eq!(html.matches("<blockquote>").count(), 31);
        // As many of those as 64 KiB holds would render to 1.5 MB: refused by its size.
        let many = one.repeat(MAX_BYTES / one.len());
        assert!(many.len() <= MAX_BYTES);
        let e = render(&many).unwrap_err();
        assert!(
            e.starts_with("note: it renders to more than 1048576 bytes"),
            "{e}"
        );
        // A table's short rows under a thousand columns, refused.
        let mut table = "|a".repeat(1000) + "\n" + &"|-".repeat(1000) + "\n";
        while table.len() + 2 <= MAX_BYTES {
            table += "x\n";
        }
        assert!(render(&table)
            .unwrap_err()
            .starts_with("note: it renders to "));
        // Half of the quotes fit: every note that passes renders to at most 1 MiB.
        let half = one.repeat(MAX_BYTES / one.len() / 2);
        let html = render(&half).unwrap();
        assert!(html.len() <= MAX_HTML_BYTES, "{}", html.len());
    }
}
