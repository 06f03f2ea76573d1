//! The text side of a GGUF model against transformers on the same file
//! (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`): token ids for
//! assorted text, with and without special tokens, and the chat template's
//! renders. References: `tests/fixtures/make_gguf_refs.py` (`make models`).

use std::path::PathBuf;

use gyre_service::runtime::load_text;
use serde_json::Value;

fn manifest() -> Value {
    let dir = std::env::var_os("GYRE_GGUF_REF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.gyre/gguf-ref"));
    let p = dir.join("manifest.json");
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
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn smollm2_gguf_tokenizer_and_template_match_transformers() {
    let m = manifest();
    let path = PathBuf::from(m["gguf"].as_str().expect("gguf path"));
    let (tok, template) = load_text(&path).expect("loads from the GGUF");
    let reference = &m["transformers"];
    let cases = reference["tokenizer_cases"].as_array().expect("cases");
    assert!(cases.len() >= 5);
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let plain = tok.encode(text, false).expect("encodes");
        assert_eq!(plain.get_ids(), ids(&case["ids"]), "ids of {text:?}");
        let with = tok.encode(text, true).expect("encodes");
        assert_eq!(
            with.get_ids(),
            ids(&case["ids_with_specials"]),
            "ids of {text:?} with specials"
        );
        let back = tok.decode(plain.get_ids(), false).expect("decodes");
        assert_eq!(back, text, "round trip of {text:?}");
    }
    let template = template.expect("the GGUF carries a chat template");
    let mut rendered = 0;
    for case in reference["cases"].as_array().expect("cases") {
        let Some(messages) = case["messages"].as_array() else {
            continue;
        };
        let text = template.render(messages, true).expect("renders");
        assert_eq!(text, case["text"].as_str().expect("text"), "chat render");
        let enc = tok.encode(text.as_str(), false).expect("encodes");
        assert_eq!(enc.get_ids(), ids(&case["prompt_ids"]), "chat prompt ids");
        rendered += 1;
    }
    assert!(rendered >= 2, "expected chat cases in the references");
}

/// The SentencePiece-style references: the real Gemma 3 270M GGUF and two
/// GGUF vocabularies written from the phi-3-mini tokenizer (architectures
/// `llama` and `phi3`), each with what transformers builds from it.
fn spm_manifest() -> (PathBuf, Value) {
    let dir = std::env::var_os("GYRE_GGUF_REF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.gyre/gguf-ref"))
        .join("spm");
    let p = dir.join("manifest.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; make the references first: `make models`",
            p.display()
        )
    });
    (dir, serde_json::from_str(&text).expect("manifest parses"))
}

fn vocabularies(m: &Value) -> &[Value] {
    let v = m["tokenizers"].as_array().expect("tokenizers");
    let names: Vec<&str> = v.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["gemma3", "phi3-llama", "phi3-phi3"]);
    v
}

/// The tokenizer.json gyre builds from each GGUF is the one transformers
/// builds: same pipeline, same added tokens, same vocabulary and the same
/// merges in the same order.
#[test]
fn sentencepiece_gguf_tokenizers_are_the_ones_transformers_builds() {
    let (dir, m) = spm_manifest();
    for reference in vocabularies(&m) {
        let name = reference["name"].as_str().expect("name");
        let path = PathBuf::from(reference["gguf"].as_str().expect("gguf"));
        let file = gyre_engine::gguf::GgufFile::open(&path).expect("opens");
        let ours: Value = serde_json::from_str(
            &gyre_engine::gguf::tokenizer::tokenizer_json(&file).expect("builds"),
        )
        .expect("json");
        let theirs: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(reference["tokenizer_json"].as_str().expect("file")))
                .expect("reference tokenizer.json"),
        )
        .expect("json");
        for key in [
            "version",
            "truncation",
            "padding",
            "normalizer",
            "pre_tokenizer",
            "post_processor",
            "decoder",
            "added_tokens",
        ] {
            assert_eq!(ours[key], theirs[key], "{name}: {key}");
        }
        let (om, tm) = (
            ours["model"].as_object().expect("model"),
            theirs["model"].as_object().expect("model"),
        );
        let mut keys: Vec<&String> = tm.keys().collect();
        keys.sort();
        let mut our_keys: Vec<&String> = om.keys().collect();
        our_keys.sort();
        assert_eq!(our_keys, keys, "{name}: model fields");
        for key in keys {
            if key == "merges" {
                let (a, b) = (
                    om[key].as_array().expect("merges"),
                    tm[key].as_array().expect("merges"),
                );
                assert_eq!(a.len(), b.len(), "{name}: number of merges");
                if let Some(i) = (0..a.len()).find(|&i| a[i] != b[i]) {
                    panic!("{name}: merge {i}: gyre {} vs transformers {}", a[i], b[i]);
                }
            } else {
                assert_eq!(om[key], tm[key], "{name}: model.{key}");
            }
        }
        println!(
            "{name}: tokenizer.json identical to transformers' ({} tokens, {} merges)",
            tm["vocab"].as_object().map_or(0, |v| v.len()),
            tm["merges"].as_array().map_or(0, |v| v.len())
        );
    }
}

/// Through the service's own text loading: ids with and without special
/// tokens, decoding with and without skipping them, BOS/EOS text, and the
/// chat template (absent in the Gemma 3 base model, present in phi3).
#[test]
fn sentencepiece_gguf_text_side_matches_transformers() {
    let (_, m) = spm_manifest();
    for reference in vocabularies(&m) {
        let name = reference["name"].as_str().expect("name");
        let path = PathBuf::from(reference["gguf"].as_str().expect("gguf"));
        let (tok, template, special, _) =
            gyre_service::runtime::load_text_with(&path, None).expect("text side loads");
        assert_eq!(
            special.bos,
            reference["bos_token"].as_str().unwrap_or(""),
            "{name}: bos"
        );
        assert_eq!(
            special.eos,
            reference["eos_token"].as_str().unwrap_or(""),
            "{name}: eos"
        );
        let cases = reference["cases"].as_array().expect("cases");
        assert!(cases.len() >= 60, "{name}: expected many strings");
        for case in cases {
            let text = case["text"].as_str().expect("text");
            let plain = tok.encode(text, false).expect("encodes");
            assert_eq!(
                plain.get_ids(),
                ids(&case["ids"]),
                "{name}: ids of {text:?}"
            );
            let with = tok.encode(text, true).expect("encodes");
            assert_eq!(
                with.get_ids(),
                ids(&case["ids_with_specials"]),
                "{name}: ids of {text:?} with special tokens"
            );
            let full = ids(&case["ids_with_specials"]);
            assert_eq!(
                tok.decode(&full, false).expect("decodes"),
                case["decoded"].as_str().expect("decoded"),
                "{name}: decode of {text:?}"
            );
            assert_eq!(
                tok.decode(&full, true).expect("decodes"),
                case["decoded_skip"].as_str().expect("decoded"),
                "{name}: decode of {text:?} skipping special tokens"
            );
        }
        let renders = reference["renders"].as_array().expect("renders");
        match (&template, reference["chat_template"].as_str()) {
            (None, None) => assert!(renders.is_empty()),
            (Some(t), Some(source)) => {
                assert_eq!(t.source(), source, "{name}: chat template text");
                assert!(!renders.is_empty());
                for r in renders {
                    let messages = r["messages"].as_array().expect("messages");
                    let text = t.render(messages, true).expect("renders");
                    assert_eq!(text, r["text"].as_str().expect("text"), "{name}: render");
                    let enc = tok.encode(text.as_str(), false).expect("encodes");
                    assert_eq!(enc.get_ids(), ids(&r["ids"]), "{name}: rendered ids");
                }
            }
            (ours, theirs) => panic!(
                "{name}: chat template: gyre has one: {}, transformers has one: {}",
                ours.is_some(),
                theirs.is_some()
            ),
        }
        println!(
            "{name}: {} strings encode and decode as in transformers",
            cases.len()
        );
    }
}
