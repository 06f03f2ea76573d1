//! Asks the model one question with chat messages (rendered with its chat
//! template) and prints the whole answer.
//!
//! ```text
//! cargo run --example chat -- "What is the capital of France?" ["You are terse."]
//! ```
//!
//! The second argument, when given, is a system message. Connection
//! settings come from `GYRE_URL`, `GYRE_API_KEY`, `GYRE_CA_CERT`, ... (see
//! `Builder::from_env`).

use std::process::ExitCode;

use gyre_api::client::{Builder, Message, Params};

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
    let question = args
        .next()
        .unwrap_or_else(|| "What is the capital of France?".to_string());
    let mut messages = Vec::new();
    if let Some(system) = args.next() {
        messages.push(Message::system(system));
    }
    messages.push(Message::user(question));

    let client = Builder::from_env()?.connect().await?;
    let answer = client
        .chat(messages, &Params::new().max_tokens(64).temperature(0.0))
        .await?;
    println!("{}", answer.text());
    let usage = answer.usage();
    eprintln!(
        "finish: {}, {} prompt + {} completion tokens, model {}",
        answer.finish_reason().map_or("?", |r| r.as_str()),
        usage.prompt_tokens,
        usage.completion_tokens,
        answer.model.as_deref().unwrap_or("?"),
    );
    Ok(())
}
