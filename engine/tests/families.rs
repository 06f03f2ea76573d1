//! The loader picks a family from the checkpoint's architecture and refuses,
//! naming it, what no family implements: an unknown architecture, a config
//! field a family would otherwise ignore, or weights a family would leave
//! unused. Each case is a real tiny fixture with one field of its
//! config.json changed.

use std::path::{Path, PathBuf};

use gyre_engine::DeviceChoice;
use gyre_engine::internals::load_model;
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    std::env::var_os("GYRE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.gyre/models"))
        .join(name)
}

/// A copy of fixture `name` (weights linked, not copied) whose config.json
/// is changed by `edit`.
fn variant(name: &str, tag: &str, edit: impl FnOnce(&mut Value)) -> PathBuf {
    let src = fixture(name);
    let dst =
        std::env::temp_dir().join(format!("gyre-families-{}-{name}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir_all(&dst).expect("temp dir");
    for e in std::fs::read_dir(&src).expect("fixture exists (`make models`)") {
        let p = e.expect("entry").path();
        let file = p.file_name().expect("name").to_owned();
        if file != "config.json" {
            std::os::unix::fs::symlink(&p, dst.join(&file)).expect("link");
        }
    }
    let mut cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).expect("config"))
            .expect("json");
    edit(&mut cfg);
    std::fs::write(dst.join("config.json"), cfg.to_string()).expect("write config");
    dst
}

fn load_error(dir: &Path) -> String {
    let _guard = tch::no_grad_guard();
    let e = match load_model(dir, DeviceChoice::Cpu) {
        Ok(_) => panic!("{} loaded", dir.display()),
        Err(e) => e.to_string(),
    };
    let _ = std::fs::remove_dir_all(dir);
    e
}

#[test]
fn every_fixture_family_loads() {
    let _guard = tch::no_grad_guard();
    for (name, arch) in [
        ("tiny-llama", "LlamaForCausalLM"),
        ("tiny-mistral-sw", "MistralForCausalLM"),
        ("tiny-qwen2", "Qwen2ForCausalLM"),
        ("tiny-qwen3", "Qwen3ForCausalLM"),
        ("tiny-gemma3", "Gemma3ForCausalLM"),
        ("tiny-gemma2", "Gemma2ForCausalLM"),
        ("tiny-phi3", "Phi3ForCausalLM"),
        ("tiny-phi4", "Phi3ForCausalLM"),
        ("tiny-mixtral", "MixtralForCausalLM"),
        ("tiny-qwen3-moe", "Qwen3MoeForCausalLM"),
    ] {
        let m = load_model(&fixture(name), DeviceChoice::Cpu).expect("loads");
        assert_eq!(m.config().architecture, arch);
    }
}

#[test]
fn an_unknown_architecture_is_named() {
    let dir = variant("tiny-llama", "arch", |c| {
        c["architectures"] = serde_json::json!(["FancyNewForCausalLM"]);
    });
    let e = load_error(&dir);
    assert!(
        e.contains("FancyNewForCausalLM") && e.contains("Qwen3ForCausalLM"),
        "{e}"
    );
}

/// A change to a config.json.
type Edit = fn(&mut Value);

#[test]
fn config_fields_no_family_implements_are_named() {
    let cases: [(&str, &str, Edit); 5] = [
        ("tiny-qwen3", "use_sliding_window", |c| {
            c["use_sliding_window"] = true.into();
            c["sliding_window"] = 8.into();
        }),
        ("tiny-llama", "yarn", |c| {
            c["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 4.0});
        }),
        ("tiny-llama", "mlp_bias", |c| c["mlp_bias"] = true.into()),
        ("tiny-mistral", "partial_rotary_factor", |c| {
            c["partial_rotary_factor"] = 0.5.into();
        }),
        ("tiny-qwen2", "gelu_pytorch_tanh", |c| {
            c["hidden_act"] = "gelu_pytorch_tanh".into();
        }),
    ];
    for (name, field, edit) in cases {
        let e = load_error(&variant(name, field, edit));
        assert!(e.contains(field), "{name} with {field}: {e}");
    }
}

/// What the Gemma families do not implement is named too: Gemma 3's
/// `attn_logit_softcapping` (transformers' Gemma 3 never applies it),
/// bidirectional attention, an activation other than the tanh GELU, a
/// rope type without an implementation in the per-layer-type
/// `rope_parameters`, and a `layer_types` entry that is neither kind.
#[test]
fn gemma_config_fields_they_do_not_implement_are_named() {
    let cases: [(&str, &str, Edit); 5] = [
        ("tiny-gemma3", "attn_logit_softcapping", |c| {
            c["attn_logit_softcapping"] = 50.0.into();
        }),
        ("tiny-gemma2", "use_bidirectional_attention", |c| {
            c["use_bidirectional_attention"] = true.into();
        }),
        ("tiny-gemma2", "silu", |c| {
            c["hidden_activation"] = "silu".into()
        }),
        ("tiny-gemma3", "yarn", |c| {
            c["rope_parameters"] = serde_json::json!({
                "full_attention": {"rope_type": "yarn", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            });
        }),
        ("tiny-gemma3", "chunked_attention", |c| {
            c["layer_types"][1] = "chunked_attention".into();
        }),
    ];
    for (name, field, edit) in cases {
        let e = load_error(&variant(name, field, edit));
        assert!(e.contains(field), "{name} with {field}: {e}");
    }
}

/// The Phi-3 and mixture-of-experts families refuse, naming it, what they
/// do not implement: longrope in a family that does not switch its tables,
/// factor lists that do not fit the rotary width, an unknown rope type,
/// Qwen3-MoE's sliding window, routing to more experts than there are.
#[test]
fn phi_and_moe_config_fields_they_do_not_implement_are_named() {
    let cases: [(&str, &str, Edit); 6] = [
        ("tiny-llama", "longrope", |c| {
            let ones = vec![1.0f64; 8];
            c["rope_scaling"] = serde_json::json!({"rope_type": "longrope",
                "short_factor": ones, "long_factor": ones,
                "original_max_position_embeddings": 64});
        }),
        ("tiny-phi4", "short_factor", |c| {
            c["rope_scaling"]["short_factor"] = serde_json::json!([1.0, 2.0]);
        }),
        ("tiny-phi3", "dynamic", |c| {
            c["rope_scaling"] = serde_json::json!({"rope_type": "dynamic", "factor": 2.0});
        }),
        ("tiny-qwen3-moe", "use_sliding_window", |c| {
            c["use_sliding_window"] = true.into();
            c["sliding_window"] = 8.into();
        }),
        ("tiny-mixtral", "5 of 4 experts", |c| {
            c["num_experts_per_tok"] = 5.into();
        }),
        ("tiny-qwen3-moe", "num_experts 0", |c| {
            c["num_experts"] = 0.into()
        }),
    ];
    for (name, field, edit) in cases {
        let e = load_error(&variant(name, field, edit));
        assert!(e.contains(field), "{name} with {field}: {e}");
    }
}

/// A Qwen3 checkpoint labelled Llama would run without its q/k norms; the
/// weights it leaves over fail the load instead.
#[test]
fn weights_a_family_leaves_unused_fail_the_load() {
    let dir = variant("tiny-qwen3", "as-llama", |c| {
        c["architectures"] = serde_json::json!(["LlamaForCausalLM"]);
    });
    let e = load_error(&dir);
    assert!(e.contains("does not use") && e.contains("q_norm"), "{e}");
}
