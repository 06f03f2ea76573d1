//! The real Gemma 3 270M (Q4_K_M GGUF) against transformers loading the same
//! file (`tests/fixtures/make_gemma3_refs.py`, run by `make models`): float32
//! logits over each prompt within 1e-3, and the greedy 32-token
//! continuations identical, with both prompts running at once through the
//! engine thread (so sliding and global layers, the two rope bases, the q/k
//! norms and the norms' `+ 1` taken off the GGUF all count). transformers
//! dequantizes the file, so gyre does too here (`LoadOptions::dequantize`);
//! the quantized kernels have their own tests (`gguf_quant.rs`).

use std::path::PathBuf;

use gyre_engine::internals::load_model_with;
use gyre_engine::{
    DeviceChoice, Engine, EngineOptions, Event, GenerateRequest, LoadOptions, Sampling,
};
use serde_json::Value;

const TOLERANCE: f64 = 1e-3;

fn refs() -> PathBuf {
    std::env::var_os("GYRE_GGUF_REF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.gyre/gguf-ref"))
        .join("gemma3")
}

fn manifest() -> Value {
    let p = refs().join("manifest.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; make the references first: `make models`",
            p.display()
        )
    });
    serde_json::from_str(&text).expect("manifest parses")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id list")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn real_gemma3_logits_match_transformers() {
    let m = manifest();
    let path = PathBuf::from(m["gguf"].as_str().expect("gguf path"));
    let _guard = tch::no_grad_guard();
    let dequantized = LoadOptions {
        dequantize: true,
        ..LoadOptions::default()
    };
    let model =
        load_model_with(&path, DeviceChoice::Cpu, dequantized).expect("the Gemma 3 GGUF loads");
    assert_eq!(model.config().architecture, "Gemma3ForCausalLM");
    for case in m["cases"].as_array().expect("cases") {
        let prompt = ids(&case["prompt_ids"]);
        let bytes = std::fs::read(refs().join(case["logits_file"].as_str().expect("file")))
            .expect("reference logits");
        let theirs: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let ours = model.score(&prompt).expect("forward");
        let ours: Vec<Vec<f32>> = Vec::<Vec<f32>>::try_from(&ours).expect("to vec");
        let vocab = case["vocab"].as_u64().expect("vocab") as usize;
        assert_eq!(ours.len() * vocab, theirs.len(), "positions");
        let mut max_diff = 0f64;
        for (row, trow) in ours.iter().zip(theirs.chunks_exact(vocab)) {
            assert_eq!(row.len(), vocab, "vocabulary size");
            for (a, b) in row.iter().zip(trow) {
                max_diff = max_diff.max((*a as f64 - *b as f64).abs());
            }
        }
        println!(
            "{:?}: max |logit diff| vs transformers = {max_diff:.3e} over {} positions",
            case["prompt"],
            ours.len()
        );
        assert!(max_diff <= TOLERANCE, "max abs logit diff {max_diff}");
    }
}

#[test]
fn real_gemma3_greedy_continuations_match_transformers() {
    let m = manifest();
    let path = PathBuf::from(m["gguf"].as_str().expect("gguf path"));
    let mut opts = EngineOptions::new(&path);
    opts.device = DeviceChoice::Cpu;
    opts.load_options.dequantize = true;
    let engine = Engine::start(opts).expect("engine starts");
    let cases = m["cases"].as_array().expect("cases");
    let rxs: Vec<_> = cases
        .iter()
        .map(|c| {
            let want = ids(&c["greedy_ids"]);
            engine
                .submit(GenerateRequest {
                    sampling: Sampling {
                        temperature: 0.0,
                        ..Sampling::default()
                    },
                    ignore_eos: true,
                    ..GenerateRequest::new(ids(&c["prompt_ids"]), want.len() as u32)
                })
                .expect("submit")
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    for (c, mut rx) in cases.iter().zip(rxs) {
        let toks = rt.block_on(async {
            let mut toks = Vec::new();
            while let Some(ev) = rx.recv().await {
                match ev {
                    Event::Token(t) => toks.push(t),
                    Event::Finished { .. } => break,
                    Event::Failed(e) => panic!("{e}"),
                    _ => {}
                }
            }
            toks
        });
        let want = ids(&c["greedy_ids"]);
        assert_eq!(want.len(), 32);
        assert_eq!(toks, want, "{:?}: greedy ids differ", c["prompt"]);
        println!("{:?}: {:?} identical", c["prompt"], c["greedy_text"]);
    }
}
