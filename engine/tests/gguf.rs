//! gyre's GGUF reader against the `gguf` Python package (llama.cpp's own
//! reference port): every readable ggml type dequantizes bit for bit as the
//! package does, on seeded random blocks and on the real SmolLM2-135M-Instruct
//! GGUF's tensors. The references are made by `tests/fixtures/make_gguf_refs.py`
//! (`make models`).

use std::path::PathBuf;

use gyre_engine::gguf::{GgmlType, GgufFile, dequantize};
use serde_json::Value;

fn refs() -> PathBuf {
    std::env::var_os("GYRE_GGUF_REF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.gyre/gguf-ref"))
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

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Index of the first element where the two differ (NaN matches any NaN).
fn first_difference(ours: &[f32], theirs: &[f32]) -> Option<usize> {
    assert_eq!(ours.len(), theirs.len(), "element counts differ");
    ours.iter()
        .zip(theirs)
        .position(|(a, b)| a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan()))
}

#[test]
fn every_type_dequantizes_bit_for_bit_as_the_gguf_package() {
    let m = manifest();
    let cases = m["synthetic"].as_array().expect("synthetic list");
    let names: Vec<&str> = cases.iter().filter_map(|c| c["type"].as_str()).collect();
    for must in [
        "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K",
    ] {
        assert!(names.contains(&must), "no reference for {must}");
    }
    for case in cases {
        let name = case["type"].as_str().expect("type");
        let id = case["id"].as_u64().expect("id") as u32;
        let n = case["elements"].as_u64().expect("elements") as usize;
        let kind = GgmlType::from_id(id).unwrap_or_else(|| panic!("{name} not readable"));
        let raw = std::fs::read(refs().join(format!("{name}.bin"))).expect("raw blocks");
        let want = f32s(&std::fs::read(refs().join(format!("{name}.f32"))).expect("reference"));
        let got = dequantize(kind, &raw, n).expect("dequantizes");
        if let Some(i) = first_difference(&got, &want) {
            panic!("{name}: element {i}: gyre {} vs gguf {}", got[i], want[i]);
        }
    }
}

#[test]
fn real_smollm2_tensors_match_the_gguf_package() {
    let m = manifest();
    let file = GgufFile::open(m["gguf"].as_str().expect("gguf path").as_ref()).expect("opens");
    assert_eq!(
        file.get("general.architecture").and_then(|v| v.as_str()),
        Some("llama")
    );
    let real = m["real"].as_array().expect("real list");
    assert!(real.len() >= 3, "expected F32, Q8_0 and Q4_1 tensors");
    for case in real {
        let name = case["tensor"].as_str().expect("tensor");
        let t = file.tensor(name).expect("in the file");
        let dims: Vec<u64> = case["dims"]
            .as_array()
            .expect("dims")
            .iter()
            .filter_map(Value::as_u64)
            .collect();
        assert_eq!(t.dims, dims, "{name}: dims");
        let want =
            f32s(&std::fs::read(refs().join(case["file"].as_str().expect("file"))).expect("ref"));
        let got = file.dequantize(t).expect("dequantizes");
        if let Some(i) = first_difference(&got, &want) {
            panic!("{name}: element {i}: gyre {} vs gguf {}", got[i], want[i]);
        }
    }
}
