//! The service's answers to the red team's free abuses (issue 42, issue 43 item 7), on a real
//! database (each on SQLite and PostgreSQL where the database is what is tested): the daily
//! cap counts unfinished submissions and, beyond an allowance, candidate-caused infrastructure
//! failures; an operator cancels a job; notes are bounded, rendered once off the executor and
//! served as stored; an inconclusive pricing runs once more. Requests go to the handlers as
//! axum calls them; the runner's side is played here through the same functions its routes
//! call (`lease`, `verdict::on_report`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{json, Value};
use sqlx::Row;

use crate::api::{encode_bundle, NewSubmission, Report};
use crate::record::{cancel, notes, verdict};
use crate::server::{intake, pages};
use crate::service::caps::{self, CANCELLED};
use crate::service::lease::{self, Leased};
use crate::service::testdb::{base, service, On};
use crate::service::{stages, AppState, Service};

const TRACK: &str = "serial-tiny";

/// A service on `on` with the tracks' baseline rows, serial-tiny's daily cap `cap`, and a
/// solver alice.
async fn arena(dir: &std::path::Path, on: On, cap: u32) -> (AppState, String) {
    let mut s: Service = service(dir, on).await;
    for t in s.tracks.keys() {
        base(&s.db, t).await;
    }
    s.tracks.get_mut(TRACK).unwrap().caps.failures_per_day = cap;
    let token = crate::service::state::add_token(&s.db, "solvers", "alice", "", |_| Ok(()))
        .await
        .unwrap();
    (Arc::new(s), token)
}

async fn body(r: Response) -> (StatusCode, HeaderMap, String) {
    let (parts, b) = r.into_parts();
    let b = axum::body::to_bytes(b, usize::MAX).await.unwrap();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&b).into(),
    )
}

/// `POST /api/submissions` of a no-op with `note`: (status, body).
async fn post_note(s: &AppState, token: &str, key: &str, note: &str) -> (StatusCode, String) {
    let (st, _, b) = post_full(s, token, key, note).await;
    (st, b)
}

async fn post_full(
    s: &AppState,
    token: &str,
    key: &str,
    note: &str,
) -> (StatusCode, HeaderMap, String) {
    let mut h = HeaderMap::new();
    h.insert("authorization", format!("Bearer {token}").parse().unwrap());
    h.insert("idempotency-key", key.parse().unwrap());
    let req = NewSubmission {
        track: TRACK.into(),
        note: note.into(),
        model: None,
        claimed_score: None,
        bundle: encode_bundle(&crate::bundle::pack(&[]).unwrap()),
        mode: Default::default(),
        local_result: None,
    };
    let b = Bytes::from(serde_json::to_vec(&req).unwrap());
    match intake(State(s.clone()), h, b).await {
        Ok(r) => body(r).await,
        Err(e) => body(axum::response::IntoResponse::into_response(e)).await,
    }
}

async fn post(s: &AppState, token: &str, key: &str) -> (StatusCode, String) {
    post_note(s, token, key, &format!("# {key}")).await
}

fn id_of(answer: &(StatusCode, String)) -> String {
    assert_eq!(answer.0, StatusCode::CREATED, "{}", answer.1);
    let v: Value = serde_json::from_str(&answer.1).unwrap();
    v["id"].as_str().unwrap().to_string()
}

/// Moves a queued submission on to `stage` (what earlier reports would have done) and leases it
/// to runner r1, a CPU builder.
async fn leased_at(s: &Service, id: &str, stage: &str) -> Leased {
    let kind = stages::kind(stage, &s.tracks[TRACK]);
    sqlx::query("UPDATE submissions SET next_stage = $1, next_kind = $2 WHERE id = $3")
        .bind(stage)
        .bind(&kind)
        .bind(id)
        .execute(&s.db.pool)
        .await
        .unwrap();
    take(s, id).await
}

/// Runner r1 leases the next job, which must be `id`.
async fn take(s: &Service, id: &str) -> Leased {
    let l = lease::take(&s.db, "r1", "cpu", true, s.lease_ms)
        .await
        .unwrap()
        .expect("a job to lease");
    assert_eq!(l.submission, id);
    l
}

fn report(l: &Leased, outcome: &str, result: Value, candidate_caused: bool) -> Report {
    Report {
        submission: l.submission.clone(),
        lease_id: l.lease_id.clone(),
        stage: l.stage.clone(),
        outcome: outcome.into(),
        detail: format!("{outcome} as reported"),
        result,
        builder: true,
        candidate_caused,
    }
}

/// Runner r1 reports `outcome` for its lease `l`.
async fn reports(s: &Service, l: &Leased, outcome: &str, candidate_caused: bool) {
    let rep = report(l, outcome, Value::Null, candidate_caused);
    if let Err(e) = verdict::on_report(s, "r1", "cpu", &rep).await {
        panic!("{}", e.1);
    }
}

/// (stage, outcome) of each of `id`'s rows.
async fn rows(s: &Service, id: &str) -> Vec<(String, String)> {
    stages::list(&s.db, id)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.stage, r.outcome.unwrap_or_default()))
        .collect()
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

/// (status, category, attributable, candidate_caused) of `id`.
async fn ending(s: &Service, id: &str) -> (String, Option<String>, i64, i64) {
    let r = sqlx::query(
        "SELECT status, category, attributable, candidate_caused FROM submissions WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&s.db.pool)
    .await
    .unwrap();
    (
        r.try_get("status").unwrap(),
        r.try_get("category").unwrap(),
        r.try_get("attributable").unwrap(),
        r.try_get("candidate_caused").unwrap(),
    )
}

/// Every scenario on SQLite and on PostgreSQL (`tools/test.sh` starts its server).
macro_rules! on_both_databases {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn on_sqlite() {
                super::$scenario(crate::service::testdb::On::Sqlite).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn on_postgresql() {
                super::$scenario(crate::service::testdb::On::Postgres).await;
            }
        }
    )*};
}

on_both_databases!(
    unfinished_submissions_count_against_the_cap,
    many_submissions_at_once_are_counted_one_after_another,
    candidate_caused_infra_failures_count_beyond_the_free_allowance,
    an_operator_cancels_a_job_and_its_runner_loses_the_lease,
    an_inconclusive_pricing_runs_once_more_and_a_second_one_ends_it,
    a_page_serves_the_stored_note_and_renders_an_old_one_once,
);

/// The red team's 14 bad bundles posted before any was judged: only the cap's worth are taken.
async fn unfinished_submissions_count_against_the_cap(on: On) {
    let dir = tempfile::tempdir().unwrap();
    let (s, alice) = arena(dir.path(), on, 3).await;
    let mut answers = vec![];
    for i in 0..14 {
        answers.push(post(&s, &alice, &format!("k{i}")).await);
    }
    let taken = answers
        .iter()
        .filter(|a| a.0 == StatusCode::CREATED)
        .count();
    assert_eq!(taken, 3, "{answers:?}");
    let (st, h, msg) = post_full(&s, &alice, "k99", "# again").await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        msg.contains("3 count against your daily cap of 3 on track serial-tiny")
            && msg.contains("3 submission(s) queued or running")
            && msg.contains("retry when one of your queued or running submissions has finished"),
        "{msg}"
    );
    assert_eq!(
        h["retry-after"],
        caps::IN_FLIGHT_RETRY_S.to_string().as_str()
    );
    // A key already used still answers with its submission; another solver is not capped.
    assert_eq!(post(&s, &alice, "k0").await.0, StatusCode::OK);
    let bob = crate::service::state::add_token(&s.db, "solvers", "bob", "", |_| Ok(()))
        .await
        .unwrap();
    id_of(&post(&s, &bob, "b0").await);
    // One of alice's passes (held): a place is free again. A re-pricing the service queued for
    // her is not hers to count.
    let first = id_of(&answers[0]);
    sqlx::query(
        "UPDATE submissions SET status = 'held', next_stage = NULL, next_kind = NULL, \
         finished_ms = 1 WHERE id = $1",
    )
    .bind(&first)
    .execute(&s.db.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO submissions (id, solver, track, idempotency_key, note, bundle_digest, \
         base_commit, reprice_of, created_ms, status, next_stage, next_kind) VALUES \
         ('s-re', 'alice', 'serial-tiny', 'reprice:x', 'n', 'd', 'b1', $1, 5, 'queued', \
         'policy', 'builder')",
    )
    .bind(&first)
    .execute(&s.db.pool)
    .await
    .unwrap();
    id_of(&post(&s, &alice, "k100").await);
    assert_eq!(
        post(&s, &alice, "k101").await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// Fourteen at once: each is counted after the ones before it were added.
async fn many_submissions_at_once_are_counted_one_after_another(on: On) {
    let dir = tempfile::tempdir().unwrap();
    let (s, alice) = arena(dir.path(), on, 3).await;
    let tasks: Vec<_> = (0..14)
        .map(|i| {
            let (s, alice) = (s.clone(), alice.clone());
            tokio::spawn(async move { post(&s, &alice, &format!("p{i}")).await })
        })
        .collect();
    let mut answers = vec![];
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    let taken = answers
        .iter()
        .filter(|a| a.0 == StatusCode::CREATED)
        .count();
    let capped = answers
        .iter()
        .filter(|a| a.0 == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!((taken, capped), (3, 11), "{answers:?}");
}

/// Runner-caused infra failures are free; the candidate's own are free twice a day, then count
/// as failures do; attributable failures count; a queued one counts.
async fn candidate_caused_infra_failures_count_beyond_the_free_allowance(on: On) {
    let dir = tempfile::tempdir().unwrap();
    let (s, alice) = arena(dir.path(), on, 3).await;
    let mut n = 0;
    let mut fails = |outcome: &'static str, candidate: bool| {
        n += 1;
        let (s, alice) = (s.clone(), alice.clone());
        async move {
            let id = id_of(&post(&s, &alice, &format!("f{n}")).await);
            let l = leased_at(&s, &id, stages::GATE).await;
            reports(&s, &l, outcome, candidate).await;
            id
        }
    };
    let track = &s.tracks[TRACK];
    let usage = || async {
        let mut c = s.db.pool.acquire().await.unwrap();
        caps::usage(&mut c, "alice", track, crate::service::db::now_ms())
            .await
            .unwrap()
    };
    for _ in 0..3 {
        let id = fails("infra:runner", false).await;
        assert_eq!(
            ending(&s, &id).await,
            ("failed".into(), Some("infra:runner".into()), 0, 0)
        );
    }
    assert_eq!(usage().await.counted(), 0);
    for _ in 0..2 {
        let id = fails("infra:worker_crashed", true).await;
        let e = ending(&s, &id).await;
        assert_eq!((e.2, e.3), (0, 1), "{e:?}");
    }
    assert_eq!(usage().await.counted(), 0);
    fails("infra:worker_hung", true).await;
    assert_eq!(usage().await.counted(), 1);
    let id = fails("gate:fidelity_divergence", false).await;
    assert_eq!(ending(&s, &id).await.2, 1);
    assert_eq!(usage().await.counted(), 2);
    id_of(&post(&s, &alice, "queued").await);
    let (st, h, msg) = post_full(&s, &alice, "refused", "# refused").await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{msg}");
    assert!(
        msg.contains(
            "1 failure(s) in the last day, 1 candidate-caused infra failure(s) beyond the 2 \
             free a day (3 in all), 1 submission(s) queued or running"
        ),
        "{msg}"
    );
    // The oldest counted failure ages out in a day, which frees a place.
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((86_000..=86_400).contains(&retry), "{retry}");
    assert!(msg.contains(&format!("retry in {retry} s")), "{msg}");
}

async fn an_operator_cancels_a_job_and_its_runner_loses_the_lease(on: On) {
    let dir = tempfile::tempdir().unwrap();
    let (s, alice) = arena(dir.path(), on, 1).await;
    let id = id_of(&post(&s, &alice, "running").await);
    let l = leased_at(&s, &id, stages::PRICE).await;
    // A heartbeat's progress is the running stage's detail: one line, capped.
    let long = format!("3/10 pairs\u{1b}[2J\n{}", "x".repeat(1000));
    assert!(
        lease::heartbeat(&s.db, &id, &l.lease_id, s.lease_ms, Some(&long))
            .await
            .unwrap()
    );
    let running = stages::list(&s.db, &id).await.unwrap().pop().unwrap();
    let detail = running.detail.unwrap();
    assert!(running.outcome.is_none() && detail.starts_with("3/10 pairs[2Jxxx"));
    assert_eq!(detail.chars().count(), lease::PROGRESS_CHARS);
    assert_eq!(cancel::cancel(&s.db, &id).await.unwrap(), stages::PRICE);
    // The runner's next heartbeat, and its report, are refused: it stops, and its progress
    // never reaches the record.
    assert!(
        !lease::heartbeat(&s.db, &id, &l.lease_id, s.lease_ms, Some("lost"))
            .await
            .unwrap()
    );
    let all = stages::list(&s.db, &id).await.unwrap();
    assert!(all.iter().all(|r| r.detail.as_deref() != Some("lost")));
    let e = verdict::on_report(&s, "r1", "cpu", &report(&l, "ok", Value::Null, false))
        .await
        .expect_err("a refusal");
    assert_eq!(e.0, StatusCode::CONFLICT);
    assert_eq!(
        ending(&s, &id).await,
        ("failed".into(), Some(CANCELLED.into()), 0, 0)
    );
    assert_eq!(
        rows(&s, &id).await,
        pairs(&[("price", CANCELLED), ("verdict", "failed")])
    );
    let list = stages::list(&s.db, &id).await.unwrap();
    assert_eq!(list[0].detail.as_deref(), Some(cancel::DETAIL));
    assert_eq!(
        list[1].detail.as_deref(),
        Some("cancelled at price: cancelled by an operator")
    );
    // Not counted: alice (cap 1) may submit again, and a queued job cancels too, never leased.
    let queued = id_of(&post(&s, &alice, "queued").await);
    assert_eq!(
        cancel::cancel(&s.db, &queued).await.unwrap(),
        stages::POLICY
    );
    assert_eq!(rows(&s, &queued).await, pairs(&[("verdict", "failed")]));
    assert!(lease::take(&s.db, "r1", "cpu", true, s.lease_ms)
        .await
        .unwrap()
        .is_none());
    // A finished or unknown submission: an error naming it.
    let e = format!("{:#}", cancel::cancel(&s.db, &id).await.unwrap_err());
    assert!(
        e.contains(&id) && e.contains("already finished (failed)"),
        "{e}"
    );
    let e = format!("{:#}", cancel::cancel(&s.db, "s-nope").await.unwrap_err());
    assert!(
        e.contains("s-nope") && e.contains("no such submission"),
        "{e}"
    );
}

/// A pricing's private result whose interval is `ci` (the current best is 1.0, the margin 1 %).
fn priced(ci: [f64; 2]) -> Value {
    let score = (ci[0] + ci[1]) / 2.0;
    json!({"metrics": {"score": score, "ci95": ci}, "pool_index": 0, "pairs": []})
}

async fn an_inconclusive_pricing_runs_once_more_and_a_second_one_ends_it(on: On) {
    let dir = tempfile::tempdir().unwrap();
    let (s, alice) = arena(dir.path(), on, 10).await;
    let inconclusive = stages::INCONCLUSIVE;

    // Inconclusive, then priced again (back in the queue, as an expired lease's stage): held.
    let id = id_of(&post(&s, &alice, "once").await);
    let l = leased_at(&s, &id, stages::PRICE).await;
    reports(&s, &l, inconclusive, false).await;
    let v = sqlx::query("SELECT status, next_stage, lease_id FROM submissions WHERE id = $1")
        .bind(&id)
        .fetch_one(&s.db.pool)
        .await
        .unwrap();
    assert_eq!(v.try_get::<String, _>("status").unwrap(), "queued");
    assert_eq!(
        v.try_get::<Option<String>, _>("next_stage")
            .unwrap()
            .as_deref(),
        Some("price")
    );
    assert_eq!(v.try_get::<Option<String>, _>("lease_id").unwrap(), None);
    let l = take(&s, &id).await;
    assert_eq!(l.stage, stages::PRICE);
    let rep = report(&l, "ok", priced([0.98, 1.02]), false);
    verdict::on_report(&s, "r1", "cpu", &rep)
        .await
        .ok()
        .unwrap();
    assert_eq!(
        rows(&s, &id).await,
        pairs(&[
            ("price", inconclusive),
            ("price", "ok"),
            ("verdict", "held")
        ])
    );
    let first = &stages::list(&s.db, &id).await.unwrap()[0];
    assert!(first
        .detail
        .as_deref()
        .unwrap()
        .ends_with("inconclusive once: this stage runs again"));

    // Twice: failed as before, not the solver's fault.
    let id = id_of(&post(&s, &alice, "twice").await);
    let l = leased_at(&s, &id, stages::PRICE).await;
    reports(&s, &l, inconclusive, false).await;
    let l = take(&s, &id).await;
    reports(&s, &l, inconclusive, false).await;
    assert_eq!(
        rows(&s, &id).await,
        pairs(&[
            ("price", inconclusive),
            ("price", inconclusive),
            ("verdict", "failed")
        ])
    );
    assert_eq!(
        ending(&s, &id).await,
        ("failed".into(), Some(inconclusive.into()), 0, 0)
    );

    // The confirmation likewise: once more, then held as before with its first pricing.
    let id = id_of(&post(&s, &alice, "confirm").await);
    let l = leased_at(&s, &id, stages::PRICE).await;
    let rep = report(&l, "ok", priced([1.5, 1.6]), false);
    let kept = verdict::on_report(&s, "r1", "cpu", &rep)
        .await
        .ok()
        .unwrap();
    assert_eq!(
        kept,
        Some((l.lease_id.clone(), stages::CONFIRM.to_string()))
    );
    let confirm = Leased {
        stage: stages::CONFIRM.into(),
        ..l
    };
    reports(&s, &confirm, inconclusive, false).await;
    let l = take(&s, &id).await;
    assert_eq!(l.stage, stages::CONFIRM);
    reports(&s, &l, inconclusive, false).await;
    assert_eq!(
        rows(&s, &id).await,
        pairs(&[
            ("price", "ok"),
            ("confirm", inconclusive),
            ("confirm", inconclusive),
            ("verdict", "held")
        ])
    );
}

/// The HTML stored beside submission `id`'s note: none until the note is rendered.
async fn stored_note_html(s: &AppState, id: &str) -> Option<String> {
    sqlx::query("SELECT note_html FROM submissions WHERE id = $1")
        .bind(id)
        .fetch_one(&s.db.pool)
        .await
        .unwrap()
        .try_get("note_html")
        .unwrap()
}

/// A page view serves the note's stored HTML and renders nothing; a note stored before notes
/// were rendered at intake is rendered once, however many views arrive together, and stored.
async fn a_page_serves_the_stored_note_and_renders_an_old_one_once(on: On) {
    let dir = tempfile::tempdir().unwrap();
    let (s, alice) = arena(dir.path(), on, 10).await;
    let marker = format!("note-{}", hex::encode(rand::random::<[u8; 8]>()));
    let renders = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let r = renders.clone();
    notes::watch::on(&marker, move || {
        r.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    let count = || renders.load(std::sync::atomic::Ordering::SeqCst);
    let id = id_of(&post_note(&s, &alice, "n1", &format!("# Fast\n\n*{marker}*")).await);
    assert_eq!(count(), 1, "rendered at intake");
    let html = |s: AppState, id: String| async move {
        body(pages::submission(State(s), Default::default(), UrlPath(id)).await)
            .await
            .2
    };
    let page = html(s.clone(), id.clone()).await;
    assert!(
        page.contains(&format!("<h1>Fast</h1>\n<p><em>{marker}</em></p>")),
        "{page}"
    );
    assert_eq!(count(), 1, "a view renders nothing");
    let set = |h: Option<String>| {
        let (s, id) = (s.clone(), id.clone());
        async move {
            sqlx::query("UPDATE submissions SET note_html = $1 WHERE id = $2")
                .bind(h)
                .bind(id)
                .execute(&s.db.pool)
                .await
                .unwrap();
        }
    };
    set(Some(format!("<p>as stored {marker}</p>"))).await;
    assert!(html(s.clone(), id.clone()).await.contains("<p>as stored "));
    // A note from before: four views at once, one render, stored.
    set(None).await;
    let views: Vec<_> = (0..4)
        .map(|_| tokio::spawn(html(s.clone(), id.clone())))
        .collect();
    for v in views {
        assert!(v.await.unwrap().contains("<h1>Fast</h1>"));
    }
    assert_eq!(count(), 2);
    let stored = stored_note_html(&s, &id).await;
    assert!(stored.unwrap().contains("<h1>Fast</h1>"));
    // A hostile note from before the bounds: not shown, and not rendered past its depth.
    sqlx::query(
        "INSERT INTO submissions (id, solver, track, idempotency_key, note, bundle_digest, \
         base_commit, created_ms, status) VALUES ('s-deep', 'alice', 'serial-tiny', 'deep', $1, \
         'd', 'b0', 5, 'failed')",
    )
    .bind(">".repeat(30_000) + &marker)
    .execute(&s.db.pool)
    .await
    .unwrap();
    let page = html(s.clone(), "s-deep".into()).await;
    assert!(
        page.contains("This note is not shown: note: its Markdown nests 30001 levels deep"),
        "{}",
        &page[..page.len().min(3000)]
    );
    assert!(!page.contains("<blockquote>"));
}

/// At intake a note over the bounds is refused, naming `note`, before anything is stored; one
/// within them is stored with its HTML.
#[tokio::test]
async fn intake_refuses_a_note_past_the_bounds_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let (s, alice) = arena(dir.path(), On::Sqlite, 10).await;
    for (note, says) in [
        (
            ">".repeat(30_000) + " x",
            "note: its Markdown nests 30001 levels deep",
        ),
        ("> - ".repeat(16) + "x", "at most 32"),
        (
            "|a".repeat(1000) + "\n" + &"|-".repeat(1000) + &"\nx".repeat(25_000),
            "note: it renders to",
        ),
        ("x".repeat(notes::MAX_BYTES + 1), "note: 1 byte to 64 KiB"),
    ] {
        let (st, msg) = post_note(&s, &alice, "k", &note).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{msg}");
        assert!(msg.contains(says), "{msg}");
    }
    let n: i64 = sqlx::query("SELECT COUNT(*) AS n FROM submissions")
        .fetch_one(&s.db.pool)
        .await
        .unwrap()
        .try_get("n")
        .unwrap();
    assert_eq!(n, 0);
    let id = id_of(&post_note(&s, &alice, "k", &(">".repeat(31) + " x")).await);
    let stored = stored_note_html(&s, &id).await;
    assert_eq!(stored.unwrap().matches("<blockquote>").count(), 31);
}

/// A render in progress holds no request: the executor (one thread here) answers another
/// request while a note's render is held. A render on the executor thread fails this test at
/// once instead of hanging it.
#[tokio::test(flavor = "current_thread")]
async fn a_render_in_progress_holds_no_other_request() {
    let dir = tempfile::tempdir().unwrap();
    let (s, alice) = arena(dir.path(), On::Sqlite, 10).await;
    let marker = format!("held-{}", hex::encode(rand::random::<[u8; 8]>()));
    let executor = std::thread::current().id();
    let (started, started_rx) = std::sync::mpsc::channel::<()>();
    let (release, release_rx) = std::sync::mpsc::channel::<()>();
    let (started, release_rx) = (
        std::sync::Mutex::new(started),
        std::sync::Mutex::new(release_rx),
    );
    notes::watch::on(&marker, move || {
        assert_ne!(
            std::thread::current().id(),
            executor,
            "rendered on the executor"
        );
        let _ = started.lock().unwrap().send(());
        let _ = release_rx.lock().unwrap().recv();
    });
    // Until the render has begun (on another thread), or `task` ended without it.
    async fn begun<T>(rx: &std::sync::mpsc::Receiver<()>, task: &tokio::task::JoinHandle<T>) {
        while rx.try_recv().is_err() {
            assert!(!task.is_finished(), "it ended before its render began");
            tokio::task::yield_now().await;
        }
    }
    let (s2, a2, m2) = (s.clone(), alice.clone(), marker.clone());
    let held = tokio::spawn(async move { post_note(&s2, &a2, "held", &format!("# {m2}")).await });
    begun(&started_rx, &held).await;
    let (st, _, page) = body(pages::index(State(s.clone())).await).await;
    assert_eq!(st, StatusCode::OK);
    assert!(page.contains(TRACK));
    release.send(()).unwrap();
    let id = id_of(&held.await.unwrap());
    // The same on a first view of a note stored without its HTML.
    sqlx::query("UPDATE submissions SET note_html = NULL WHERE id = $1")
        .bind(&id)
        .execute(&s.db.pool)
        .await
        .unwrap();
    let (s2, id2) = (s.clone(), id.clone());
    let view = tokio::spawn(async move {
        pages::submission(State(s2), Default::default(), UrlPath(id2)).await
    });
    begun(&started_rx, &view).await;
    let (st, _, _) = body(pages::index(State(s.clone())).await).await;
    assert_eq!(st, StatusCode::OK);
    release.send(()).unwrap();
    let (st, _, page) = body(view.await.unwrap()).await;
    assert_eq!(st, StatusCode::OK);
    assert!(page.contains(&marker));
}

/// On PostgreSQL a report checks its lease with the row locked: a cancel in progress (the row
/// locked and its lease removed, not committed yet) makes the report wait and then refuse,
/// instead of reading the old lease and moving the job on over the cancel.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_report_waits_for_a_cancel_in_progress_on_postgresql() {
    let dir = tempfile::tempdir().unwrap();
    let (s, alice) = arena(dir.path(), On::Postgres, 10).await;
    let id = id_of(&post(&s, &alice, "race").await);
    let l = leased_at(&s, &id, stages::GATE).await;
    let mut cancelling = s.db.pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM submissions WHERE id = $1 FOR UPDATE")
        .bind(&id)
        .fetch_one(&mut *cancelling)
        .await
        .unwrap();
    sqlx::query("UPDATE submissions SET lease_id = NULL, next_stage = NULL WHERE id = $1")
        .bind(&id)
        .execute(&mut *cancelling)
        .await
        .unwrap();
    let (s2, rep) = (s.clone(), report(&l, "ok", Value::Null, false));
    let reporting =
        tokio::spawn(async move { verdict::on_report(&s2, "r1", "cpu", &rep).await.err() });
    // Until the report's transaction waits for the row (not a time: the server says so).
    loop {
        let waiting: i64 = sqlx::query(
            "SELECT COUNT(*) AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .fetch_one(&s.db.pool)
        .await
        .unwrap()
        .try_get("n")
        .unwrap();
        if waiting > 0 {
            break;
        }
        tokio::task::yield_now().await;
    }
    cancelling.commit().await.unwrap();
    let refused = reporting.await.unwrap().expect("a refusal");
    assert_eq!(refused.0, StatusCode::CONFLICT);
    let next: Option<String> = sqlx::query("SELECT next_stage FROM submissions WHERE id = $1")
        .bind(&id)
        .fetch_one(&s.db.pool)
        .await
        .unwrap()
        .try_get("next_stage")
        .unwrap();
    assert_eq!(next, None);
}

/// Every error under /api/ is `{"error": …}` (`docs/api.md`), axum's own rejections included, and
/// a runner route checks the token before it reads the body: a caller without a token gets 401
/// whatever it sends, one with a token a 422 or 413 that names the body.
/// One key casing across the API: every key of every public answer is snake_case (the track
/// view once mixed `runnerKind` and `createdMs` with the submissions' `created_ms`).
#[tokio::test]
async fn every_key_of_the_public_api_is_snake_case() {
    use axum::http::Request;
    use tower::ServiceExt;
    let dir = tempfile::tempdir().unwrap();
    let (s, alice) = arena(dir.path(), On::Sqlite, 10).await;
    let running = id_of(&post(&s, &alice, "running").await);
    leased_at(&s, &running, stages::PRICE).await;
    let queued = id_of(&post(&s, &alice, "queued").await);
    fn keys(v: &Value, at: &str, bad: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    let snake = k
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
                    if !snake {
                        bad.push(format!("{at}.{k}"));
                    }
                    keys(x, &format!("{at}.{k}"), bad);
                }
            }
            Value::Array(a) => a.iter().for_each(|x| keys(x, at, bad)),
            _ => {}
        }
    }
    let app = crate::server::router(s.clone());
    let mut bad = vec![];
    let mut track = Value::Null;
    for uri in [
        "/api/tracks".to_string(),
        format!("/api/tracks/{TRACK}"),
        format!("/api/tracks/{TRACK}/ledger"),
        "/api/solvers/alice/ledger".to_string(),
        format!("/api/submissions/{queued}"),
        format!("/api/submissions/{running}"),
        format!("/api/submissions?track={TRACK}"),
    ] {
        let req = Request::get(&uri).body(axum::body::Body::empty()).unwrap();
        let (st, _, text) = body(app.clone().oneshot(req).await.unwrap()).await;
        assert_eq!(st, StatusCode::OK, "{uri}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        keys(&v, &uri, &mut bad);
        if uri == format!("/api/tracks/{TRACK}") {
            track = v;
        }
    }
    // The walk saw the fields that were camelCase, and the queue's rows.
    assert!(track["runner_kind"].is_string() && track["rules"]["min_pairs"].is_u64());
    assert_eq!(track["queue"].as_array().unwrap().len(), 2, "{track}");
    assert!(bad.is_empty(), "keys not in snake_case: {bad:?}");
}

#[tokio::test]
async fn every_api_error_is_json_and_the_token_comes_first() {
    use axum::http::{Method, Request};
    use tower::ServiceExt;
    let dir = tempfile::tempdir().unwrap();
    let (s, solver) = arena(dir.path(), On::Sqlite, 10).await;
    let runner = crate::service::state::add_token(&s.db, "runners", "r1", "cpu", |_| Ok(()))
        .await
        .unwrap();
    let gpu = crate::service::state::add_token(&s.db, "runners", "g1", "cuda", |_| Ok(()))
        .await
        .unwrap();
    let app = crate::server::router(s.clone());
    let big = vec![b'x'; (2 << 20) + 1];
    // A submission's body with one field replaced.
    let submission = |field: &str, value: Value| {
        let mut v = serde_json::json!({
            "track": TRACK, "note": "why", "bundle": crate::api::encode_bundle(b"x")
        });
        v[field] = value;
        serde_json::to_vec(&v).unwrap()
    };
    // Method, path, token, body, the status and what its error says.
    type Case<'a> = (
        Method,
        &'a str,
        Option<&'a str>,
        Vec<u8>,
        StatusCode,
        &'a str,
    );
    let cases: Vec<Case> = vec![
        // No token: 401 before the body's type, shape or size is looked at.
        (
            Method::POST,
            "/api/runner/lease",
            None,
            b"not json".to_vec(),
            StatusCode::UNAUTHORIZED,
            "",
        ),
        (
            Method::POST,
            "/api/runner/report",
            None,
            big.clone(),
            StatusCode::UNAUTHORIZED,
            "",
        ),
        (
            Method::POST,
            "/api/runner/heartbeat",
            Some("r-nobody.secret"),
            vec![],
            StatusCode::UNAUTHORIZED,
            "",
        ),
        // A runner's token: the body, named.
        (
            Method::POST,
            "/api/runner/lease",
            Some(&runner),
            b"{".to_vec(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "the request body",
        ),
        (
            Method::POST,
            "/api/runner/report",
            Some(&runner),
            big,
            StatusCode::PAYLOAD_TOO_LARGE,
            "the request body",
        ),
        (
            Method::GET,
            "/api/builds/nothing-here",
            Some(&runner),
            vec![],
            StatusCode::NOT_FOUND,
            "nothing-here",
        ),
        // A cuda runner is not handed build jobs for saying it builds.
        (
            Method::POST,
            "/api/runner/lease",
            Some(&gpu),
            br#"{"builder": true}"#.to_vec(),
            StatusCode::FORBIDDEN,
            "only a cpu runner",
        ),
        // axum's own rejections.
        (
            Method::DELETE,
            "/api/tracks",
            None,
            vec![],
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed",
        ),
        (
            Method::GET,
            "/api/tracks/%FF",
            None,
            vec![],
            StatusCode::BAD_REQUEST,
            "UTF-8",
        ),
        (
            Method::GET,
            "/api/no/such/route",
            None,
            vec![],
            StatusCode::NOT_FOUND,
            "no route",
        ),
        // Tokens: absent, malformed, unknown, or another kind's, on each authenticated route.
        (
            Method::POST,
            "/api/submissions",
            None,
            submission("track", TRACK.into()),
            StatusCode::UNAUTHORIZED,
            "no bearer token",
        ),
        (
            Method::POST,
            "/api/submissions",
            Some("no-dot-here"),
            vec![],
            StatusCode::UNAUTHORIZED,
            "a malformed token",
        ),
        (
            Method::POST,
            "/api/submissions",
            Some(&runner),
            vec![],
            StatusCode::UNAUTHORIZED,
            "unknown token",
        ),
        (
            Method::POST,
            "/api/runner/lease",
            Some(&solver),
            b"{}".to_vec(),
            StatusCode::UNAUTHORIZED,
            "unknown token",
        ),
        (
            Method::GET,
            "/api/builds/k",
            Some("r1.wrong-secret"),
            vec![],
            StatusCode::UNAUTHORIZED,
            "unknown token",
        ),
        (
            Method::GET,
            "/api/hidden/sha256:00",
            None,
            vec![],
            StatusCode::UNAUTHORIZED,
            "no bearer token",
        ),
        (
            Method::GET,
            "/api/trees/0000000000000000000000000000000000000000",
            Some(&solver),
            vec![],
            StatusCode::UNAUTHORIZED,
            "unknown token",
        ),
        (
            Method::PUT,
            "/api/artifacts/sha256:00",
            None,
            b"x".to_vec(),
            StatusCode::UNAUTHORIZED,
            "no bearer token",
        ),
        // Intake without its Idempotency-Key.
        (
            Method::POST,
            "/api/submissions",
            Some(&solver),
            submission("track", TRACK.into()),
            StatusCode::BAD_REQUEST,
            "Idempotency-Key",
        ),
        // Wrong methods.
        (
            Method::GET,
            "/api/runner/lease",
            Some(&runner),
            vec![],
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed",
        ),
        (
            Method::PUT,
            "/api/submissions",
            Some(&solver),
            vec![],
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed",
        ),
        (
            Method::POST,
            "/api/builds/k",
            Some(&runner),
            vec![],
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed",
        ),
        // Ids and parameters that name nothing.
        (
            Method::GET,
            "/api/tracks/nope",
            None,
            vec![],
            StatusCode::NOT_FOUND,
            "no track nope",
        ),
        (
            Method::GET,
            "/api/submissions/nope",
            None,
            vec![],
            StatusCode::NOT_FOUND,
            "no submission nope",
        ),
        (
            Method::GET,
            "/api/submissions?color=red",
            None,
            vec![],
            StatusCode::BAD_REQUEST,
            "color",
        ),
        (
            Method::GET,
            "/api/submissions?track=nope",
            None,
            vec![],
            StatusCode::BAD_REQUEST,
            "nope",
        ),
        (
            Method::GET,
            "/api/submissions?page=0",
            None,
            vec![],
            StatusCode::BAD_REQUEST,
            "page",
        ),
        (
            Method::GET,
            "/api/submissions?status=won",
            None,
            vec![],
            StatusCode::BAD_REQUEST,
            "status",
        ),
        (
            Method::GET,
            "/api/hidden/sha256:00",
            Some(&runner),
            vec![],
            StatusCode::NOT_FOUND,
            "no track names it",
        ),
        (
            Method::PUT,
            "/api/artifacts/sha256:00",
            Some(&runner),
            b"x".to_vec(),
            StatusCode::BAD_REQUEST,
            "digest",
        ),
        // A runner's report and heartbeat for a lease it does not hold.
        (
            Method::POST,
            "/api/runner/heartbeat",
            Some(&runner),
            br#"{"submission": "s", "lease_id": "l"}"#.to_vec(),
            StatusCode::CONFLICT,
            "the lease is lost",
        ),
        (
            Method::POST,
            "/api/runner/report",
            Some(&runner),
            serde_json::to_vec(&serde_json::json!({
                "submission": "s", "lease_id": "l", "stage": "gate", "outcome": "ok",
                "detail": "", "result": null, "builder": false
            }))
            .unwrap(),
            StatusCode::CONFLICT,
            "the lease is lost",
        ),
        (
            Method::POST,
            "/api/runner/heartbeat",
            Some(&runner),
            br#"{"submission": 5}"#.to_vec(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "the request body",
        ),
    ];
    // Intake's body, each with an Idempotency-Key of its own (a key already used answers the
    // earlier submission, before the body is read).
    let keyed: Vec<Case> = vec![
        (
            Method::POST,
            "/api/submissions",
            Some(&solver),
            b"not json".to_vec(),
            StatusCode::BAD_REQUEST,
            "the request body",
        ),
        (
            Method::POST,
            "/api/submissions",
            Some(&solver),
            submission("track", 5.into()),
            StatusCode::BAD_REQUEST,
            "the request body",
        ),
        (
            Method::POST,
            "/api/submissions",
            Some(&solver),
            br#"{"track": "t", "note": "why"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "bundle",
        ),
        (
            Method::POST,
            "/api/submissions",
            Some(&solver),
            submission("track", "nope".into()),
            StatusCode::BAD_REQUEST,
            "no such track",
        ),
        (
            Method::POST,
            "/api/submissions",
            Some(&solver),
            submission("note", " \n".into()),
            StatusCode::BAD_REQUEST,
            "note",
        ),
        (
            Method::POST,
            "/api/submissions",
            Some(&solver),
            submission("model", "m".repeat(201).into()),
            StatusCode::BAD_REQUEST,
            "model",
        ),
        (
            Method::POST,
            "/api/submissions",
            Some(&solver),
            submission("claimed_score", "fast".into()),
            StatusCode::BAD_REQUEST,
            "the request body",
        ),
        (
            Method::POST,
            "/api/submissions",
            Some(&solver),
            submission("bundle", "%%%".into()),
            StatusCode::BAD_REQUEST,
            "bundle: not base64",
        ),
        (
            Method::POST,
            "/api/submissions",
            Some(&solver),
            submission(
                "bundle",
                crate::api::encode_bundle(b"not a gzip tar").into(),
            ),
            StatusCode::BAD_REQUEST,
            "bundle",
        ),
        (
            Method::POST,
            "/api/submissions",
            Some(&solver),
            vec![b'x'; (16 << 20) + 1],
            StatusCode::PAYLOAD_TOO_LARGE,
            "length limit",
        ),
    ];
    let mut wrong = vec![];
    let mut n = 0;
    let all = cases.into_iter().map(|c| (c, false));
    for (i, ((method, uri, token, payload, want, says), key)) in
        all.chain(keyed.into_iter().map(|c| (c, true))).enumerate()
    {
        let mut req = Request::builder().method(method.clone()).uri(uri);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        if key {
            req = req.header("idempotency-key", format!("k{i}"));
        }
        let r = app
            .clone()
            .oneshot(req.body(axum::body::Body::from(payload)).unwrap())
            .await
            .unwrap();
        let (st, headers, text) = body(r).await;
        let case = format!("{method} {uri}: {st} {text}");
        let error = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_string))
            .unwrap_or_default();
        // Every case is looked at, and every one that misbehaves is told.
        if st != want
            || headers.get("content-type").map(|v| v.as_bytes()) != Some(b"application/json")
            || error.is_empty()
            || !error.contains(says)
            || (want == StatusCode::METHOD_NOT_ALLOWED && !headers.contains_key("allow"))
        {
            wrong.push(format!("{case} (wanted {want}, saying {says:?})"));
        }
        n += 1;
    }
    assert!(
        wrong.is_empty(),
        "{} of {n} misbehaved:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert!(n >= 40, "only {n} cases");
}
