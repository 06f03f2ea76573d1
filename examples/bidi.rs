//! Two requests multiplexed on one bidirectional `Generate` stream: a short
//! greedy one, and a long story that is cancelled as soon as its first
//! tokens arrive. The short one finishes untouched.
//!
//! ```text
//! cargo run --example bidi
//! ```
//!
//! Prints one line per request: `<id>: <finish reason> after <n> tokens:
//! <text, quoted>`. Connection settings come from `GYRE_URL`,
//! `GYRE_API_KEY`, `GYRE_CA_CERT`, ... (see `Builder::from_env`).

use std::collections::HashMap;
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
    let client = Builder::from_env()?.connect().await?;
    let mut session = client.session().await?;

    // Each send returns the request's id (fresh ones, as no id is given).
    let short = session
        .send(
            "One, two, three,",
            &Params::new().max_tokens(10).temperature(0.0),
        )
        .await?;
    let long = session
        .send(
            "Once upon a time",
            &Params::new().max_tokens(1000).ignore_eos(true),
        )
        .await?;

    let mut text: HashMap<String, String> = HashMap::new();
    let mut ends: HashMap<String, String> = HashMap::new();
    let mut cancelled = false;
    while let Some(item) = session.next().await {
        let item = item?;
        match item.event? {
            Event::Delta(delta) => {
                text.entry(item.request_id.clone())
                    .or_default()
                    .push_str(&delta.text);
                if item.request_id == long && !cancelled && !delta.token_ids.is_empty() {
                    session.cancel(long.as_str()).await?;
                    cancelled = true;
                    // Nothing more to send: half-close, and the server ends
                    // the stream once both requests have finished.
                    session.close();
                }
            }
            Event::Finish(finish) => {
                let summary = format!(
                    "{} after {} tokens",
                    finish.reason, finish.usage.completion_tokens
                );
                ends.insert(item.request_id, summary);
            }
            Event::Prompt(..) => {}
        }
    }
    for id in [&short, &long] {
        let end = ends
            .get(id)
            .ok_or_else(|| format!("request {id} never finished"))?;
        let text = text.get(id).map_or("", String::as_str);
        println!("{id}: {end}: {text:?}");
    }
    Ok(())
}
