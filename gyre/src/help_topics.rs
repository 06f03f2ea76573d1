//! `gyre --help` and `gyre serve --help` list the flags by topic: each flag
//! of `gyre serve` and `gyre grpc` (and the global ones) gets its section
//! here, by its id (the field's name), so that the flags themselves (some
//! from the shim's flattened groups) keep only their meaning. A flag that
//! already has a heading keeps it. The tests fail on a flag without one.

use clap::{Arg, Command};

pub const MODELS: &str = "Models";
pub const SPECULATIVE: &str = "Speculative decoding";
pub const SCHEDULER: &str = "Scheduler and KV cache";
pub const NETWORK: &str = "Serving and network";
pub const SECURITY: &str = "Security (keys, TLS, CORS)";
pub const STORE: &str = "Responses store and idempotency";
pub const OBSERVABILITY: &str = "Observability (logs, metrics, tracing)";

/// Each flag's section, by id.
const TOPICS: &[(&str, &[&str])] = &[
    (
        MODELS,
        &[
            "model",
            "config",
            "revision",
            "served_model_name",
            "device",
            "device_memory_mib",
            "chat_template",
            "trust_request_chat_template",
            "tool_call_parser",
            "reasoning_parser",
        ],
    ),
    (
        SPECULATIVE,
        &["draft_model", "speculative_config", "prompt_lookup_tokens"],
    ),
    (
        SCHEDULER,
        &[
            "kv_cache_mib",
            "num_kv_blocks",
            "block_size",
            "max_running",
            "max_batch_tokens",
            "max_queue",
            "compute_threads",
            "server_threads",
            "dequantize",
            "quant_activations",
            "kv_cache_dtype",
            "embed_batch_tokens",
        ],
    ),
    (
        NETWORK,
        &[
            "grpc_addr",
            "http_addr",
            "drain_timeout",
            "deep_health_interval_secs",
            "deep_health_timeout_secs",
            "header_read_timeout",
            "idle_timeout",
            "max_connections",
            "http2_keepalive_interval",
            "http2_keepalive_timeout",
            "upstream_connections",
            "body_timeout",
            "sse_heartbeat_secs",
            "upstream_keepalive_interval",
            "upstream_keepalive_timeout",
            "no_playground",
        ],
    ),
    (
        SECURITY,
        &[
            "api_key",
            "keys_file",
            "open_endpoints",
            "admin_api_key",
            "tls_cert",
            "tls_key",
            "tls_client_ca",
            "cors_allow_origin",
        ],
    ),
    (
        STORE,
        &[
            "responses_dir",
            "responses_max_entries",
            "responses_max_age",
            "idempotency_ttl_secs",
            "idempotency_max_keys",
            "idempotency_max_mib",
        ],
    ),
    (
        OBSERVABILITY,
        &[
            "log_format",
            "otlp_endpoint",
            "log_prompts",
            "disable_metrics",
            "metrics_addr",
            "metrics_vllm_names",
        ],
    ),
];

/// The section of flag `id`, if it has one here.
fn topic(id: &str) -> Option<&'static str> {
    TOPICS
        .iter()
        .find(|(_, ids)| ids.contains(&id))
        .map(|(heading, _)| *heading)
}

fn with_topic(arg: Arg) -> Arg {
    if arg.get_help_heading().is_some() {
        return arg;
    }
    match topic(arg.get_id().as_str()) {
        Some(heading) => arg.help_heading(heading),
        None => arg,
    }
}

/// `cmd` with every flag of the table under its heading (the root's global
/// flags, and each subcommand's).
pub fn apply(cmd: Command) -> Command {
    cmd.mut_args(with_topic)
        .mut_subcommands(|sub| sub.mut_args(with_topic))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    fn built() -> Command {
        let mut cmd = apply(crate::Cli::command());
        cmd.build();
        cmd
    }

    #[test]
    fn every_flag_of_the_servers_and_clients_has_a_heading() {
        let cmd = built();
        let mut missing = Vec::new();
        let subs = ["serve", "grpc", "chat", "models"].map(|name| {
            cmd.find_subcommand(name)
                .unwrap_or_else(|| panic!("no {name}"))
        });
        for c in std::iter::once(&cmd).chain(subs) {
            for arg in c.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help_heading().is_none() {
                    missing.push(format!("{} --{id}", c.get_name()));
                }
            }
        }
        assert!(missing.is_empty(), "flags without a heading: {missing:?}");
    }

    #[test]
    fn each_id_has_one_topic() {
        let mut seen = std::collections::HashSet::new();
        for (_, ids) in TOPICS {
            for id in *ids {
                assert!(seen.insert(*id), "{id} is listed twice");
            }
        }
    }

    #[test]
    fn serve_help_shows_the_sections() {
        let mut cmd = built();
        let serve = cmd.find_subcommand_mut("serve").expect("serve");
        let help = serve.render_long_help().to_string();
        for heading in [
            MODELS,
            SPECULATIVE,
            SCHEDULER,
            NETWORK,
            SECURITY,
            STORE,
            OBSERVABILITY,
        ] {
            assert!(
                help.contains(&format!("{heading}:")),
                "{heading} in\n{help}"
            );
        }
    }
}
