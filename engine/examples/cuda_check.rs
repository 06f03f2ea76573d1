//! Exercises the CUDA attention paths on a GPU machine (CI has none).
//!
//!     cuda_check <model dir>
//!
//! Runs two sequences through packed steps that mix a chunked prefill, a
//! chunk after cached tokens, a full prompt and a decode, once with flash
//! attention over packed sequences and once with SDPA per sequence, and
//! compares the hidden states; then compares the CUDA (bf16) logits of a
//! prompt with the CPU (f32) ones. Exits non-zero if flash attention fell
//! back or a difference is over its tolerance.
use std::process::ExitCode;

use gyre_engine::internals::{Model, SeqInput, load};
use tch::{Device, Kind, Tensor};

fn steps(model: &dyn Model) -> Vec<Tensor> {
    let a: Vec<u32> = (0..40).map(|i| 100 + (i * 37) % 900).collect();
    let b: Vec<u32> = (0..23).map(|i| 200 + (i * 53) % 900).collect();
    let mut pool = model.new_pool(16, 16).expect("pool");
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
    vec![step1, step2]
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
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
