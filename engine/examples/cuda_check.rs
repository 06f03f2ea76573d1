//! Exercises the CUDA attention paths on a GPU machine (CI has none).
//!
//!     cuda_check <model dir>
//!
//! Runs two sequences through packed steps that mix a chunked prefill, a
//! chunk after cached tokens, a full prompt and a decode, then a step of
//! decodes only, once with flash
//! attention over packed sequences and once with SDPA per sequence, and
//! compares the hidden states; then each fused kernel against the
//! libtorch ops it replaces, and the steps with the fused kernels on and
//! off (tests/gpu/device.sh sets `GYRE_FUSED_NORM=0`, so that with them
//! off norms run transformers' unfused arithmetic, as the fused kernel
//! does, not libtorch's one-pass RMSNorm); then compares the CUDA (bf16) logits of a
//! prompt with the CPU (f32) ones; then runs seeded requests with every
//! sampling parameter through the engine on CUDA twice, sampling on the
//! device and on the host, and compares their tokens. Exits non-zero if
//! flash attention fell back, a difference is over its tolerance, or a
//! stream's tokens differ.
use std::process::ExitCode;

use gyre_engine::internals::{
    Model, SeqInput, check_fused_kernels, load, set_fused_kernels, time_gemv,
};
use gyre_engine::{DeviceChoice, Engine, EngineOptions, Event, GenerateRequest, Sampling};
use tch::{Device, Kind, Tensor};

/// Seeded requests over the sampling parameters, one at a time (the same
/// steps, so the same logits, on both runs).
fn sampled_streams(dir: &str, on_device: bool) -> Vec<Vec<u32>> {
    let mut o = EngineOptions::new(dir);
    o.device = DeviceChoice::Cuda;
    o.device_sampling = Some(on_device);
    o.max_running = 1;
    let e = Engine::start(o).expect("engine on CUDA");
    let s = |temperature: f32, top_p: f32, top_k: u32, min_p: f32| Sampling {
        temperature,
        top_p,
        top_k,
        min_p,
        ..Sampling::default()
    };
    let settings = [
        s(0.0, 1.0, 0, 0.0),
        s(1.0, 1.0, 0, 0.0),
        s(0.7, 0.9, 0, 0.0),
        s(1.2, 1.0, 20, 0.0),
        s(1.0, 1.0, 0, 0.05),
        Sampling {
            repetition_penalty: 1.3,
            presence_penalty: 0.5,
            frequency_penalty: 0.5,
            logit_bias: vec![(120, 3.0), (121, -100.0)],
            ..s(0.9, 0.95, 50, 0.0)
        },
    ];
    let prompt: Vec<u32> = (0..24).map(|i| 100 + (i * 53) % 900).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let mut out = Vec::new();
    for (i, cfg) in settings.iter().enumerate() {
        for seed in 0..4u64 {
            let req = GenerateRequest {
                sampling: Sampling {
                    seed: Some(seed + 10 * i as u64),
                    ..cfg.clone()
                },
                ignore_eos: true,
                min_tokens: if seed == 1 { 8 } else { 0 },
                ..GenerateRequest::new(prompt.clone(), 32)
            };
            let mut rx = e.submit(req).expect("submit");
            let mut toks = Vec::new();
            rt.block_on(async {
                while let Some(ev) = rx.recv().await {
                    match ev {
                        Event::Token(t) => toks.push(t),
                        Event::Finished { .. } => break,
                        Event::Failed(err) => panic!("{err}"),
                        _ => {}
                    }
                }
            });
            out.push(toks);
        }
    }
    out
}

fn steps(model: &dyn Model) -> Vec<Tensor> {
    let a: Vec<u32> = (0..40).map(|i| 100 + (i * 37) % 900).collect();
    let b: Vec<u32> = (0..23).map(|i| 200 + (i * 53) % 900).collect();
    let mut pool = model.new_pool(16, 16, model.kind()).expect("pool");
    let (ta, tb): (Vec<u32>, Vec<u32>) = ((0..4).collect(), (4..8).collect());
    let step1 = model
        .forward(
            &[
                SeqInput {
                    tokens: &a[..32],
                    start: 0,
                    block_table: &ta,
                    seq_len: a.len(),
                },
                SeqInput {
                    tokens: &b,
                    start: 0,
                    block_table: &tb,
                    seq_len: b.len(),
                },
            ],
            &mut pool,
        )
        .expect("step 1");
    let step2 = model
        .forward(
            &[
                SeqInput {
                    tokens: &a[32..],
                    start: 32,
                    block_table: &ta,
                    seq_len: a.len(),
                },
                SeqInput {
                    tokens: &[7],
                    start: 23,
                    block_table: &tb,
                    seq_len: b.len() + 1,
                },
            ],
            &mut pool,
        )
        .expect("step 2");
    // Every sequence decodes one token (a decode graph's kind of step).
    let step3 = model
        .forward(
            &[
                SeqInput {
                    tokens: &[9],
                    start: 40,
                    block_table: &ta,
                    seq_len: a.len() + 1,
                },
                SeqInput {
                    tokens: &[11],
                    start: 24,
                    block_table: &tb,
                    seq_len: b.len() + 2,
                },
            ],
            &mut pool,
        )
        .expect("step 3");
    vec![step1, step2, step3]
}

fn max_rel(a: &Tensor, b: &Tensor) -> f64 {
    let (a, b) = (a.to_kind(Kind::Float), b.to_kind(Kind::Float));
    (&a - &b).abs().max().double_value(&[]) / b.abs().max().double_value(&[]).max(1e-6)
}

fn main() -> ExitCode {
    let dir = std::env::args().nth(1).expect("model dir");
    if !tch::Cuda::is_available() {
        eprintln!("cuda_check: no CUDA device");
        return ExitCode::FAILURE;
    }
    let gpu = load(dir.as_ref(), Device::Cuda(0), Kind::BFloat16).expect("load on CUDA");
    let _guard = tch::no_grad_guard();
    let flash = steps(gpu.as_ref());
    let flash_on = gpu.flash_attention();
    gpu.set_flash_attention(false);
    let sdpa = steps(gpu.as_ref());
    let mut ok = flash_on;
    println!("flash attention over packed sequences active: {flash_on}");
    for (i, (f, s)) in flash.iter().zip(&sdpa).enumerate() {
        let d = max_rel(f, s);
        println!(
            "step {}: flash vs SDPA per sequence, max relative diff of hidden states {d:.3e}",
            i + 1
        );
        ok &= d < 3e-2;
    }
    gpu.set_flash_attention(true);
    // The fused kernels (on in every run above) against the libtorch ops
    // they replace: each kernel alone, then the model's steps.
    match check_fused_kernels() {
        Ok(diffs) => {
            for (name, d) in diffs {
                // One bf16 step (2^-8 relative) where the norm's float32 sum
                // runs in another order; elsewhere the same arithmetic.
                // gyre's matrix-vector and decode attention kernels sum in
                // float32 in another order than cuBLAS and flash attention:
                // one bf16 step apart at most.
                let tol = if name.starts_with("rms_norm")
                    || name.starts_with("gemv")
                    || name.starts_with("decode attention")
                {
                    8e-3
                } else {
                    0.0
                };
                println!(
                    "fused kernel vs libtorch ops, {name}: max relative diff {d:.3e} (allowed {tol:.0e})"
                );
                ok &= d <= tol;
            }
        }
        Err(e) => {
            println!("fused kernels: {e}");
            ok = false;
        }
    }
    match time_gemv() {
        Ok(rows) => {
            for (name, mb, cublas, gyre) in rows {
                println!(
                    "8B-shape {name} projection at batch 1 ({mb:.0} MB): cuBLAS {cublas:.1} us ({:.2} TB/s), gyre's gemv {gyre:.1} us ({:.2} TB/s)",
                    mb / cublas,
                    mb / gyre
                );
            }
        }
        Err(e) => println!("gemv timing: {e}"),
    }
    set_fused_kernels(false);
    let plain = steps(gpu.as_ref());
    set_fused_kernels(true);
    for (i, (f, p)) in flash.iter().zip(&plain).enumerate() {
        let d = max_rel(f, p);
        println!(
            "step {}: fused kernels vs libtorch ops (unfused norm), max relative diff of hidden states {d:.3e}",
            i + 1
        );
        ok &= d < 3e-2;
    }
    let cpu = load(dir.as_ref(), Device::Cpu, Kind::Float).expect("load on CPU");
    let prompt: Vec<u32> = (0..48).map(|i| 300 + (i * 71) % 900).collect();
    let lg = gpu
        .score(&prompt)
        .expect("gpu score")
        .to_device(Device::Cpu);
    let lc = cpu.score(&prompt).expect("cpu score");
    let d = max_rel(&lg, &lc);
    let same_argmax = lg.argmax(-1, false).equal(&lc.argmax(-1, false));
    println!(
        "logits CUDA bf16 (flash) vs CPU f32: max relative diff {d:.3e}, same argmax at every position: {same_argmax}"
    );
    ok &= d < 5e-2;
    drop((gpu, cpu));
    let host = sampled_streams(&dir, false);
    let device = sampled_streams(&dir, true);
    let same = host.iter().zip(&device).filter(|(h, d)| h == d).count();
    let distinct: std::collections::HashSet<_> = device.iter().collect();
    println!(
        "sampling on the device vs the host (CUDA, 6 settings x 4 seeds, 32 tokens): {same}/{} streams identical, {} distinct",
        host.len(),
        distinct.len()
    );
    for (i, (h, d)) in host
        .iter()
        .zip(&device)
        .enumerate()
        .filter(|(_, (h, d))| h != d)
    {
        let at = h
            .iter()
            .zip(d)
            .position(|(a, b)| a != b)
            .unwrap_or(h.len().min(d.len()));
        println!("  stream {i} differs from token {at}");
    }
    ok &= same == host.len();
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
