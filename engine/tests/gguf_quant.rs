//! The real SmolLM2-135M-Instruct Q4_1 GGUF with its matrices kept in their
//! blocks (Q4_1 layers; the Q8_0 embedding, tied to the LM head) against the
//! same file dequantized to f32 (the path `gguf.rs` holds to transformers
//! within 1e-4), on the prompts of `tests/fixtures/make_gguf_refs.py`:
//! - f32 activations: the weights are the dequantized ones exactly, only
//!   the order of the sums differs, so the logits stay within `F32_ACTS`;
//! - int8 activations with their int8 residuals (the default): each
//!   activation within 1/32512 of its block's largest, logits within
//!   `RESIDUAL_ACTS`, and the next token of every prompt the f32 path's;
//! - int8 activations alone (as llama.cpp multiplies these formats): each
//!   activation moves by up to 1/254 of its block's largest, and the
//!   logits by up to `INT8_ACTS`;
//! - greedy, the quantized model (defaults) answers "What is the capital
//!   of France?" as transformers does: Paris.
//!
//! The Gemma 3 270M GGUF is compared the same way (its Q8_0 embedding).

use std::path::{Path, PathBuf};

use gyre_engine::gguf::{GgufFile, Value};
use gyre_engine::internals::{Model, load_model_with};
use gyre_engine::{
    Activations, DeviceChoice, Engine, EngineOptions, Event, GenerateRequest, LoadOptions, Sampling,
};
use serde_json::Value as Json;

/// Largest |logit difference| allowed with f32 activations (measured on
/// SmolLM2: 1.1e-4; the f32 path is itself 1e-4 from transformers).
const F32_ACTS: f64 = 1e-3;
/// With int8 activations and their residuals (measured: 1.8e-2).
const RESIDUAL_ACTS: f64 = 5e-2;
/// With int8 activations alone, as llama.cpp multiplies these formats
/// (measured: 1.8, then 3.1 after the CPU's RMSNorm began summing its
/// squares in float64, of logits around 25: this path's error moves that
/// much with any change of rounding before the activations are quantized;
/// the next token may differ where the f32 path's top two are close, as on
/// the France prompt, 0.08 apart).
const INT8_ACTS: f64 = 4.0;

fn refs() -> PathBuf {
    std::env::var_os("GYRE_GGUF_REF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.gyre/gguf-ref"))
}

fn manifest(sub: &str) -> Json {
    let p = refs().join(sub).join("manifest.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; make the references first: `make models`",
            p.display()
        )
    });
    serde_json::from_str(&text).expect("manifest parses")
}

fn ids(v: &Json) -> Vec<u32> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn load(path: &Path, dequantize: bool, activations: Activations) -> Box<dyn Model> {
    let opts = LoadOptions {
        dequantize,
        activations,
    };
    load_model_with(path, DeviceChoice::Cpu, opts).expect("loads")
}

fn logits(model: &dyn Model, prompt: &[u32]) -> Vec<f32> {
    let t = model.score(prompt).expect("forward");
    Vec::<f32>::try_from(&t.flatten(0, -1)).expect("to vec")
}

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &v)| if v > b.1 { (i, v) } else { b },
        )
        .0
}

/// Whether this CPU keeps GGUF weights quantized (else there is nothing to
/// compare: both loads are the f32 path).
fn quantized_here() -> bool {
    let on = LoadOptions::default().keeps_quantized_on_cpu();
    if !on {
        eprintln!("no AVX-512 VNNI: GGUF weights are dequantized here, nothing to compare");
    }
    on
}

/// The GGUF at `path` quantized with each of `ways` (activations, largest
/// |logit difference|, whether the next token must be the f32 path's)
/// against it dequantized, on `prompts`.
fn compare(path: &Path, prompts: &[Vec<u32>], ways: &[(Activations, f64, bool)]) {
    let _guard = tch::no_grad_guard();
    let reference = load(path, true, Activations::F32);
    let vocab = reference.config().vocab_size as usize;
    let wants: Vec<Vec<f32>> = prompts
        .iter()
        .map(|p| logits(reference.as_ref(), p))
        .collect();
    drop(reference);
    for &(acts, tol, same_next) in ways {
        let model = load(path, false, acts);
        for (prompt, want) in prompts.iter().zip(&wants) {
            let got = logits(model.as_ref(), prompt);
            assert_eq!(got.len(), want.len());
            let max_diff = got
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs() as f64)
                .fold(0f64, f64::max);
            let last = (prompt.len() - 1) * vocab;
            let (next, want_next) = (argmax(&got[last..]), argmax(&want[last..]));
            println!(
                "{acts:?} activations, prompt of {} tokens: max |logit diff| {max_diff:.3e}, \
                 next token {next} (f32 path: {want_next})",
                prompt.len()
            );
            assert!(
                max_diff <= tol,
                "{acts:?} activations: max |logit diff| {max_diff:.3e} > {tol:e}"
            );
            if same_next {
                assert_eq!(next, want_next, "{acts:?} activations: next token differs");
            }
        }
    }
}

#[test]
fn quantized_smollm2_logits_stay_near_the_dequantized_model() {
    if !quantized_here() {
        return;
    }
    let m = manifest("");
    let path = PathBuf::from(m["gguf"].as_str().expect("gguf path"));
    let prompts: Vec<Vec<u32>> = m["transformers"]["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| ids(&c["prompt_ids"]))
        .collect();
    compare(
        &path,
        &prompts,
        &[
            (Activations::F32, F32_ACTS, true),
            (Activations::Int8Residual, RESIDUAL_ACTS, true),
            (Activations::Int8, INT8_ACTS, false),
        ],
    );
}

/// Gemma 3 270M Q4_K_M: its Q8_0 embedding (tied to the LM head, scaled by
/// sqrt(hidden) on lookup), its Q5_0 and Q8_0 projections (held as Q8_0,
/// so the q/k/v stacks that mix them stay quantized) and its Q4_K and Q6_K
/// ones: every matrix stays quantized.
#[test]
fn quantized_gemma3_logits_stay_near_the_dequantized_model() {
    if !quantized_here() {
        return;
    }
    let m = manifest("gemma3");
    let path = PathBuf::from(m["gguf"].as_str().expect("gguf path"));
    let prompts: Vec<Vec<u32>> = m["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| ids(&c["prompt_ids"]))
        .collect();
    compare(
        &path,
        &prompts,
        &[(Activations::Int8Residual, RESIDUAL_ACTS, true)],
    );
}

/// The token strings of `ids` joined (byte-level BPE: `Ġ` is a space, `Ċ` a
/// newline).
fn detokenize(file: &GgufFile, ids: &[u32]) -> String {
    let tokens = file
        .get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .expect("vocabulary");
    ids.iter()
        .map(|&i| {
            tokens[i as usize]
                .as_str()
                .expect("token")
                .replace('Ġ', " ")
                .replace('Ċ', "\n")
        })
        .collect()
}

/// Greedy through the engine thread with the default options (quantized,
/// int8 activations with residuals), all reference prompts at once: the
/// France question is answered with Paris, and each 48-token continuation
/// is transformers' own (the f32 path's top two come within 1.8e-3 on the
/// way, so this also bounds the drift on generated positions).
#[test]
fn quantized_smollm2_answers_the_france_question() {
    let m = manifest("");
    let path = PathBuf::from(m["gguf"].as_str().expect("gguf path"));
    let cases = m["transformers"]["cases"].as_array().expect("cases");
    assert!(
        cases[0]["text"]
            .as_str()
            .is_some_and(|t| t.contains("capital of France")),
        "the first reference case is the France question"
    );
    let mut opts = EngineOptions::new(&path);
    opts.device = DeviceChoice::Cpu;
    let engine = Engine::start(opts).expect("engine starts");
    let rxs: Vec<_> = cases
        .iter()
        .map(|case| {
            let n = ids(&case["greedy_ids"]).len() as u32;
            engine
                .submit(GenerateRequest {
                    sampling: Sampling {
                        temperature: 0.0,
                        ..Sampling::default()
                    },
                    ignore_eos: true,
                    ..GenerateRequest::new(ids(&case["prompt_ids"]), n)
                })
                .expect("submit")
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let file = GgufFile::open(&path).expect("opens");
    for (i, (case, mut rx)) in cases.iter().zip(rxs).enumerate() {
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
        let text = detokenize(&file, &toks);
        println!("quantized SmolLM2: {text:?}");
        if i == 0 {
            let theirs = case["answer"].as_str().expect("answer");
            assert!(text.contains("Paris"), "{text:?}");
            assert!(
                text.starts_with(theirs),
                "{text:?} is not transformers' {theirs:?}"
            );
        }
        assert_eq!(
            toks,
            ids(&case["greedy_ids"]),
            "greedy continuation of {:?}",
            case["text"]
        );
    }
}

/// Which tensors stay quantized, and the bytes the engine holds for them
/// (what the server's memory check counts): SmolLM2's every matrix (Q4_1
/// layers, Q8_0 embedding), 92 MiB against 513 MiB in f32; Gemma 3's every
/// matrix (Q8_0, Q5_0, Q4_K, Q6_K).
#[test]
fn the_held_bytes_count_quantized_matrices_at_their_size() {
    use gyre_engine::gguf::model::{held_bytes, stays_quantized};
    let smol =
        GgufFile::open(manifest("")["gguf"].as_str().expect("gguf").as_ref()).expect("opens");
    let kept: Vec<&str> = smol
        .tensors
        .iter()
        .filter(|t| stays_quantized(&smol, t))
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(
        kept.len(),
        30 * 7 + 1,
        "every layer matrix and the embedding"
    );
    assert!(kept.contains(&"token_embd.weight"));
    let f32_bytes = held_bytes(&smol, 4, false);
    let q_bytes = held_bytes(&smol, 4, true);
    let want: u64 = smol
        .tensors
        .iter()
        .map(|t| {
            if kept.contains(&t.name.as_str()) {
                smol.raw(t).expect("raw").len() as u64
            } else {
                4 * t.elements()
            }
        })
        .sum();
    assert_eq!(q_bytes, want);
    assert_eq!(
        f32_bytes,
        4 * smol.tensors.iter().map(|t| t.elements()).sum::<u64>()
    );
    println!(
        "SmolLM2 held: {} MiB quantized, {} MiB f32",
        q_bytes >> 20,
        f32_bytes >> 20
    );
    assert_eq!((q_bytes >> 20, f32_bytes >> 20), (92, 513));
    let gemma = manifest("gemma3");
    let gemma = GgufFile::open(gemma["gguf"].as_str().expect("gguf").as_ref()).expect("opens");
    let kept: Vec<&str> = gemma
        .tensors
        .iter()
        .filter(|t| stays_quantized(&gemma, t))
        .map(|t| t.name.as_str())
        .collect();
    // Every matrix: the embedding, and per layer q, k, v, o, gate, up and
    // down (18 layers).
    for t in gemma.tensors.iter().filter(|t| t.dims.len() == 2) {
        assert!(kept.contains(&t.name.as_str()), "{} is dequantized", t.name);
    }
    assert_eq!(kept.len(), 1 + 18 * 7);
    // Held as the engine holds them: Q5_0 widened to Q8_0's 34 bytes a
    // block of 32, Q4_K in 32-value blocks of 24 bytes (f32 scale and min,
    // 16 bytes of quants), Q6_K in 32-value blocks of 40 (two f32 scales,
    // 32 bytes of quants), Q8_0 as in the file.
    let want: u64 = gemma
        .tensors
        .iter()
        .map(|t| {
            let kind = gyre_engine::gguf::GgmlType::from_id(t.kind).expect("known type");
            match kind {
                _ if !kept.contains(&t.name.as_str()) => 4 * t.elements(),
                gyre_engine::gguf::GgmlType::Q5_0 => t.elements() / 32 * 34,
                gyre_engine::gguf::GgmlType::Q4K => t.elements() / 32 * 24,
                gyre_engine::gguf::GgmlType::Q6K => t.elements() / 32 * 40,
                _ => gemma.raw(t).expect("raw").len() as u64,
            }
        })
        .sum();
    assert_eq!(held_bytes(&gemma, 4, true), want);
    println!(
        "Gemma 3 270M held: {} MiB quantized, {} MiB f32",
        want >> 20,
        held_bytes(&gemma, 4, false) >> 20
    );
}
