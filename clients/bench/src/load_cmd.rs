//! `gyre-bench load`: the load generator alone, against a running server.
//! One run per API asked for; prints a table of TTFT, ITL (p50/p99) and
//! output tok/s, and optionally writes every record as JSON.

use std::time::Instant;

use anyhow::Context as _;
use gyre_api::v1::ListModelsRequest;
use serde_json::json;

use crate::cli::LoadArgs;
use crate::http::HttpTarget;
use crate::load::{self, Api, Arrival, Clients, Prompt, RequestSpec};
use crate::report::{self, Row, ScenarioResult};
use crate::stats::Summary;

pub async fn main(args: LoadArgs) -> anyhow::Result<()> {
    let command = report::command_line();
    println!("$ {command}");
    // gRPC is needed for its requests, or to learn the model id and vocabulary.
    let http_only = !args.api.contains(&Api::Grpc) && args.model_id.is_some();
    let connections = if http_only {
        0
    } else {
        args.connections.max(1)
    };
    let mut clients = Clients::connect(&args.grpc_url, connections, None).await?;
    let (model_id, vocab_size) = match clients.grpc.first_mut() {
        None => (args.model_id.clone().unwrap_or_default(), args.vocab_size),
        Some(client) => {
            let models = client
                .list_models(ListModelsRequest::default())
                .await
                .context("ListModels")?
                .into_inner()
                .models;
            let model = models.first().context("the server lists no model")?;
            let id = args.model_id.clone().unwrap_or_else(|| model.id.clone());
            (id, model.vocab_size)
        }
    };
    if let Some(addr) = args.http_addr {
        clients.http = Some(HttpTarget {
            addr,
            model: model_id.clone(),
            api_key: None,
        });
    }
    let n = match args.rate {
        Some(_) => args.requests.max(1),
        None => args.streams.max(1) * args.per_stream.max(1),
    };
    let hi = vocab_size.saturating_sub(300).max(301);
    let specs: Vec<RequestSpec> = match &args.prompt_text {
        Some(text) => vec![RequestSpec::new(
            Prompt::Text(text.clone()),
            args.output_len,
        )],
        None => load::random_prompts(n, args.prompt_len, 300..hi, args.seed)
            .into_iter()
            .map(|ids| RequestSpec::new(Prompt::Ids(ids), args.output_len))
            .collect(),
    }
    .into_iter()
    .map(|mut s| {
        s.model.clone_from(&model_id);
        s.cancel_after = args.cancel_after;
        s
    })
    .collect();
    let arrival = match args.rate {
        Some(rate) => Arrival::Poisson {
            rate,
            requests: args.requests,
            duration_s: args.duration_s,
            seed: args.seed,
        },
        None => Arrival::Concurrent {
            streams: args.streams,
            per_stream: args.per_stream,
        },
    };
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    for api in &args.api {
        anyhow::ensure!(
            *api == Api::Grpc || clients.http.is_some(),
            "--api http needs --http-addr"
        );
        eprintln!("gyre-bench: {api:?}: {arrival:?} ...");
        let records = load::run(&clients, *api, &arrival, &specs, Instant::now()).await;
        let s = Summary::of(&records);
        let name = format!("{api:?}").to_lowercase();
        rows.push(
            Row::new(&name, "output tok/s; TTFT p50/p99; ITL p50/p99 (ms)").gyre(format!(
                "{:.1}; {:.2}/{:.2}; {:.2}/{:.2}",
                s.output_tok_per_s, s.ttft_ms.p50, s.ttft_ms.p99, s.itl_ms.p50, s.itl_ms.p99
            )),
        );
        rows.push(
            Row::new(&name, "requests, errors, tokens, wall s").gyre(format!(
                "{}, {}, {}, {:.2}",
                s.requests, s.errors, s.output_tokens, s.wall_s
            )),
        );
        if !s.error_samples.is_empty() {
            eprintln!("gyre-bench: {name} errors: {:?}", s.error_samples);
        }
        runs.push(json!({ "api": api, "summary": s, "records": records }));
    }
    let result = ScenarioResult {
        id: "load".into(),
        title: "load".into(),
        rows,
        details: serde_json::Value::Null,
        error: None,
        seconds: 0.0,
    };
    print!("{}", report::table(std::slice::from_ref(&result)));
    if let Some(path) = &args.json_out {
        let report = json!({
            "command": command,
            "model": model_id,
            "arrival": arrival,
            "prompt_len": args.prompt_len,
            "output_len": args.output_len,
            "runs": runs,
        });
        report::write_json(path, &report)?;
        println!("JSON: {}", path.display());
    }
    Ok(())
}
