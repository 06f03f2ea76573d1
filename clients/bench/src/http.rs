//! One streamed request over the OpenAI HTTP API: `POST /v1/completions`
//! with `stream: true`, read as Server-Sent Events on its own HTTP/1.1
//! connection (as an OpenAI client streaming several requests opens one per
//! request). The connection is opened before the clock starts, so TTFT
//! compares with gRPC's pre-connected channel. Each non-empty text chunk is
//! an output event; the token count comes from the final usage chunk
//! (`stream_options.include_usage`). Cancelling closes the connection.

use std::net::SocketAddr;
use std::time::Instant;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;

use crate::load::{Prompt, RequestSpec};
use crate::sse::{SseParser, parse_data};
use crate::stats::{Outcome, Record};

/// Where the OpenAI API listens, and the model id it serves.
#[derive(Debug, Clone)]
pub struct HttpTarget {
    pub addr: SocketAddr,
    pub model: String,
    /// Sent as `Authorization: Bearer <key>` when the server wants one.
    pub api_key: Option<String>,
}

/// The JSON body for `spec`: greedy, EOS ignored (vLLM's `ignore_eos`),
/// usage asked for at the end of the stream, and `spec.extra_body`'s fields.
pub fn body(spec: &RequestSpec, model: &str) -> Value {
    let prompt = match &spec.prompt {
        Prompt::Ids(ids) => json!(ids),
        Prompt::Text(text) => json!(text),
    };
    let mut body = json!({
        "model": if spec.model.is_empty() { model } else { &spec.model },
        "prompt": prompt,
        "max_tokens": spec.max_tokens,
        "temperature": 0,
        "ignore_eos": true,
        "skip_special_tokens": false,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if let Some(salt) = &spec.cache_salt {
        body["cache_salt"] = json!(salt);
    }
    for (key, value) in &spec.extra_body {
        body[key] = value.clone();
    }
    body
}

/// Runs `spec` against `target`; `run_start` is the origin of `Record::sent_at`.
pub async fn generate(target: &HttpTarget, spec: &RequestSpec, run_start: Instant) -> Record {
    let connection = connect(target.addr).await;
    let sent = Instant::now();
    let mut record = Record::new(sent - run_start);
    record.outcome = match connection {
        Err(e) => Outcome::Error(format!("connect: {e:#}")),
        Ok((sender, task)) => {
            let outcome = stream(sender, target, spec, sent, &mut record).await;
            task.abort(); // closes the socket: a disconnect when cancelled
            outcome.unwrap_or_else(|e| Outcome::Error(format!("{e:#}")))
        }
    };
    record.elapsed = sent.elapsed();
    if record.tokens == 0 {
        record.tokens = record.events.iter().map(|e| e.1).sum();
    }
    record
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(addr: SocketAddr) -> anyhow::Result<(Sender, tokio::task::JoinHandle<()>)> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok((sender, task))
}

async fn stream(
    mut sender: Sender,
    target: &HttpTarget,
    spec: &RequestSpec,
    sent: Instant,
    record: &mut Record,
) -> anyhow::Result<Outcome> {
    let mut request = Request::post("/v1/completions");
    if let Some(key) = &target.api_key {
        request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let request = request
        .header(hyper::header::HOST, target.addr.to_string())
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::ACCEPT, "text/event-stream")
        .body(Full::new(Bytes::from(
            body(spec, &target.model).to_string(),
        )))?;
    let response = sender.send_request(request).await.context("send")?;
    let status = response.status();
    let mut body = response.into_body();
    if !status.is_success() {
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        let message = parse_data(&text).error.unwrap_or_else(|| text.into_owned());
        return Ok(Outcome::Error(format!("HTTP {status}: {message:.300}")));
    }
    let mut parser = SseParser::default();
    let mut chunks = 0u32;
    let mut finish = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.context("body")?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        let at = sent.elapsed();
        for event in parser.push(data) {
            let chunk = parse_data(&event);
            if let Some(error) = chunk.error {
                return Ok(Outcome::Error(error));
            }
            if chunk.done {
                return Ok(finish.map_or_else(
                    || Outcome::Error("[DONE] without a finish_reason".to_owned()),
                    Outcome::Finished,
                ));
            }
            if let Some((prompt, completion, cached)) = chunk.usage {
                (record.prompt_tokens, record.tokens) = (prompt, completion);
                record.cached_tokens = cached;
            }
            if chunk.finish_reason.is_some() {
                finish = chunk.finish_reason;
            }
            if !chunk.text.is_empty() {
                record.events.push((at, 1));
                chunks += 1;
                if spec.cancel_after.is_some_and(|k| chunks >= k) {
                    return Ok(Outcome::Cancelled); // the caller closes the socket
                }
            }
        }
    }
    Ok(Outcome::Error("stream ended before [DONE]".to_owned()))
}

/// `POST path` with a JSON body on a new connection: the status and the
/// whole response body.
pub async fn post_json(
    addr: SocketAddr,
    path: &str,
    body: &Value,
) -> anyhow::Result<(hyper::StatusCode, Bytes)> {
    let (mut sender, task) = connect(addr).await?;
    let request = Request::post(path)
        .header(hyper::header::HOST, addr.to_string())
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))?;
    let response = sender.send_request(request).await.context("send")?;
    let status = response.status();
    let bytes = response.into_body().collect().await?.to_bytes();
    task.abort();
    Ok((status, bytes))
}

/// `GET path` on a new connection, with a bearer key when given: the status
/// and the whole response body.
pub async fn get(
    addr: SocketAddr,
    path: &str,
    key: Option<&str>,
) -> anyhow::Result<(hyper::StatusCode, Bytes)> {
    let (mut sender, task) = connect(addr).await?;
    let mut request = Request::get(path).header(hyper::header::HOST, addr.to_string());
    if let Some(key) = key {
        request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let response = sender
        .send_request(request.body(Full::new(Bytes::new()))?)
        .await
        .context("send")?;
    let status = response.status();
    let bytes = response.into_body().collect().await?.to_bytes();
    task.abort();
    Ok((status, bytes))
}
