//! The arena's pages in a real browser: headless Chromium (Debian's `chromium`, driven through
//! `chromedriver` started here on a free port, with fantoccini) against a running arena with
//! real submissions: the bundled speed-up (followed by `fastdecode submit`), a
//! no-op that waits in the queue while the speed-up runs and is then priced, and a hostile note on
//! a change that fails at policy. It checks what a person would: the leaderboard in score order,
//! the queue with a waiting job and the runner holding the other, a submission page that follows
//! its job without a reload, the hostile note's script gone, the code diff, a frontier with one
//! point per promotion, the transfer ledger (the no-op carries a local result: its plot well
//! formed, its point inside its bars and under y = x, on the track's page and its solver's),
//! a private test (reusing the no-op's build) shown to its solver and a 404 to another solver
//! and to the public, in no public page, and a cheat leaving the ranking. Each page's
//! screenshot is written to `screenshots/` in the target directory (`target/screenshots/`),
//! never into the tree.
//!
//! Nothing here decides on timing: waits have the harness's deadlines; both changes pass (the
//! floor is 0.5), and the speed-up is promoted (it prices near 1.8 with an interval of about
//! ±0.15, far above the 1 % margin it must clear).

mod arena_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use arena_support::*;
use fantoccini::{Client, ClientBuilder, Locator};
use fastdecode_arena::api::{
    Ledger, LocalMachine, LocalResult, Mode, SolverLedger, SubmissionList, TrackView,
};
use fastdecode_arena::bundle::Content;
use fastdecode_arena::http::Api;
use serde_json::{json, Value};

/// chromedriver and the browser session it drives; both end with this value.
struct Browser {
    rt: tokio::runtime::Runtime,
    client: Option<Client>,
    /// chromedriver's own API (`http://127.0.0.1:PORT`), for what WebDriver has no command for.
    driver_api: Api,
    _driver: Proc,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn start() -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Proc(
            Command::new("chromedriver")
                .arg(format!("--port={port}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect(
                    "chromedriver is not on PATH: run the tests with tools/test.sh, which \
                     installs Debian's chromium and chromium-driver",
                ),
        );
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "chromedriver did not listen"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let profile = tempfile::tempdir().unwrap();
        let binary = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("Debian's chromium (/usr/bin/chromium): tools/test.sh installs it");
        // As root, with no network: without these Chromium waits on what it cannot reach.
        let mut args: Vec<String> = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1280,1000",
        ]
        .map(String::from)
        .to_vec();
        args.push(format!("--user-data-dir={}", profile.path().display()));
        let caps = json!({"goog:chromeOptions": {"binary": binary, "args": args}});
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(async {
            let mut b =
                ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new());
            b.capabilities(caps.as_object().unwrap().clone());
            b.connect(&format!("http://127.0.0.1:{port}"))
                .await
                .expect("a Chromium session")
        });
        Browser {
            rt,
            client: Some(client),
            driver_api: Api::new(&format!("http://127.0.0.1:{port}"), None).unwrap(),
            _driver: driver,
            _profile: profile,
        }
    }

    fn c(&self) -> &Client {
        self.client.as_ref().unwrap()
    }

    fn goto(&self, url: &str) {
        self.rt
            .block_on(self.c().goto(url))
            .unwrap_or_else(|e| panic!("{url}: {e}"));
    }

    /// Every request of the browser from now on carries `token` as a bearer token (none: no
    /// token), as a solver's own client would send it: a private run's page is its solver's
    /// only, and a browser has no other way to say who it is here. Set through Chromium's
    /// DevTools protocol (`Network.setExtraHTTPHeaders`), which chromedriver passes on.
    fn as_solver(&self, token: Option<&str>) {
        let sid = self
            .rt
            .block_on(self.c().session_id())
            .unwrap()
            .expect("a session");
        let headers = match token {
            Some(t) => json!({"Authorization": format!("Bearer {t}")}),
            None => json!({}),
        };
        for (cmd, params) in [
            ("Network.enable", json!({})),
            ("Network.setExtraHTTPHeaders", json!({"headers": headers})),
        ] {
            self.driver_api
                .post::<_, Value>(
                    &format!("/session/{sid}/goog/cdp/execute"),
                    &json!({"cmd": cmd, "params": params}),
                    &[],
                )
                .unwrap_or_else(|e| panic!("{cmd}: {e:#}"));
        }
    }

    /// The page's source as the browser received it.
    fn source(&self) -> String {
        self.rt.block_on(self.c().source()).unwrap()
    }

    /// A script's value (`return …`).
    fn js(&self, script: &str) -> Value {
        self.rt
            .block_on(self.c().execute(script, vec![]))
            .unwrap_or_else(|e| panic!("{script}: {e}"))
    }

    /// The text of the first element `css` selects, as the page shows it; read in one script
    /// so that a live page swapping its content in cannot leave the element stale.
    fn text(&self, css: &str) -> String {
        let v = self
            .rt
            .block_on(self.c().execute(
                "const e = document.querySelector(arguments[0]); return e ? e.innerText : null;",
                vec![json!(css)],
            ))
            .unwrap_or_else(|e| panic!("{css}: {e}"));
        v.as_str()
            .unwrap_or_else(|| panic!("no element {css} on {}", self.js("return location.href;")))
            .trim()
            .to_string()
    }

    fn count(&self, css: &str) -> usize {
        self.rt
            .block_on(self.c().find_all(Locator::Css(css)))
            .unwrap()
            .len()
    }

    /// The cells `css` selects whose text the page lays out on more than one line (an id
    /// broken at its hyphen, an interval at its space), each as "text: the lines' tops".
    fn wrapped_cells(&self, css: &str) -> Vec<String> {
        let v = self.rt.block_on(self.c().execute(
            r#"return [...document.querySelectorAll(arguments[0])].flatMap(td => {
                const r = document.createRange();
                r.selectNodeContents(td);
                const tops = [...r.getClientRects()].filter(x => x.width > 0).map(x => x.top);
                const half = parseFloat(getComputedStyle(td).fontSize) / 2;
                return tops.length && Math.max(...tops) - Math.min(...tops) > half
                    ? [td.innerText + ": " + tops.join(" ")] : [];
            });"#,
            vec![json!(css)],
        ));
        serde_json::from_value(v.unwrap_or_else(|e| panic!("{css}: {e}"))).unwrap()
    }

    /// The pairs of text elements of each SVG plot under `css` whose boxes overlap, as their
    /// texts ("baseline 1.000 / floor 0.950").
    fn overlapping_labels(&self, css: &str) -> Vec<String> {
        let v = self.rt.block_on(self.c().execute(
            r#"return [...document.querySelectorAll(arguments[0] + " svg")].flatMap(svg => {
                const t = [...svg.querySelectorAll("text")].filter(e => e.textContent.trim());
                const box = t.map(e => e.getBoundingClientRect());
                const hit = [];
                for (let i = 0; i < t.length; i++) for (let j = i + 1; j < t.length; j++) {
                    const a = box[i], b = box[j];
                    if (a.left < b.right - 1 && b.left < a.right - 1
                        && a.top < b.bottom - 1 && b.top < a.bottom - 1)
                        hit.push(t[i].textContent + " / " + t[j].textContent);
                }
                return hit;
            });"#,
            vec![json!(css)],
        ));
        serde_json::from_value(v.unwrap_or_else(|e| panic!("{css}: {e}"))).unwrap()
    }

    /// The whole page as a PNG in `screenshots/` of the target directory (the parent of
    /// `CARGO_TARGET_TMPDIR`, which cargo makes `<target>/tmp`, so `CARGO_TARGET_DIR` is
    /// followed): the window grown to the page's height.
    fn screenshot(&self, name: &str) -> PathBuf {
        let h = self
            .js("return document.documentElement.scrollHeight;")
            .as_u64()
            .unwrap_or(1000)
            .clamp(600, 6000) as u32;
        self.rt
            .block_on(self.c().set_window_size(1280, h + 120))
            .unwrap();
        let png = self.rt.block_on(self.c().screenshot()).unwrap();
        assert_eq!(&png[1..4], b"PNG", "a PNG");
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let dir = tmp.parent().unwrap_or(tmp).join("screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(format!("{name}.png"));
        std::fs::write(&p, png).unwrap();
        p
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if let Some(c) = self.client.take() {
            let _ = self.rt.block_on(c.close());
        }
    }
}

/// A note that tries to run script three ways, around Markdown that must survive.
const HOSTILE: &str = "# A hostile note\n\nIt makes a **bold claim**.\n\n\
    <script>document.title = 'pwned';</script>\n\n\
    <img src=\"x\" onerror=\"document.title = 'pwned'\">\n\n\
    [click me](javascript:document.title='pwned')\n";

/// The no-op's local result: a machine that promised 1.3 where the arena finds about 1 (its
/// point lies well below y = x), described in markup that must stay text.
fn noop_local() -> LocalResult {
    LocalResult {
        score: 1.3,
        ci95: [1.25, 1.35],
        pairs: 12,
        track: "serial".into(),
        machine: LocalMachine {
            cpu_model: Some("<em>laptop</em> & co".into()),
            cpus: Some(2),
            gpus: vec![],
            backend: Some("cpu".into()),
        },
    }
}

/// A ledger plot as the browser reads it: whether the service's SVG text (`raw`, from the page
/// as served) parses as XML, the diagonal's ends, and each point with its title and its bars.
#[derive(serde::Deserialize, Debug)]
struct LedgerPlot {
    well_formed: bool,
    identity: [f64; 4],
    points: Vec<(f64, f64, String)>,
    local_ci: Vec<[f64; 3]>,
    ranked_ci: Vec<[f64; 3]>,
    markup: usize,
}

/// The ledger plot under `css` on the page at `path` (fetched raw by `api` to check the
/// service's own text, as well as read from the page the browser shows).
fn ledger_plot(b: &Browser, api: &Api, path: &str, css: &str) -> LedgerPlot {
    let raw = String::from_utf8(api.get_bytes(path).unwrap().expect("the page")).unwrap();
    let at = raw
        .find(&format!("id=\"{}\"", css.trim_start_matches('#')))
        .unwrap_or_else(|| panic!("no {css} in {path}"));
    let svg = &raw[at..];
    let svg = &svg[svg.find("<svg").unwrap()..svg.find("</svg>").unwrap() + 6];
    let v = b.rt.block_on(b.c().execute(
        r#"const svg = document.querySelector(arguments[0] + " svg");
        const xml = new DOMParser().parseFromString(arguments[1], "image/svg+xml");
        const n = (e, a) => parseFloat(e.getAttribute(a));
        const id = svg.querySelector("line.identity");
        return {
            well_formed: !xml.querySelector("parsererror")
                && xml.documentElement.localName === "svg",
            identity: ["x1", "y1", "x2", "y2"].map(a => n(id, a)),
            points: [...svg.querySelectorAll("circle.ledger")]
                .map(c => [n(c, "cx"), n(c, "cy"), c.querySelector("title").textContent]),
            local_ci: [...svg.querySelectorAll("line.local-ci")]
                .map(l => [n(l, "x1"), n(l, "x2"), n(l, "y1")]),
            ranked_ci: [...svg.querySelectorAll("line.ranked-ci")]
                .map(l => [n(l, "y1"), n(l, "y2"), n(l, "x1")]),
            markup: svg.querySelectorAll("em, script").length,
        };"#,
        vec![json!(css), json!(svg)],
    ));
    serde_json::from_value(v.unwrap_or_else(|e| panic!("{css}: {e}")))
        .unwrap_or_else(|e| panic!("{css} on {path}: {e}"))
}

/// The ledger plot of one public row, the no-op's (local 1.3, ranked about 1): well formed, one
/// point inside both its bars, under the diagonal, its title the row's, its machine text.
fn assert_noop_ledger(p: &LedgerPlot, noop: &str) {
    assert!(p.well_formed, "{p:?}");
    assert_eq!(p.markup, 0, "the machine's markup is text: {p:?}");
    let [x1, y1, x2, y2] = p.identity;
    assert!(x1 < x2 && y2 < y1, "y = x rises left to right: {p:?}");
    assert_eq!(
        (p.points.len(), p.local_ci.len(), p.ranked_ci.len()),
        (1, 1, 1)
    );
    let (cx, cy, title) = &p.points[0];
    let [lx1, lx2, ly] = p.local_ci[0];
    let [ry1, ry2, rx] = p.ranked_ci[0];
    assert!(lx1 < *cx && *cx < lx2 && (ly - cy).abs() < 0.2, "{p:?}");
    assert!(ry2 < *cy && *cy < ry1 && (rx - cx).abs() < 0.2, "{p:?}");
    let under = y1 + (cx - x1) * (y2 - y1) / (x2 - x1);
    assert!(*cy > under + 5.0, "the local machine promised more: {p:?}");
    assert!(
        title.starts_with(&format!("{noop} by alice: local 1.3000 [1.2500, 1.3500]"))
            && title.contains("<em>laptop</em> & co, 2 CPUs, cpu"),
        "{title}"
    );
}

#[test]
fn the_pages_in_a_browser_rank_queue_follow_and_sanitise() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // A clock sized for a page test, which asserts no score: 8 to 16 pairs, stopping at an 8 %
    // interval (the speed-up's 1.8 clears the 1 % margin by far, and a no-op the 0.5 floor, even
    // when this machine is at its noisiest); every submission's code is published.
    let a = Arena::on_track(Database::Sqlite, 30, |t| {
        t.clock.min_pairs = 8;
        t.clock.max_pairs = 16;
        t.clock.target_ci = 0.08;
        t.publish_code = "always".into();
    });
    let _r1 = a.runner("r1");
    let b = Browser::start();
    let url = a.url();
    // Another solver, who must never see alice's private run.
    let mut add = ["arena", "admin", "solver", "add", "bob"]
        .map(String::from)
        .to_vec();
    add.extend(a.state());
    let bob = fd(&add.iter().map(String::as_str).collect::<Vec<_>>());
    let public = Api::new(&url, None).unwrap();

    // A hostile note on a change off the surface: refused at policy, in seconds.
    let off = [(
        "crates/clock/src/price.rs".to_string(),
        Content::File(b"// faster\n".to_vec(), 0o644),
    )];
    let hostile = a.post_note(&off, "hostile", HOSTILE).unwrap().id;
    assert_eq!(a.finished(&hostile).status, "failed");

    // The speed-up, followed by `fastdecode submit` while the test watches the pages.
    let tree = a.working_tree("speedup", Some("speedup.patch"));
    std::thread::scope(|scope| {
        let submit = scope.spawn(|| a.submit_logged(&tree, "speedup"));
        let fast = wait_for("the speed-up's first stage", || {
            let list: SubmissionList = a
                .api()
                .get_json("/api/submissions?solver=alice&status=running")
                .unwrap();
            list.submissions.first().map(|s| s.id.clone())
        });
        // The no-op waits behind it: the one runner keeps the speed-up to its verdict. It
        // carries its solver's own pricing, for the transfer ledger.
        let noop = a
            .post_local(
                &a.solver,
                &[],
                "noop",
                "# No-op\n\nThe unmodified engine: the clock's own check.",
                Mode::Leaderboard,
                Some(noop_local()),
            )
            .unwrap()
            .id;

        // The queue: the speed-up held by r1, the no-op first in line.
        b.goto(&format!("{url}/tracks/{TRACK}"));
        assert_eq!(b.count("#queue tr.job"), 2, "{}", b.text("#queue"));
        let rows = b.text("#queue");
        let fast_row = rows.lines().find(|l| l.contains(&fast)).unwrap();
        let noop_row = rows.lines().find(|l| l.contains(&noop)).unwrap();
        assert!(
            fast_row.contains("running") && fast_row.contains("r1"),
            "{rows}"
        );
        assert!(noop_row.starts_with("1 (waiting)"), "{rows}");
        assert_eq!(b.wrapped_cells("#queue td"), Vec::<String>::new());
        b.screenshot("queue");

        // Alice's private test of the unchanged engine: behind the no-op (leaderboard jobs
        // first), on the base the no-op was built on, so its build is the no-op's. In the public
        // queue it is a row that names neither it nor her.
        let private = a
            .post_as(&a.solver, &[], "private", "# A private test", Mode::Test)
            .unwrap()
            .id;
        b.goto(&format!("{url}/tracks/{TRACK}"));
        assert_eq!(b.count("#queue tr.job"), 3, "{}", b.text("#queue"));
        assert_eq!(b.count("#queue tr.job .private"), 1);
        let row = b.text("#queue tr.job:last-child");
        assert!(
            row.contains("a private run") && !row.contains("alice"),
            "{row}"
        );
        assert!(!b.source().contains(&private));

        // The no-op's page while it waits.
        b.goto(&format!("{url}/submissions/{noop}"));
        assert_eq!(b.text("#status"), "queued");
        assert!(b.text("#queue-position").starts_with("0 ahead"));
        assert_eq!(
            b.js(r#"return document.getElementById("live").dataset.live;"#),
            json!("1")
        );
        // The browser idles while the speed-up is priced: on two cores a page that follows a
        // job would take time from the pricing it measures.
        b.goto("about:blank");

        let (ok, v, said) = submit.join().unwrap();
        assert!(ok, "{v:?}\n{said}");
        assert_eq!(v.status, "promoted", "{v:?}");
        // `submit` followed it stage by stage, as they started and ended.
        for stage in v.stages.iter().map(|s| s.stage.as_str()) {
            assert!(
                said.lines().any(|l| l.trim_start().starts_with(stage)),
                "{stage}: {said}"
            );
        }

        // The no-op's page follows it to its verdict without a reload: a mark set on the
        // window survives, and the stages and status it shows move on by themselves.
        b.goto(&format!("{url}/submissions/{noop}"));
        b.js("window.__kept = 'yes'; return null;");
        let first_rows = b.count("#stages tr.stage");
        let mut seen: Vec<String> = vec![];
        let mut shot = false;
        wait_for("the no-op's page to show its verdict", || {
            let st = b.text("#status");
            if seen.last() != Some(&st) {
                seen.push(st.clone());
            }
            if st == "running" && !shot && b.count("#stages tr.stage") >= 4 {
                b.screenshot("submission-running");
                shot = true;
            }
            // Looked at about once a second, as a person would.
            std::thread::sleep(Duration::from_secs(1));
            (st == "held").then_some(())
        });
        assert_eq!(b.js("return window.__kept || null;"), json!("yes"));
        assert!(seen.iter().any(|s| s == "running"), "{seen:?}");
        assert_eq!(seen.last().map(String::as_str), Some("held"));
        assert!(
            b.count("#stages tr.stage") > first_rows,
            "{first_rows} rows at first"
        );
        assert_eq!(
            b.text("#stages tr.stage:last-child td:nth-child(5)"),
            "held"
        );
        assert_eq!(
            b.js(r#"return document.getElementById("live").dataset.live;"#),
            json!("0")
        );
        assert!(said.contains("running on r1"), "{said}");
        assert!(
            said.contains(&format!("{url}/submissions/{fast}")),
            "{said}"
        );

        // The private test ends (its gate) before the queue is looked at again.
        assert_eq!(a.finished(&private).status, "tested");

        // The leaderboard: in rank-score order, as the API ranks them; the frontier: the baseline and
        // each promotion.
        let t: TrackView = a.track();
        b.goto(&format!("{url}/tracks/{TRACK}"));
        let ids: Vec<String> = t.leaderboard.iter().map(|r| r.submission.clone()).collect();
        let mut both = ids.clone();
        both.sort();
        let mut want = vec![fast.clone(), noop.clone()];
        want.sort();
        assert_eq!(both, want);
        let shown: Vec<f64> = b
            .js(r##"return [...document.querySelectorAll("#leaderboard tr.entry")].map(r => parseFloat(r.dataset.rankScore));"##)
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(shown.len(), 2);
        assert!(shown[0] > shown[1], "{shown:?}");
        let order: Vec<Value> = ids.iter().map(|i| json!(i)).collect();
        assert_eq!(
            b.js(r##"return [...document.querySelectorAll("#leaderboard tr.entry td:last-child a")].map(a => a.textContent);"##),
            Value::Array(order)
        );
        assert_eq!(t.frontier.len(), 2);
        assert_eq!(b.count("#frontier svg circle.promotion"), t.frontier.len());
        assert_eq!(b.count("#queue tr.job"), 0);
        // Failed submissions are listed with what stopped them, as the API lists them.
        let failed: SubmissionList = a
            .api()
            .get_json(&format!("/api/submissions?track={TRACK}&status=failed"))
            .unwrap();
        assert_eq!(failed.submissions.len(), 1, "{failed:?}");
        assert_eq!(b.count("#failed tr.failure"), 1, "{}", b.text("#failed"));
        let row = b.text("#failed tr.failure");
        assert!(
            row.contains(&hostile) && row.contains("policy:off_surface"),
            "{row}"
        );
        assert_eq!(
            failed.submissions[0].category.as_deref(),
            Some("policy:off_surface")
        );
        assert_eq!(b.text("#best"), format!("{:.4}", t.current_best_score));
        assert!(b.text("#rules").contains("Surface"));
        // Ids, names, scores and intervals each on one line; the plot's labels apart.
        assert_eq!(
            b.wrapped_cells("#leaderboard td, #failed td"),
            Vec::<String>::new()
        );
        assert_eq!(b.overlapping_labels("#frontier"), Vec::<String>::new());
        // The transfer ledger: the no-op's row, as the API lists it, plotted and listed.
        let ledger: Ledger = public
            .get_json(&format!("/api/tracks/{TRACK}/ledger"))
            .unwrap();
        assert_eq!(ledger.rows.len(), 1, "{ledger:?}");
        assert_eq!(ledger.rows[0].submission, noop);
        assert!(ledger.rows[0].ranked_score < 1.25, "{ledger:?}");
        let p = ledger_plot(&b, &public, &format!("/tracks/{TRACK}"), "#ledger");
        assert_noop_ledger(&p, &noop);
        assert_eq!(b.count("#ledger-rows tr.ledger-row"), 1);
        assert!(b.text("#ledger-rows tr.ledger-row").starts_with(&noop));
        assert_eq!(b.overlapping_labels("#ledger"), Vec::<String>::new());
        b.screenshot("leaderboard");

        // The speed-up's page: metrics under the original's names, each with its meaning,
        // integers as integers, the interval rounded; pairs plotted; its code as a diff; the
        // no-op's diff has no file.
        b.goto(&format!("{url}/submissions/{fast}"));
        assert_eq!(b.text("#status"), v.status);
        let rows: Vec<Vec<String>> = serde_json::from_value(b.js(
            r##"return [...document.querySelectorAll("#metrics tr.metric")].map(r => [...r.cells].map(c => c.innerText.trim()));"##,
        ))
        .unwrap();
        let row = |name: &str| {
            rows.iter()
                .find(|r| r[0] == name)
                .unwrap_or_else(|| panic!("{name}: {rows:?}"))
        };
        for name in [
            "ratio_of_means",
            "accepted_pair_count",
            "ci95",
            "baseline_seconds_per_token",
        ] {
            assert!(row(name)[2].len() > 10, "{name} unexplained: {rows:?}");
        }
        assert!(
            row("accepted_pair_count")[1].parse::<u32>().is_ok(),
            "{rows:?}"
        );
        // The interval as `submit`'s table prints it (one formatter for both): bracketed, each
        // end rounded to four significant digits.
        let ci = &row("ci95")[1];
        let verdict = v.verdict.as_ref().expect("a passed verdict");
        assert_eq!(
            *ci,
            fastdecode_arena::record::metrics::text(&verdict["metrics"]["ci95"])
        );
        assert!(
            ci.starts_with('[')
                && ci
                    .split(", ")
                    .all(|x| x.trim_matches(['[', ']']).len() <= 6),
            "{ci}"
        );
        assert_eq!(
            b.overlapping_labels("#pairs, #confirmation-pairs"),
            Vec::<String>::new()
        );
        // Each pricing its own plot: the first's pairs under its title, the confirmation's
        // (when it ran) under its own, never one mixed series.
        let view = a.view(&fast);
        let pairs = b.count("#pairs svg circle.pair");
        assert!(pairs >= 8, "{pairs} pairs plotted");
        assert_eq!(pairs, view.pairs.len());
        let title = |plot: &str| {
            b.js(&format!(
                r#"return document.querySelector("{plot} svg text").textContent;"#
            ))
        };
        assert_eq!(title("#pairs"), json!("Pairs of the pricing"));
        assert!(b.text("#code").contains("+++ b/crates/cpu/src/ops.rs"));
        let confirmed = v
            .verdict
            .as_ref()
            .is_some_and(|x| !x["confirmation"].is_null());
        assert_eq!(b.count("#confirmation tr") > 0, confirmed);
        assert_eq!(!view.confirmation_pairs.is_empty(), confirmed);
        assert_eq!(
            b.count("#confirmation-pairs svg circle.pair"),
            view.confirmation_pairs.len()
        );
        if confirmed {
            assert_eq!(
                title("#confirmation-pairs"),
                json!("Pairs of the confirmation pricing")
            );
        }
        b.screenshot("submission");
        b.goto(&format!("{url}/submissions/{noop}"));
        assert!(!b.text("#code").contains("+++"));
        assert!(b.count("#pairs svg circle.pair") >= 8);
        // A no-op's score sits on the baseline's line: their labels still apart.
        assert_eq!(
            b.overlapping_labels("#pairs, #confirmation-pairs"),
            Vec::<String>::new()
        );

        // The hostile note: its Markdown rendered, every script gone, none ran.
        b.goto(&format!("{url}/submissions/{hostile}"));
        assert_eq!(b.text("#note strong"), "bold claim");
        assert_eq!(b.count("#note script"), 0);
        assert_eq!(b.count("#note [onerror]"), 0);
        assert_eq!(b.count("#note a[href^='javascript']"), 0);
        assert!(!b
            .js("return document.title;")
            .as_str()
            .unwrap()
            .contains("pwned"));
        assert!(b.text("#failure").contains("policy:off_surface"));
        b.screenshot("hostile-note");

        // An unknown submission: a 404 page (and a 404 from the API).
        b.goto(&format!("{url}/submissions/s-0000000000000000"));
        assert!(b
            .text("#error")
            .contains("There is no submission s-0000000000000000"));
        let e = a
            .api()
            .get_json::<Value>("/api/submissions/s-0000000000000000")
            .unwrap_err();
        assert!(format!("{e:#}").contains("404"), "{e:#}");

        // Alice's page, to the public: her ledger plotted as the track's, her machine summed
        // up, her public submissions listed; her private run nowhere.
        let mine: SolverLedger = public.get_json("/api/solvers/alice/ledger").unwrap();
        assert_eq!(mine.rows.len(), 1, "{mine:?}");
        assert_eq!(mine.machines.len(), 1, "{mine:?}");
        b.goto(&format!("{url}/solvers/alice"));
        assert_eq!(b.text("#solver"), "alice");
        assert_eq!(b.count("#own"), 0);
        let p = ledger_plot(&b, &public, "/solvers/alice", &format!("#ledger-{TRACK}"));
        assert_noop_ledger(&p, &noop);
        assert_eq!(b.count("#machines tr.machine"), 1);
        let m = b.text("#machines tr.machine");
        assert!(
            m.contains("<em>laptop</em> & co") && m.contains("0 of 1"),
            "{m}"
        );
        assert_eq!(b.count("#submissions tr.submission"), 3);
        assert_eq!(b.count("#submissions tr.private"), 0);
        assert!(!b.source().contains(&private));
        b.screenshot("solver");
        // Alice's private run's page, to alice (her token on every request): its mode and
        // status; her page lists it, marked private.
        b.as_solver(Some(&a.solver));
        b.goto(&format!("{url}/submissions/{private}"));
        assert_eq!(b.text("#status"), "tested");
        assert!(b.text("#mode").contains("A private test run"));
        b.screenshot("private-run");
        b.goto(&format!("{url}/solvers/alice"));
        assert_eq!(b.count("#own"), 1);
        assert_eq!(b.count("#submissions tr.private"), 1);
        assert!(b.text("#submissions tr.private").contains(&private));
        // To bob and to the public: the unknown id's 404 (the status, from the same requests
        // without a browser, too), and no trace on any public page.
        for (who, token) in [("bob", Some(bob.as_str())), ("the public", None)] {
            b.as_solver(token);
            b.goto(&format!("{url}/submissions/{private}"));
            assert!(
                b.text("#error")
                    .contains(&format!("There is no submission {private}")),
                "{who}"
            );
            let api = Api::new(&url, token).unwrap();
            assert!(
                api.get_bytes(&format!("/submissions/{private}"))
                    .unwrap()
                    .is_none(),
                "{who}: not a 404"
            );
            for page in [
                "/".to_string(),
                format!("/tracks/{TRACK}"),
                "/solvers/alice".into(),
            ] {
                b.goto(&format!("{url}{page}"));
                assert!(!b.source().contains(&private), "{who} sees it on {page}");
            }
        }
        b.as_solver(None);

        // An operator marks the no-op as a cheat: it leaves the ranking, its page stays.
        let mut cheat = vec![
            "arena",
            "admin",
            "cheat",
            noop.as_str(),
            "--reason",
            "a test's mark",
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
        cheat.extend(a.state());
        fd(&cheat.iter().map(String::as_str).collect::<Vec<_>>());
        b.goto(&format!("{url}/tracks/{TRACK}"));
        assert_eq!(b.count("#leaderboard tr.entry"), 1);
        assert_eq!(a.track().leaderboard.len(), 1);
        b.goto(&format!("{url}/submissions/{noop}"));
        assert!(b.text("#cheat").contains("a test's mark"));
        assert!(b.count("#pairs svg circle.pair") >= 8, "its evidence stays");
        let list: SubmissionList = a.api().get_json("/api/submissions?status=cheat").unwrap();
        assert_eq!(list.total, 1);
        assert_eq!(list.submissions[0].id, noop);
        b.goto(&format!("{url}/"));
        assert!(b.text("#tracks").contains(TRACK));
        b.screenshot("tracks");
    });
}
