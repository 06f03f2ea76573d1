//! `gyre-bench run`: builds (or finds) the model, starts `gyre serve` on it,
//! runs the scenarios, prints the table and writes the JSON report.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use gyre_api::v1::ListModelsRequest;
use serde_json::{Value, json};

use crate::cli::RunArgs;
use crate::http::HttpTarget;
use crate::load::Clients;
use crate::reference::Python;
use crate::report;
use crate::scenarios::{self, Ctx, Sizes};
use crate::server::{Server, ServerOptions};

pub async fn main(args: RunArgs) -> anyhow::Result<()> {
    let command = report::command_line();
    println!("$ {command}");
    let started = std::time::Instant::now();
    let python = Python::locate(args.python.clone(), args.scripts_dir.clone());
    let model_dir = model_dir(&args, &python).await?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get));
    let scratch = std::env::temp_dir().join(format!("gyre-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;

    let (server, grpc_url, http_addr) = match (&args.grpc_url, args.http_addr) {
        (Some(url), Some(addr)) => (None, url.clone(), addr),
        _ => {
            let bin = gyre_bin(args.gyre_bin.clone());
            let server = Server::start(ServerOptions {
                bin: &bin,
                model: &model_dir,
                device: &args.device,
                threads,
                log: scratch.join("gyre.log"),
                extra_args: &args.server_args,
            })
            .await?;
            eprintln!(
                "gyre-bench: {} serving {} (gRPC {}, HTTP {}; log {})",
                bin.display(),
                model_dir.display(),
                server.grpc_url,
                server.http_addr,
                server.log.display()
            );
            let (url, addr) = (server.grpc_url.clone(), server.http_addr);
            (Some(server), url, addr)
        }
    };
    let mut clients = Clients::connect(&grpc_url, 1, None).await?;
    let models = clients.grpc[0]
        .list_models(ListModelsRequest::default())
        .await
        .context("ListModels")?
        .into_inner()
        .models;
    let model = models.first().context("the server lists no model")?.clone();
    clients.http = Some(HttpTarget {
        addr: http_addr,
        model: model.id.clone(),
    });

    let mut sizes = if args.quick {
        Sizes::quick()
    } else {
        Sizes::full()
    };
    override_sizes(&mut sizes, &args);
    let ctx = Ctx {
        clients,
        python: python.clone(),
        model_dir: model_dir.clone(),
        vocab_size: model.vocab_size,
        threads,
        device: args.device.clone(),
        scratch: scratch.clone(),
        sizes: sizes.clone(),
        seed: args.seed,
        no_reference: args.no_reference,
    };
    let load_before = loadavg();
    if load_before.first().is_some_and(|l| *l > 0.5) {
        eprintln!(
            "gyre-bench: warning: the machine is already busy (load average {load_before:?}); \
             figures will be noisy"
        );
    }
    let results = tokio::select! {
        results = scenarios::run(&ctx, &args.only) => results,
        () = interrupted() => {
            if let Some(server) = server {
                server.stop().await;
            }
            anyhow::bail!("interrupted");
        }
    };
    let load_after = loadavg();
    let server_alive = match server {
        Some(mut s) => {
            let alive = s.alive();
            s.stop().await;
            Some(alive)
        }
        None => None,
    };

    println!("\n$ {command}");
    println!(
        "model {} ({} parameters, {}), {threads} threads, device {}; load average {:?} -> {:?}\n",
        model_dir.display(),
        param_count(&model_dir).map_or("?".into(), |n| format!("{:.1} M", n as f64 / 1e6)),
        model.architecture,
        args.device,
        load_before,
        load_after,
    );
    print!("{}", report::table(&results));
    let report = json!({
        "command": command,
        "unix_time": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        "total_seconds": started.elapsed().as_secs_f64(),
        "model": {
            "dir": model_dir,
            "id": model.id,
            "architecture": model.architecture,
            "parameters": param_count(&model_dir),
            "vocab_size": model.vocab_size,
            "max_model_len": model.max_model_len,
        },
        "threads": threads,
        "device": args.device,
        "cpus": std::thread::available_parallelism().map_or(0, std::num::NonZero::get),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "quick": args.quick,
        "seed": args.seed,
        "sizes": sizes,
        "python": python,
        "grpc_url": grpc_url,
        "http_addr": http_addr.to_string(),
        "server_alive_at_end": server_alive,
        "rows": results.iter().flat_map(|r| r.rows.clone()).collect::<Vec<_>>(),
        "scenarios": results,
    });
    report::write_json(&args.json_out, &report)?;
    println!("\nJSON: {}", args.json_out.display());
    if server_alive == Some(false) {
        anyhow::bail!(
            "the gyre server died during the run (log in {})",
            scratch.display()
        );
    }
    Ok(())
}

/// The model directory: `--model`, or the default bench model, built (or
/// checked up to date) with make_bench_model.py.
async fn model_dir(args: &RunArgs, python: &Python) -> anyhow::Result<PathBuf> {
    if let Some(dir) = &args.model {
        anyhow::ensure!(
            dir.join("config.json").is_file(),
            "{} has no config.json (build one with clients/bench/make_bench_model.py --out DIR)",
            dir.display()
        );
        return Ok(std::path::absolute(dir)?);
    }
    let (name, preset) = if args.quick {
        ("llama-quick", "quick")
    } else {
        ("llama-64m", "bench")
    };
    let dir = std::path::absolute(Path::new(".gyre/bench").join(name))?;
    let said = python.make_model(&dir, preset).await?;
    eprintln!("gyre-bench: {said}");
    Ok(dir)
}

/// Resolves on Ctrl-C or SIGTERM, so the server is stopped before exiting.
async fn interrupted() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// The 1, 5 and 15 minute load averages (empty where /proc is missing).
fn loadavg() -> Vec<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .filter_map(|v| v.parse().ok())
        .collect()
}

/// `--gyre-bin`, else `gyre` beside this executable, else `gyre` on PATH.
fn gyre_bin(given: Option<PathBuf>) -> PathBuf {
    given.unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|d| d.join("gyre")))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("gyre"))
    })
}

fn override_sizes(sizes: &mut Sizes, args: &RunArgs) {
    if let Some(v) = args.prompt_len {
        sizes.prompt_len = v;
    }
    if let Some(v) = args.output_len {
        sizes.output_len = v;
    }
    if let Some(v) = args.streams {
        sizes.s2_streams = v;
    }
    if let Some(v) = args.prefix_len {
        sizes.s3_prefix = v;
    }
    if let Some(v) = args.storm {
        sizes.s5_grpc = v;
    }
    if let Some(v) = args.hf_repeats {
        sizes.hf_repeats = v;
    }
}

/// Parameters of a Llama-family model from its config.json (untied or tied
/// embeddings, GQA), without loading weights.
pub fn param_count(dir: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    let c: Value = serde_json::from_str(&text).ok()?;
    let get = |k: &str| c.get(k).and_then(Value::as_u64);
    let (h, i, n, v) = (
        get("hidden_size")?,
        get("intermediate_size")?,
        get("num_hidden_layers")?,
        get("vocab_size")?,
    );
    let heads = get("num_attention_heads")?;
    let hd = get("head_dim").unwrap_or(h / heads.max(1));
    let (q, kv) = (heads * hd, get("num_key_value_heads").unwrap_or(heads) * hd);
    let bias = if c.get("attention_bias").and_then(Value::as_bool) == Some(true) {
        q + 2 * kv
    } else {
        0
    };
    let layer = 2 * h * q + 2 * h * kv + bias + 3 * h * i + 2 * h;
    let tied = c.get("tie_word_embeddings").and_then(Value::as_bool) == Some(true);
    Some(if tied { 1 } else { 2 } * v * h + n * layer + h)
}
