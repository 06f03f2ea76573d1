//! The server's health and models, then a text's token ids under the
//! default model and the ids decoded back.
//!
//! ```text
//! cargo run --example tokenize -- "The capital of France is"
//! ```
//!
//! Connection settings come from `GYRE_URL`, `GYRE_API_KEY`,
//! `GYRE_CA_CERT`, ... (see `Builder::from_env`).

use std::process::ExitCode;

use gyre_api::client::Builder;

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
    let text = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "The capital of France is".to_string());

    let client = Builder::from_env()?.connect().await?;
    println!("health: {:?}", client.health("").await?);
    let models = client.models().await?;
    let ids: Vec<&str> = models.iter().map(|m| m.id.as_str()).collect();
    println!("models: {}", ids.join(" "));

    // `None`: the server's default model.
    let tokens = client.tokenize(text, None).await?;
    println!("token_ids: {:?}", tokens.token_ids);
    println!("max_model_len: {}", tokens.max_model_len);
    let back = client.detokenize(tokens.token_ids, None).await?;
    println!("detokenized: {back:?}");
    Ok(())
}
