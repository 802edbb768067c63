//! The blocking HTTP client that runners and `submit` share: the service's URL, a bearer token,
//! and errors that say which request failed and what the service answered.
//!
//! Every request is bounded in time and every answer in size: a service that accepts and never
//! answers, or answers without end, is an error naming it, never a wait or a growth without end.
//! A refused token (HTTP 401) is its own error, [`Unauthorized`], which no retry can mend.

use std::io::Read;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use reqwest::blocking::{Client, RequestBuilder, Response};
use reqwest::StatusCode;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// How long a one-shot request (a question, a lease, a heartbeat, a report) may take in all.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long an artifact's download may take in all.
pub const TRANSFER_TIMEOUT: Duration = Duration::from_secs(600);
/// The slowest upload allowed for: a request that sends a body gets this much more time for it.
const UPLOAD_BYTES_PER_S: u64 = 256 << 10;
/// The largest JSON answer a client reads.
pub const MAX_JSON: u64 = 16 << 20;
/// The largest artifact a client downloads (the service's own cap on an upload).
pub const MAX_ARTIFACT: u64 = 1 << 30;
/// Of a refusal's body only this much is read: it is shown, not kept.
const MAX_ERROR_BODY: u64 = 64 << 10;

pub struct Api {
    base: String,
    token: Option<String>,
    client: Client,
    request_timeout: Duration,
    transfer_timeout: Duration,
    json_cap: u64,
    artifact_cap: u64,
    /// How long a GET or PUT waits out a service that takes no request (restarting).
    patience: Duration,
}

/// The service refused the token (HTTP 401): retrying with it cannot help.
#[derive(Debug)]
pub struct Unauthorized {
    pub server: String,
    pub detail: String,
}

impl std::fmt::Display for Unauthorized {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the service {} refuses this token (401 Unauthorized: {}): check --token or \
             $FASTDECODE_ARENA_TOKEN",
            self.server, self.detail
        )
    }
}

impl std::error::Error for Unauthorized {}

/// Whether `e` is, or was caused by, the service refusing the token.
pub fn is_unauthorized(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<Unauthorized>())
}

/// Whether a timeout is somewhere in `e`'s chain of causes.
fn timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(c) = cur {
        if let Some(r) = c.downcast_ref::<reqwest::Error>() {
            if r.is_timeout() {
                return true;
            }
        }
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            // An I/O error's `source` skips the error it wraps (reqwest's, on a body's read).
            if io.kind() == std::io::ErrorKind::TimedOut
                || io.get_ref().is_some_and(|inner| timed_out(inner))
            {
                return true;
            }
        }
        cur = c.source();
    }
    false
}

/// Whether `e` says the service took no request: refused or reset before any answer, not slow.
fn absent(e: &reqwest::Error) -> bool {
    (e.is_connect() || e.is_request()) && !e.is_timeout()
}

fn size(n: u64) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} bytes")
    }
}

impl Api {
    pub fn new(server: &str, token: Option<&str>) -> Result<Api> {
        let base = server.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            bail!("--server {server}: an http:// or https:// URL");
        }
        let client = Client::builder()
            .timeout(TRANSFER_TIMEOUT)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .context("an HTTP client")?;
        Ok(Api {
            base,
            token: token.map(str::to_string),
            client,
            request_timeout: REQUEST_TIMEOUT,
            transfer_timeout: TRANSFER_TIMEOUT,
            json_cap: MAX_JSON,
            artifact_cap: MAX_ARTIFACT,
            patience: Duration::ZERO,
        })
    }

    /// The same client, its GETs and PUTs (which may be sent twice) retried a second apart for
    /// up to `patience` while the service takes no request: a connection refused or reset
    /// before any answer, as while it restarts. A runner's stage then outlives a restart of the
    /// service instead of failing as `infra:runner` (a gate did, when the restart fell on its
    /// fetch of the hidden goldens). A slow answer is not retried: its timeout stands.
    pub fn with_patience(mut self, patience: Duration) -> Api {
        self.patience = patience;
        self
    }

    /// The same client with other time limits (the tests' short ones).
    pub fn with_timeouts(mut self, request: Duration, transfer: Duration) -> Api {
        self.request_timeout = request;
        self.transfer_timeout = transfer;
        self
    }

    /// The same client with other caps on answers (the tests' small ones).
    #[cfg(test)]
    fn with_caps(mut self, json: u64, artifact: u64) -> Api {
        self.json_cap = json;
        self.artifact_cap = artifact;
        self
    }

    fn auth(&self, r: RequestBuilder) -> RequestBuilder {
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// The time a request that sends `up` bytes may take.
    fn limit(&self, up: usize) -> Duration {
        self.request_timeout + Duration::from_secs(up as u64 / UPLOAD_BYTES_PER_S)
    }

    /// An error of `what`, saying so plainly when it is the service's silence.
    fn failed(&self, e: anyhow::Error, what: &str, limit: Duration) -> anyhow::Error {
        if timed_out(e.as_ref()) {
            e.context(format!(
                "{what}: the service {} did not answer within {} s",
                self.base,
                limit.as_secs_f64()
            ))
        } else {
            e.context(what.to_string())
        }
    }

    fn send(&self, req: RequestBuilder, what: &str, limit: Duration) -> Result<Response> {
        req.timeout(limit)
            .send()
            .map_err(|e| self.failed(e.into(), what, limit))
    }

    /// [`Api::send`] for a request that may be sent again, waiting out the service's absence
    /// for up to the client's patience.
    fn send_again(&self, req: RequestBuilder, what: &str, limit: Duration) -> Result<Response> {
        let t0 = std::time::Instant::now();
        let mut req = req.timeout(limit);
        loop {
            let again = req.try_clone();
            match req.send() {
                Ok(r) => return Ok(r),
                Err(e) if absent(&e) && t0.elapsed() < self.patience && again.is_some() => {
                    eprintln!("{what}: the service takes no request ({e}); retrying");
                    std::thread::sleep(Duration::from_secs(1));
                    req = again.expect("checked");
                }
                Err(e) => return Err(self.failed(e.into(), what, limit)),
            }
        }
    }

    /// At most `cap` bytes of `r`'s body; more is an error naming the service and the cap.
    fn body(
        &self,
        mut r: Response,
        what: &str,
        cap: u64,
        of: &str,
        limit: Duration,
    ) -> Result<Vec<u8>> {
        let over = || {
            anyhow::anyhow!(
                "{what}: the service {} sent more than {} ({of})",
                self.base,
                size(cap)
            )
        };
        if r.content_length().is_some_and(|n| n > cap) {
            return Err(over());
        }
        let mut buf = vec![];
        (&mut r)
            .take(cap + 1)
            .read_to_end(&mut buf)
            .map_err(|e| self.failed(e.into(), what, limit))?;
        if buf.len() as u64 > cap {
            return Err(over());
        }
        Ok(buf)
    }

    fn json<T: DeserializeOwned>(&self, r: Response, what: &str, limit: Duration) -> Result<T> {
        let b = self.body(r, what, self.json_cap, "the cap on a JSON answer", limit)?;
        serde_json::from_slice(&b).with_context(|| format!("{what}: the answer"))
    }

    /// `r` if it succeeded; else an error with what the service said (a bounded excerpt).
    fn check(&self, r: Response, what: &str) -> Result<Response> {
        let status = r.status();
        if status.is_success() {
            return Ok(r);
        }
        let retry = r
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(|s| format!(" (retry after {s} s)"))
            .unwrap_or_default();
        let mut body = vec![];
        // A refusal's body is only shown: what of it arrives in time is enough.
        let _ = r.take(MAX_ERROR_BODY).read_to_end(&mut body);
        let body = String::from_utf8_lossy(&body).into_owned();
        let msg = serde_json::from_str::<crate::api::ErrorBody>(&body)
            .map(|e| e.error)
            .unwrap_or(body);
        if status == StatusCode::UNAUTHORIZED {
            return Err(anyhow::Error::new(Unauthorized {
                server: self.base.clone(),
                detail: msg.trim().to_string(),
            })
            .context(what.to_string()));
        }
        bail!("{what}: {status}: {}{retry}", msg.trim())
    }

    pub fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let what = format!("GET {}", self.url(path));
        let limit = self.request_timeout;
        let r = self.send_again(self.auth(self.client.get(self.url(path))), &what, limit)?;
        self.json(self.check(r, &what)?, &what, limit)
    }

    /// `None` on 404; an artifact is at most [`MAX_ARTIFACT`] bytes.
    pub fn get_bytes(&self, path: &str) -> Result<Option<Vec<u8>>> {
        let what = format!("GET {}", self.url(path));
        let limit = self.transfer_timeout;
        let r = self.send_again(self.auth(self.client.get(self.url(path))), &what, limit)?;
        if r.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let r = self.check(r, &what)?;
        Ok(Some(self.body(
            r,
            &what,
            self.artifact_cap,
            "the cap on an artifact",
            limit,
        )?))
    }

    /// A POST whose answer is JSON, or `None` for 204 No Content.
    pub fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        headers: &[(&str, &str)],
    ) -> Result<Option<T>> {
        let what = format!("POST {}", self.url(path));
        let body = serde_json::to_vec(body).with_context(|| what.clone())?;
        let limit = self.limit(body.len());
        let mut req = self
            .auth(self.client.post(self.url(path)))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let r = self.check(self.send(req, &what, limit)?, &what)?;
        if r.status() == StatusCode::NO_CONTENT {
            return Ok(None);
        }
        Ok(Some(self.json(r, &what, limit)?))
    }

    pub fn put_bytes(&self, path: &str, body: Vec<u8>) -> Result<()> {
        let what = format!("PUT {}", self.url(path));
        let limit = self.limit(body.len());
        let r = self.send_again(
            self.auth(self.client.put(self.url(path))).body(body),
            &what,
            limit,
        )?;
        self.check(r, &what).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::time::Instant;

    /// A service on a local port that reads each request's head and then does `answer` with
    /// the connection; its URL.
    fn service(answer: impl Fn(TcpStream) + Send + Sync + 'static) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let answer = std::sync::Arc::new(answer);
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                let answer = answer.clone();
                std::thread::spawn(move || {
                    let mut head = vec![];
                    let mut b = [0u8; 1];
                    while !head.ends_with(b"\r\n\r\n") && s.read(&mut b).is_ok_and(|n| n == 1) {
                        head.push(b[0]);
                    }
                    answer(s);
                });
            }
        });
        url
    }

    fn short(url: &str) -> Api {
        Api::new(url, Some("t"))
            .unwrap()
            .with_timeouts(Duration::from_secs(1), Duration::from_secs(2))
    }

    /// An answer of 200 whose body never ends.
    fn endless(mut s: TcpStream) {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n[");
        let chunk = [b' '; 64 << 10];
        while s.write_all(&chunk).is_ok() {}
    }

    #[test]
    fn a_service_that_never_answers_is_an_error_naming_it_within_the_timeout() {
        let url = service(|s| {
            std::thread::sleep(Duration::from_secs(30));
            drop(s);
        });
        let api = short(&url);
        let t0 = Instant::now();
        let e = api
            .get_json::<serde_json::Value>("/api/submissions/x")
            .unwrap_err();
        let msg = format!("{e:#}");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert!(
            msg.contains(&url) && msg.contains("did not answer within 1 s"),
            "{msg}"
        );
        // A transient failure still reads as reqwest's (the runner's report retries those).
        assert!(e.downcast_ref::<reqwest::Error>().is_some(), "{msg}");
        let t0 = Instant::now();
        let e = api
            .post::<_, serde_json::Value>("/api/runner/lease", &serde_json::json!({}), &[])
            .unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert!(
            format!("{e:#}").contains("did not answer within 1 s"),
            "{e:#}"
        );
        let t0 = Instant::now();
        let e = api.get_bytes("/api/artifacts/x").unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(6), "{:?}", t0.elapsed());
        assert!(
            format!("{e:#}").contains("did not answer within 2 s"),
            "{e:#}"
        );
    }

    /// An answer of 200 with an empty JSON object.
    fn empty_object(mut s: TcpStream) {
        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}");
    }

    #[test]
    fn a_patient_client_waits_out_a_service_that_takes_no_request() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        // Connections closed before any answer (a service going down), then answers.
        let dropped = std::sync::Arc::new(AtomicUsize::new(0));
        let d = dropped.clone();
        let url = service(move |s| match d.fetch_add(1, Ordering::SeqCst) {
            0..=2 => drop(s),
            _ => empty_object(s),
        });
        let e = short(&url).get_json::<serde_json::Value>("/x").unwrap_err();
        assert!(format!("{e:#}").contains(&url), "{e:#}");
        let patient = short(&url).with_patience(Duration::from_secs(30));
        let v: serde_json::Value = patient.get_json("/x").unwrap();
        assert_eq!(v, serde_json::json!({}));
        assert_eq!(dropped.load(Ordering::SeqCst), 4);
        patient.put_bytes("/y", b"bytes".to_vec()).unwrap();

        // Refused (nothing listens yet), then a service on that port: a restart.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}");
        assert!(short(&url).get_bytes("/z").is_err());
        let later = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1500));
            let l = TcpListener::bind(("127.0.0.1", port)).unwrap();
            let (mut s, _) = l.accept().unwrap();
            let mut b = [0u8; 4096];
            let _ = s.read(&mut b);
            empty_object(s);
        });
        let t0 = Instant::now();
        let got = short(&url)
            .with_patience(Duration::from_secs(30))
            .get_bytes("/z");
        assert_eq!(got.unwrap().as_deref(), Some(&b"{}"[..]));
        assert!(t0.elapsed() >= Duration::from_secs(1), "{:?}", t0.elapsed());
        later.join().unwrap();
        // A POST is never sent twice: the service's absence is its error at once.
        let e = short(&url)
            .with_patience(Duration::from_secs(30))
            .post::<_, serde_json::Value>("/api/runner/lease", &serde_json::json!({}), &[])
            .unwrap_err();
        assert!(e.downcast_ref::<reqwest::Error>().is_some(), "{e:#}");
    }

    #[test]
    fn an_endless_answer_is_cut_at_its_cap_with_an_error_naming_the_service() {
        let url = service(endless);
        let api = Api::new(&url, Some("t"))
            .unwrap()
            .with_timeouts(Duration::from_secs(20), Duration::from_secs(20))
            .with_caps(1 << 20, 2 << 20);
        let e = api
            .get_json::<serde_json::Value>("/api/submissions/x")
            .unwrap_err();
        let msg = format!("{e:#}");
        assert!(
            msg.contains(&url) && msg.contains("more than 1 MiB (the cap on a JSON answer)"),
            "{msg}"
        );
        let e = api
            .post::<_, serde_json::Value>("/api/runner/lease", &serde_json::json!({}), &[])
            .unwrap_err();
        assert!(format!("{e:#}").contains("more than 1 MiB"), "{e:#}");
        let e = api.get_bytes("/api/artifacts/x").unwrap_err();
        assert!(
            format!("{e:#}").contains("more than 2 MiB (the cap on an artifact)"),
            "{e:#}"
        );
    }

    #[test]
    fn the_real_json_cap_holds_against_an_endless_answer() {
        let url = service(endless);
        let api = Api::new(&url, None)
            .unwrap()
            .with_timeouts(Duration::from_secs(60), Duration::from_secs(60));
        let e = api
            .get_json::<serde_json::Value>("/api/submissions/x")
            .unwrap_err();
        assert!(format!("{e:#}").contains("more than 16 MiB"), "{e:#}");
    }

    #[test]
    fn a_declared_length_over_the_cap_is_refused_before_reading() {
        let url = service(|mut s| {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999\r\n\r\n");
            std::thread::sleep(Duration::from_secs(30));
        });
        let t0 = Instant::now();
        let e = short(&url).get_json::<serde_json::Value>("/x").unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        assert!(format!("{e:#}").contains("more than 16 MiB"), "{e:#}");
    }

    #[test]
    fn a_refused_token_is_its_own_error_naming_the_service() {
        let url = service(|mut s| {
            let body = br#"{"error":"unknown token"}"#;
            let _ = write!(
                s,
                "HTTP/1.1 401 Unauthorized\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            let _ = s.write_all(body);
        });
        let e = short(&url)
            .post::<_, serde_json::Value>("/api/runner/lease", &serde_json::json!({}), &[])
            .unwrap_err();
        assert!(is_unauthorized(&e), "{e:#}");
        let msg = format!("{e:#}");
        assert!(
            msg.contains(&url)
                && msg.contains("refuses this token")
                && msg.contains("unknown token"),
            "{msg}"
        );
        // Not a transient failure: nothing retries it as the service's absence.
        assert!(e.downcast_ref::<reqwest::Error>().is_none(), "{msg}");
    }
}
