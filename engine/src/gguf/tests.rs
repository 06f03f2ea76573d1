//! The container reader on small files written here byte by byte; the
//! dequantization kernels are checked against the `gguf` Python package in
//! `engine/tests/gguf.rs`.

use super::*;

/// Builds a GGUF v3 file in memory.
#[derive(Default)]
struct Writer {
    kv: Vec<u8>,
    n_kv: u64,
    infos: Vec<u8>,
    n_tensors: u64,
    data: Vec<u8>,
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl Writer {
    fn kv(&mut self, key: &str, ty: u32, value: &[u8]) -> &mut Self {
        string(&mut self.kv, key);
        self.kv.extend(ty.to_le_bytes());
        self.kv.extend(value);
        self.n_kv += 1;
        self
    }

    fn tensor(&mut self, name: &str, dims: &[u64], kind: u32, bytes: &[u8]) -> &mut Self {
        string(&mut self.infos, name);
        self.infos.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            self.infos.extend(d.to_le_bytes());
        }
        self.infos.extend(kind.to_le_bytes());
        self.infos.extend((self.data.len() as u64).to_le_bytes());
        self.data.extend(bytes);
        while !self.data.len().is_multiple_of(32) {
            self.data.push(0);
        }
        self.n_tensors += 1;
        self
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend(self.n_tensors.to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kv);
        out.extend(&self.infos);
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
        out.extend(&self.data);
        out
    }
}

fn write_temp(name: &str, bytes: &[u8]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("gyre-gguf-{}-{name}.gguf", std::process::id()));
    std::fs::write(&path, bytes).expect("write temp file");
    path
}

fn sample() -> Writer {
    let mut w = Writer::default();
    let mut tokens = Vec::new();
    tokens.extend(8u32.to_le_bytes());
    tokens.extend(2u64.to_le_bytes());
    string(&mut tokens, "<s>");
    string(&mut tokens, "héllo");
    w.kv("general.architecture", 8, &{
        let mut v = Vec::new();
        string(&mut v, "llama");
        v
    })
    .kv("llama.block_count", 4, &30u32.to_le_bytes())
    .kv("llama.rope.freq_base", 6, &10000.5f32.to_le_bytes())
    .kv("tokenizer.ggml.add_bos_token", 7, &[1])
    .kv("tokenizer.ggml.tokens", 9, &tokens);
    let f32s: Vec<u8> = [1.5f32, -2.0, 0.25, 8.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    w.tensor("a.weight", &[2, 2], 0, &f32s);
    // One Q8_0 block: d = 0.5 (f16 0x3800), q = -16..16.
    let mut q8 = vec![0x00, 0x38];
    q8.extend((-16i8..16).map(|q| q as u8));
    w.tensor("b.weight", &[32], 8, &q8);
    w
}

#[test]
fn reads_metadata_tensor_index_and_data() {
    let path = write_temp("ok", &sample().bytes());
    let f = GgufFile::open(&path).expect("opens");
    assert_eq!(f.version, 3);
    assert_eq!(
        f.get("general.architecture").and_then(Value::as_str),
        Some("llama")
    );
    assert_eq!(f.get("llama.block_count").and_then(Value::as_u64), Some(30));
    assert_eq!(
        f.get("llama.rope.freq_base").and_then(Value::as_f64),
        Some(10000.5)
    );
    assert_eq!(
        f.get("tokenizer.ggml.add_bos_token")
            .and_then(Value::as_bool),
        Some(true)
    );
    let tokens = f
        .get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .expect("array");
    assert_eq!(tokens[1].as_str(), Some("héllo"));
    let a = f.tensor("a.weight").expect("a");
    assert_eq!(a.shape(), vec![2, 2]);
    assert_eq!(f.dequantize(a).expect("f32"), vec![1.5, -2.0, 0.25, 8.0]);
    let b = f.tensor("b.weight").expect("b");
    let want: Vec<f32> = (-16..16).map(|q| q as f32 * 0.5).collect();
    assert_eq!(f.dequantize(b).expect("q8_0"), want);
    std::fs::remove_file(path).ok();
}

#[test]
fn refuses_what_it_cannot_read_with_a_clear_message() {
    let mut bad_magic = sample().bytes();
    bad_magic[..4].copy_from_slice(b"GGML");
    let p = write_temp("magic", &bad_magic);
    let e = GgufFile::open(&p).expect_err("bad magic").to_string();
    assert!(e.contains("not a GGUF file"), "{e}");

    let whole = sample().bytes();
    let p2 = write_temp("cut", &whole[..whole.len() - 40]);
    let e = GgufFile::open(&p2).expect_err("truncated").to_string();
    assert!(e.contains("b.weight") && e.contains("past the end"), "{e}");

    let mut w = Writer::default();
    w.tensor("c.weight", &[256], 10, &[0u8; 84]); // Q2_K
    let p3 = write_temp("q2k", &w.bytes());
    let e = GgufFile::open(&p3).expect_err("q2_k").to_string();
    assert!(e.contains("c.weight") && e.contains("Q2_K"), "{e}");
    for p in [p, p2, p3] {
        std::fs::remove_file(p).ok();
    }
}

#[test]
fn f16_conversion_is_exact_at_the_edges() {
    assert_eq!(dequant::f16_to_f32(0x3c00), 1.0);
    assert_eq!(dequant::f16_to_f32(0xc000), -2.0);
    assert_eq!(dequant::f16_to_f32(0x7bff), 65504.0);
    assert_eq!(dequant::f16_to_f32(0x0001), 2f32.powi(-24));
    assert_eq!(dequant::f16_to_f32(0x03ff), 1023.0 * 2f32.powi(-24));
    assert_eq!(dequant::f16_to_f32(0x7c00), f32::INFINITY);
    assert!(dequant::f16_to_f32(0x7e00).is_nan());
    assert_eq!(dequant::f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
}

#[test]
fn an_architecture_the_engine_lacks_fails_naming_it() {
    let mut w = Writer::default();
    let mut arch = Vec::new();
    string(&mut arch, "mamba");
    w.kv("general.architecture", 8, &arch)
        .kv("mamba.block_count", 4, &18u32.to_le_bytes());
    let p = write_temp("mamba", &w.bytes());
    let file = GgufFile::open(&p).expect("the container itself is fine");
    let e = model::config(&file)
        .expect_err("mamba is not supported")
        .to_string();
    assert!(
        e.contains("`mamba`") && e.contains("supported GGUF architectures: llama, gemma3"),
        "{e}"
    );
    std::fs::remove_file(p).ok();
}

#[test]
fn an_unknown_tokenizer_model_is_refused_by_name() {
    let mut w = Writer::default();
    let mut kind = Vec::new();
    string(&mut kind, "rwkv");
    w.kv("tokenizer.ggml.model", 8, &kind);
    let p = write_temp("rwkv-vocab", &w.bytes());
    let file = GgufFile::open(&p).expect("opens");
    let e = tokenizer::tokenizer_json(&file).expect_err("unknown model");
    assert!(e.contains("`rwkv`") && e.contains("not supported"), "{e}");
    std::fs::remove_file(p).ok();
}
