//! Streams a greedy completion of a prompt to stdout, token by token, then
//! prints how it finished to stderr.
//!
//! ```text
//! cargo run --example generate -- "The capital of France is" 32
//! ```
//!
//! The server is `GYRE_URL` (default http://127.0.0.1:50051); `GYRE_API_KEY`
//! is sent when set, and `GYRE_CA_CERT` (with `GYRE_CLIENT_CERT` and
//! `GYRE_CLIENT_KEY` for mTLS) turns TLS on (see `Builder::from_env`).

use std::io::Write as _;
use std::process::ExitCode;

use futures::StreamExt as _;
use gyre_api::client::{Builder, Event, Params};

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let prompt = args
        .next()
        .unwrap_or_else(|| "The capital of France is".to_string());
    let max_tokens: u32 = match args.next() {
        Some(n) => n
            .parse()
            .map_err(|e| format!("max_tokens `{n}` is not a count: {e}"))?,
        None => 32,
    };

    let client = Builder::from_env()?.connect().await?;
    // Temperature 0: greedy, the same answer every time. The model is the
    // server's default (Params::model picks another).
    let params = Params::new().max_tokens(max_tokens).temperature(0.0);
    let mut events = client.generate(prompt, &params).await?;
    let model = events.model().unwrap_or("?").to_string();

    let mut stdout = std::io::stdout();
    while let Some(event) = events.next().await {
        match event? {
            Event::Delta(delta) => {
                stdout.write_all(delta.text.as_bytes())?;
                stdout.flush()?;
            }
            Event::Finish(finish) => {
                println!();
                eprintln!(
                    "finish: {}, {} prompt + {} completion tokens, model {model}",
                    finish.reason, finish.usage.prompt_tokens, finish.usage.completion_tokens,
                );
            }
            Event::Prompt(..) => {}
        }
    }
    Ok(())
}
