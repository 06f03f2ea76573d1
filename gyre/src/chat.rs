//! `gyre chat`: an interactive chat, streamed token by token, against a
//! running server (gRPC `GenerateStream` with chat input, or the OpenAI
//! HTTP API's streamed chat completions) or against a model loaded in this
//! process (`--model-dir`: the same gRPC service `gyre serve` runs, on an
//! ephemeral loopback port behind a random key).
//!
//! Each line read is a user turn; the whole conversation is sent with each
//! turn. `/reset` starts over (keeping `--system`), `/exit` or end of input
//! quits, Ctrl-C during a reply stops that reply (the call is cancelled)
//! and keeps what came. Standard input need not be a terminal: piped lines
//! are answered in turn, each reply on standard output followed by a
//! newline (no prompt, no banner).

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::sync::Arc;

use clap::Args;
use gyre_api::v1::{self, generate_response::Event, request::Input};
use http_body_util::BodyExt as _;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::client::{self, Connection, HttpBase, Server, ServerArgs, SseReader};

const CHAT: &str = "Conversation";

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub server: ServerArgs,
    /// Chat with a model loaded in this process instead of a server: a
    /// model directory, a GGUF file, or a hub id in the local HuggingFace
    /// cache (as `gyre serve --model` takes it).
    #[arg(
        long,
        visible_alias = "local",
        value_name = "PATH",
        conflicts_with_all = ["grpc", "url", "tls_ca"],
        help_heading = "Server"
    )]
    pub model_dir: Option<String>,
    /// With --model-dir: where to run the model.
    #[arg(long, value_parser = ["auto", "cpu", "cuda"], default_value = "auto", help_heading = "Server")]
    pub device: String,
    /// The model's id or alias. Default: the server's first chat model.
    #[arg(long, help_heading = CHAT)]
    pub model: Option<String>,
    /// A system message that starts the conversation (kept by /reset).
    #[arg(long, help_heading = CHAT)]
    pub system: Option<String>,
    /// Sampling temperature, 0 (greedy) to 2. Default: the model's.
    #[arg(long, help_heading = CHAT)]
    pub temperature: Option<f32>,
    /// Most tokens per reply. Default: what the context leaves.
    #[arg(long, help_heading = CHAT, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: Option<u32>,
    /// Seed of the sampler (the same seed and conversation give the same
    /// reply). Default: random.
    #[arg(long, help_heading = CHAT)]
    pub seed: Option<u64>,
}

/// One message of the conversation.
#[derive(Debug, Clone)]
struct Message {
    role: &'static str,
    content: String,
}

pub async fn run(args: ChatArgs, log_format: gyre_shim::logging::LogFormat) -> anyhow::Result<()> {
    // Logs would mix with the conversation: only when asked for.
    if std::env::var_os("RUST_LOG").is_some() {
        gyre_shim::logging::init(log_format);
    }
    let interactive = std::io::stdin().is_terminal();
    let mut server = match &args.model_dir {
        Some(source) => local::start(source, &args.device, interactive).await?,
        None => Server::connect(&args.server).await?,
    };
    let models = server.list_models().await?;
    let model = pick(&models, args.model.as_deref())?;
    let mut lines = read_lines();
    let mut interrupts = interrupts();
    let start: Vec<Message> = args
        .system
        .iter()
        .map(|s| Message {
            role: "system",
            content: s.clone(),
        })
        .collect();
    let mut history = start.clone();
    if interactive {
        eprintln!(
            "gyre chat: {model} on {}. /reset starts over, /exit or Ctrl-D quits, Ctrl-C stops a reply.",
            server.describe()
        );
    }
    let mut failed = 0usize;
    loop {
        // A Ctrl-C pressed while a reply was ending is not meant for the
        // prompt.
        while interrupts.try_recv().is_ok() {}
        if interactive {
            print_flush("> ");
        }
        let line = tokio::select! {
            line = lines.recv() => line,
            _ = interrupts.recv() => None,
        };
        let Some(line) = line else {
            if interactive {
                print_flush("\n");
            }
            break;
        };
        let command = line.trim();
        match command {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                history.clone_from(&start);
                if interactive {
                    eprintln!("(conversation reset)");
                }
                continue;
            }
            c if c.starts_with('/') && !c.contains(char::is_whitespace) => {
                eprintln!("unknown command {c}: /reset starts over, /exit quits");
                continue;
            }
            _ => {}
        }
        history.push(Message {
            role: "user",
            content: line,
        });
        match turn(
            &mut server,
            &model,
            &history,
            &args,
            &mut interrupts,
            interactive,
        )
        .await
        {
            Ok(reply) => history.push(Message {
                role: "assistant",
                content: reply,
            }),
            Err(e) => {
                history.pop();
                eprintln!("error: {e:#}");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        anyhow::bail!(
            "{failed} repl{} failed",
            if failed == 1 { "y" } else { "ies" }
        );
    }
    Ok(())
}

fn print_flush(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// The model to talk to: `wanted` (an id or alias) when given, else the
/// first model with a chat template.
fn pick(models: &[Value], wanted: Option<&str>) -> anyhow::Result<String> {
    let id = |m: &Value| m.get("id").and_then(Value::as_str).unwrap_or("").to_owned();
    let chat = |m: &Value| m.get("chat").and_then(Value::as_bool).unwrap_or(true);
    let listed = || models.iter().map(id).collect::<Vec<_>>().join(", ");
    match wanted {
        Some(name) => {
            let found = models.iter().find(|m| {
                id(m) == name
                    || m.get("aliases")
                        .and_then(Value::as_array)
                        .is_some_and(|a| a.iter().any(|x| x.as_str() == Some(name)))
            });
            match found {
                None => anyhow::bail!("no model `{name}` here (models: {})", listed()),
                Some(m) if !chat(m) => {
                    anyhow::bail!("model `{name}` does not chat (it has no chat template)")
                }
                Some(m) => Ok(id(m)),
            }
        }
        None => models
            .iter()
            .find(|m| chat(m))
            .map(id)
            .ok_or_else(|| anyhow::anyhow!("no model here chats (models: {})", listed())),
    }
}

/// Standard input's lines, read on a thread of their own (so that Ctrl-C
/// and the replies are not held up by a blocking read). The channel closes
/// at end of input.
fn read_lines() -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel(64);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        loop {
            let mut buf = Vec::new();
            match stdin.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf)
                        .trim_end_matches(['\r', '\n'])
                        .to_owned();
                    if tx.blocking_send(line).is_err() {
                        break;
                    }
                }
            }
        }
    });
    rx
}

/// Each Ctrl-C (SIGINT) as a message.
fn interrupts() -> mpsc::UnboundedReceiver<()> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            if tx.send(()).is_err() {
                break;
            }
        }
    });
    rx
}

/// A piece of a streamed reply.
enum Piece {
    Delta { reasoning: String, text: String },
    Finish { reason: String },
}

/// One reply being streamed. Dropping it cancels the call (gRPC) or
/// closes the connection (HTTP).
enum Reply {
    Grpc {
        stream: tonic::Streaming<v1::GenerateResponse>,
        url: String,
    },
    Http {
        body: hyper::body::Incoming,
        sse: SseReader,
        pending: std::collections::VecDeque<String>,
        _conn: Connection,
        url: String,
    },
}

impl Reply {
    async fn start(
        server: &mut Server,
        model: &str,
        history: &[Message],
        args: &ChatArgs,
    ) -> anyhow::Result<Self> {
        match server {
            Server::Grpc {
                client,
                url,
                api_key,
            } => {
                let request = v1::Request {
                    model: model.to_owned(),
                    input: Some(Input::Chat(v1::ChatInput {
                        messages: history
                            .iter()
                            .map(|m| v1::ChatMessage {
                                role: m.role.to_owned(),
                                content: Some(m.content.clone()),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    })),
                    sampling: Some(v1::SamplingParams {
                        temperature: args.temperature,
                        seed: args.seed,
                        ..Default::default()
                    }),
                    max_tokens: args.max_tokens,
                    ..Default::default()
                };
                let request = client::grpc_request(request, api_key.as_deref())?;
                let stream = client
                    .generate_stream(request)
                    .await
                    .map_err(|s| client::status_error(url, &s))?
                    .into_inner();
                Ok(Self::Grpc {
                    stream,
                    url: url.clone(),
                })
            }
            Server::Http { base, api_key } => {
                let body = http_body(model, history, args);
                Self::start_http(base, &body, api_key.as_deref()).await
            }
        }
    }

    async fn start_http(
        base: &HttpBase,
        body: &Value,
        api_key: Option<&str>,
    ) -> anyhow::Result<Self> {
        const PATH: &str = "/v1/chat/completions";
        let (response, conn) = base
            .send(http::Method::POST, PATH, Some(body), api_key)
            .await?;
        let status = response.status();
        if !status.is_success() {
            let bytes = client::read_body(response.into_body()).await?;
            return Err(base.http_error(PATH, status, &bytes));
        }
        Ok(Self::Http {
            body: response.into_body(),
            sse: SseReader::default(),
            pending: Default::default(),
            _conn: conn,
            url: format!("{}{PATH}", base.url),
        })
    }

    /// The next piece; None once the reply is complete.
    async fn next(&mut self) -> anyhow::Result<Option<Piece>> {
        match self {
            Self::Grpc { stream, url } => loop {
                let message = stream
                    .message()
                    .await
                    .map_err(|s| client::status_error(url, &s))?;
                let Some(message) = message else {
                    return Ok(None);
                };
                match message.event {
                    Some(Event::Delta(d)) => {
                        return Ok(Some(Piece::Delta {
                            reasoning: d.reasoning,
                            text: d.text,
                        }));
                    }
                    Some(Event::Finish(f)) => {
                        if let Some(e) = f.error {
                            anyhow::bail!("{url}: {}", e.message);
                        }
                        let reason = v1::FinishReason::try_from(f.reason)
                            .map_or("unknown", |r| r.as_str_name())
                            .trim_start_matches("FINISH_REASON_")
                            .to_ascii_lowercase();
                        return Ok(Some(Piece::Finish { reason }));
                    }
                    Some(Event::Prompt(_) | Event::Rejected(_)) | None => {}
                }
            },
            Self::Http {
                body,
                sse,
                pending,
                url,
                ..
            } => loop {
                if let Some(data) = pending.pop_front() {
                    if data == "[DONE]" {
                        return Ok(None);
                    }
                    return http_piece(&data, url).map(Some);
                }
                match body.frame().await {
                    None => return Ok(None),
                    Some(Err(e)) => anyhow::bail!("{url}: {}", client::chain(&e)),
                    Some(Ok(frame)) => {
                        if let Some(bytes) = frame.data_ref() {
                            pending.extend(sse.push(bytes));
                        }
                    }
                }
            },
        }
    }
}

/// The chat completion request of the OpenAI API for this turn.
fn http_body(model: &str, history: &[Message], args: &ChatArgs) -> Value {
    let messages: Vec<Value> = history
        .iter()
        .map(|m| json!({"role": m.role, "content": m.content}))
        .collect();
    let mut body = json!({"model": model, "messages": messages, "stream": true});
    if let Some(t) = args.temperature {
        body["temperature"] = json!(t);
    }
    if let Some(n) = args.max_tokens {
        body["max_tokens"] = json!(n);
    }
    if let Some(s) = args.seed {
        body["seed"] = json!(s);
    }
    body
}

/// One chat completion chunk.
fn http_piece(data: &str, url: &str) -> anyhow::Result<Piece> {
    let chunk: Value = serde_json::from_str(data)
        .map_err(|e| anyhow::anyhow!("{url}: a streamed chunk is not JSON: {e}"))?;
    if let Some(error) = chunk.get("error") {
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| error.to_string(), str::to_owned);
        anyhow::bail!("{url}: {message}");
    }
    let choice = chunk.pointer("/choices/0");
    let text = |key: &str| {
        choice
            .and_then(|c| c.pointer(&format!("/delta/{key}")))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned()
    };
    if let Some(reason) = choice
        .and_then(|c| c.get("finish_reason"))
        .and_then(Value::as_str)
    {
        let (reasoning, text) = (text("reasoning_content"), text("content"));
        if reasoning.is_empty() && text.is_empty() {
            return Ok(Piece::Finish {
                reason: reason.to_owned(),
            });
        }
        // Text and the finish in one chunk: the text now; the reason is
        // only a note.
        return Ok(Piece::Delta { reasoning, text });
    }
    Ok(Piece::Delta {
        reasoning: text("reasoning_content"),
        text: text("content"),
    })
}

/// Streams one reply to standard output; returns its text (what came
/// before a Ctrl-C, when one stopped it).
async fn turn(
    server: &mut Server,
    model: &str,
    history: &[Message],
    args: &ChatArgs,
    interrupts: &mut mpsc::UnboundedReceiver<()>,
    interactive: bool,
) -> anyhow::Result<String> {
    let mut reply = tokio::select! {
        r = Reply::start(server, model, history, args) => r?,
        _ = interrupts.recv() => {
            eprintln!("(stopped)");
            anyhow::bail!("stopped before the reply started");
        }
    };
    let mut text = String::new();
    let mut reasoning = false;
    let dim = interactive && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    loop {
        let piece = tokio::select! {
            p = reply.next() => match p {
                Ok(p) => p,
                Err(e) => {
                    // End the line the reply was on.
                    if !text.is_empty() || reasoning {
                        print_flush(if reasoning && dim { "\x1b[0m\n" } else { "\n" });
                    }
                    return Err(e);
                }
            },
            _ = interrupts.recv() => {
                drop(reply);
                if reasoning && dim {
                    print_flush("\x1b[0m");
                }
                print_flush("\n");
                eprintln!("(reply stopped)");
                return Ok(text);
            }
        };
        match piece {
            None => break,
            Some(Piece::Delta {
                reasoning: thought,
                text: piece,
            }) => {
                // The reasoning section is shown (dimmed) only on a
                // terminal; it is not part of the reply kept in history.
                if interactive && !thought.is_empty() {
                    if !reasoning && dim {
                        print_flush("\x1b[2m");
                    }
                    reasoning = true;
                    print_flush(&thought);
                }
                if !piece.is_empty() {
                    if reasoning {
                        if dim {
                            print_flush("\x1b[0m");
                        }
                        print_flush("\n");
                        reasoning = false;
                    }
                    print_flush(&piece);
                    text.push_str(&piece);
                }
            }
            Some(Piece::Finish { reason }) => {
                if interactive && reason == "length" {
                    print_flush("\n");
                    eprint!("(reply cut at --max-tokens or the context length)");
                }
            }
        }
    }
    if reasoning && dim {
        print_flush("\x1b[0m");
    }
    print_flush("\n");
    Ok(text)
}

/// `--model-dir`: the model served in this process.
mod local {
    use super::*;
    use gyre_engine::DeviceChoice;
    use gyre_engine::progress::{LoadProgress, TerminalBar};
    use gyre_service::registry::load::{self, LoadDefaults};
    use gyre_service::registry::spec::ModelSpec;
    use gyre_service::server::{ServerOptions, grpc_service_for};

    /// Loads `source` and serves it on a loopback port only this process
    /// knows the key of.
    pub async fn start(source: &str, device: &str, interactive: bool) -> anyhow::Result<Server> {
        let device = match device {
            "cpu" => DeviceChoice::Cpu,
            "cuda" => DeviceChoice::Cuda,
            _ => DeviceChoice::Auto,
        };
        let progress: Option<Arc<dyn LoadProgress>> = (interactive
            && std::io::stderr().is_terminal())
        .then(|| Arc::new(TerminalBar::new()) as Arc<dyn LoadProgress>);
        let defaults = LoadDefaults {
            device,
            kv_cache_mib: 1024,
            num_kv_blocks: None,
            block_size: 16,
            // One conversation: a few sequences are plenty (and cap the
            // KV cache at what they need).
            max_running: 4,
            max_batch_tokens: 512,
            max_queue: 16,
            embed_batch_tokens: 8192,
            compute_threads: None,
            dequantize: false,
            quant_activations: gyre_engine::Activations::default(),
            kv_cache_dtype: gyre_engine::KvCacheDtype::Auto,
            text: Default::default(),
            load_progress: progress,
            hub_cache: gyre_service::resolve::hub_cache_dir(),
            device_memory: None,
        };
        let registry = Arc::new(
            load::load_all(vec![ModelSpec::source(source)], &defaults)
                .await
                .map_err(|e| anyhow::anyhow!("--model-dir {source}: {e:#}"))?,
        );
        let key = format!("{:032x}", rand::random::<u128>());
        let (drain_tx, drain_rx) = tokio::sync::watch::channel(false);
        let options = ServerOptions {
            api_key: Some(key.clone()),
            ..ServerOptions::default()
        };
        let routes = grpc_service_for(registry, options, drain_rx).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        tokio::spawn(async move {
            let _draining = drain_tx;
            gyre_shim::conn::serve_tls(
                listener,
                None,
                routes,
                gyre_shim::conn::ConnLimits::default(),
                None,
                std::future::pending(),
            )
            .await;
        });
        let channel = client::grpc_channel(&url, None).await?;
        Ok(Server::Grpc {
            client: gyre_api::v1::generation_client::GenerationClient::new(channel),
            url: format!("{source} (in this process)"),
            api_key: Some(key),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_named_model_or_the_first_that_chats() {
        let models = [
            json!({"id": "embed", "chat": false, "aliases": []}),
            json!({"id": "chat", "chat": true, "aliases": ["gpt"]}),
        ];
        assert_eq!(pick(&models, None).expect("a chat model"), "chat");
        assert_eq!(pick(&models, Some("gpt")).expect("alias"), "chat");
        let e = pick(&models, Some("embed"))
            .expect_err("no template")
            .to_string();
        assert!(e.contains("does not chat"), "{e}");
        let e = pick(&models, Some("nope"))
            .expect_err("unknown")
            .to_string();
        assert!(e.contains("embed, chat"), "{e}");
        assert!(pick(&models[..1], None).is_err());
    }

    #[test]
    fn http_chunks_become_pieces() {
        let p = http_piece(
            r#"{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}"#,
            "u",
        )
        .expect("a chunk");
        assert!(matches!(p, Piece::Delta { ref text, .. } if text == "Hi"));
        let p = http_piece(
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#,
            "u",
        )
        .expect("a finish");
        assert!(matches!(p, Piece::Finish { ref reason } if reason == "length"));
        let e = http_piece(r#"{"error":{"message":"boom"}}"#, "u").err();
        assert!(e.is_some_and(|e| e.to_string().contains("boom")));
    }
}
