//! The blocking HTTP client that runners and `submit` share: the service's URL, a bearer token,
//! and errors that say which request failed and what the service answered.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use reqwest::blocking::{Client, RequestBuilder, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;

pub struct Api {
    base: String,
    token: Option<String>,
    client: Client,
}

fn check(r: Response, what: &str) -> Result<Response> {
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
    let body = r.text().unwrap_or_default();
    let msg = serde_json::from_str::<crate::api::ErrorBody>(&body)
        .map(|e| e.error)
        .unwrap_or(body);
    bail!("{what}: {status}: {}{retry}", msg.trim())
}

impl Api {
    pub fn new(server: &str, token: Option<&str>) -> Result<Api> {
        let base = server.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            bail!("--server {server}: an http:// or https:// URL");
        }
        let client = Client::builder()
            .timeout(Duration::from_secs(600))
            .connect_timeout(Duration::from_secs(10))
            .build()
            .context("an HTTP client")?;
        Ok(Api {
            base,
            token: token.map(str::to_string),
            client,
        })
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

    pub fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let what = format!("GET {}", self.url(path));
        let r = self
            .auth(self.client.get(self.url(path)))
            .send()
            .with_context(|| what.clone())?;
        check(r, &what)?.json().with_context(|| what.clone())
    }

    /// `None` on 404.
    pub fn get_bytes(&self, path: &str) -> Result<Option<Vec<u8>>> {
        let what = format!("GET {}", self.url(path));
        let r = self
            .auth(self.client.get(self.url(path)))
            .send()
            .with_context(|| what.clone())?;
        if r.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        Ok(Some(
            check(r, &what)?
                .bytes()
                .with_context(|| what.clone())?
                .to_vec(),
        ))
    }

    /// A POST whose answer is JSON, or `None` for 204 No Content.
    pub fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        headers: &[(&str, &str)],
    ) -> Result<Option<T>> {
        let what = format!("POST {}", self.url(path));
        let mut req = self.auth(self.client.post(self.url(path))).json(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let r = check(req.send().with_context(|| what.clone())?, &what)?;
        if r.status() == reqwest::StatusCode::NO_CONTENT {
            return Ok(None);
        }
        Ok(Some(r.json().with_context(|| what.clone())?))
    }

    pub fn put_bytes(&self, path: &str, body: Vec<u8>) -> Result<()> {
        let what = format!("PUT {}", self.url(path));
        let r = self
            .auth(self.client.put(self.url(path)))
            .body(body)
            .send()
            .with_context(|| what.clone())?;
        check(r, &what).map(|_| ())
    }
}
