//! `gyre-bench`: a load generator for gyre's gRPC API and OpenAI HTTP API,
//! and a one-run comparison of gyre against transformers on the same
//! HuggingFace model directory (see `scenarios` and the README section).
#![forbid(unsafe_code)]

mod ceilings;
mod cli;
mod gguf_info;
mod grpc;
mod http;
mod llama_server;
mod load;
mod load_cmd;
mod otlp;
mod paired;
mod reference;
mod report;
mod run_cmd;
mod scenarios;
mod server;
mod sse;
mod stats;

use clap::Parser as _;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.client_threads.max(1))
        .enable_all()
        .build();
    let result = match runtime {
        Err(e) => Err(e.into()),
        Ok(runtime) => runtime.block_on(async {
            match cli.command {
                cli::Command::Run(args) => run_cmd::main(*args).await,
                cli::Command::Load(args) => load_cmd::main(*args).await,
                cli::Command::Ceilings(args) => {
                    let threads = args.threads.unwrap_or_else(|| {
                        std::thread::available_parallelism().map_or(1, |n| n.get())
                    });
                    tokio::task::spawn_blocking(move || {
                        ceilings::compare_pages(threads, args.rounds);
                    })
                    .await
                    .map_err(Into::into)
                }
            }
        }),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gyre-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
