//! `--speculative-config`: vLLM's JSON, what it maps to, and every refusal.

use super::*;

fn parse(text: &str) -> SpeculativeConfig {
    SpeculativeConfig::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// The error's text, which must start with the flag's name.
fn refused(text: &str) -> String {
    let e = SpeculativeConfig::parse(text).expect_err(text).to_string();
    assert!(e.starts_with("--speculative-config: "), "{e}");
    e
}

#[test]
fn ngram_maps_to_prompt_lookup_with_its_bounds() {
    assert_eq!(
        parse(
            r#"{"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 4,
                "prompt_lookup_min": 2}"#
        ),
        SpeculativeConfig::Ngram {
            num_tokens: 6,
            max_ngram: 4,
            min_ngram: 2
        }
    );
    // vLLM's older spelling, and a model naming the method.
    for text in [
        r#"{"method": "[ngram]", "num_speculative_tokens": 3, "prompt_lookup_max": 2, "prompt_lookup_min": 1}"#,
        r#"{"model": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2, "prompt_lookup_min": 1}"#,
        r#"{"method": "ngram", "model": "[ngram]", "num_speculative_tokens": 3, "prompt_lookup_max": 2, "prompt_lookup_min": 1}"#,
    ] {
        assert_eq!(
            parse(text),
            SpeculativeConfig::Ngram {
                num_tokens: 3,
                max_ngram: 2,
                min_ngram: 1
            },
            "{text}"
        );
    }
}

#[test]
fn omitted_ngram_bounds_take_vllms_defaults() {
    let bounds = |text: &str| match parse(text) {
        SpeculativeConfig::Ngram {
            max_ngram,
            min_ngram,
            ..
        } => (max_ngram, min_ngram),
        other => panic!("{other:?}"),
    };
    // Neither: 5 and 5. One: the other takes its value. Null is omitted.
    assert_eq!(
        bounds(r#"{"method": "ngram", "num_speculative_tokens": 4}"#),
        (5, 5)
    );
    assert_eq!(
        bounds(r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}"#),
        (3, 3)
    );
    assert_eq!(
        bounds(r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 7}"#),
        (7, 7)
    );
    assert_eq!(
        bounds(
            r#"{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": null,
                "prompt_lookup_min": 2}"#
        ),
        (2, 2)
    );
}

#[test]
fn a_model_is_a_draft_model() {
    assert_eq!(
        parse(r#"{"model": "d/draft.gguf", "num_speculative_tokens": 3}"#),
        SpeculativeConfig::Draft {
            model: "d/draft.gguf".into(),
            num_tokens: Some(3)
        }
    );
    assert_eq!(
        parse(r#"{"method": "draft_model", "model": "d/dir"}"#),
        SpeculativeConfig::Draft {
            model: "d/dir".into(),
            num_tokens: None
        }
    );
}

#[test]
fn other_methods_are_refused_naming_the_method_and_what_gyre_runs() {
    for method in [
        "eagle",
        "eagle3",
        "medusa",
        "mtp",
        "deepseek_mtp",
        "suffix",
        "Ngram",
    ] {
        let e = refused(&format!(
            r#"{{"method": "{method}", "model": "m", "num_speculative_tokens": 3}}"#
        ));
        assert!(
            e.contains(&format!("method `{method}` is not supported"))
                && e.contains("`ngram`")
                && e.contains("`draft_model`"),
            "{e}"
        );
    }
}

#[test]
fn unknown_keys_are_refused_naming_the_key_and_those_read() {
    for key in [
        "draft_tensor_parallel_size",
        "quantization",
        "num_speculative_token",
    ] {
        let e = refused(&format!(
            r#"{{"method": "ngram", "num_speculative_tokens": 3, "{key}": 1}}"#
        ));
        assert!(
            e.contains(&format!("unknown key `{key}`"))
                && e.contains("method, model, num_speculative_tokens"),
            "{e}"
        );
    }
}

#[test]
fn values_out_of_range_or_of_the_wrong_type_are_refused() {
    let cases = [
        (
            r#"{"method": "ngram", "num_speculative_tokens": 0}"#,
            "`num_speculative_tokens` must be a whole number from 1 to 64, got 0",
        ),
        (
            r#"{"method": "ngram", "num_speculative_tokens": 65}"#,
            "got 65",
        ),
        (
            r#"{"method": "ngram", "num_speculative_tokens": -1}"#,
            "got -1",
        ),
        (
            r#"{"method": "ngram", "num_speculative_tokens": 2.5}"#,
            "got 2.5",
        ),
        (
            r#"{"method": "ngram", "num_speculative_tokens": "3"}"#,
            "got \"3\"",
        ),
        (
            r#"{"model": "d", "num_speculative_tokens": 99}"#,
            "`num_speculative_tokens` must be a whole number from 1 to 64",
        ),
        (
            r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 17}"#,
            "`prompt_lookup_max` must be a whole number from 1 to 16, got 17",
        ),
        (
            r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 0}"#,
            "`prompt_lookup_max` must be a whole number from 1 to 16, got 0",
        ),
        (
            r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 0}"#,
            "`prompt_lookup_min` must be a whole number from 1 to 16, got 0",
        ),
        (
            r#"{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 2, "prompt_lookup_min": 3}"#,
            "prompt_lookup_min (3) must be at most prompt_lookup_max (2)",
        ),
        (
            r#"{"method": 5, "num_speculative_tokens": 3}"#,
            "`method` must be a string, got 5",
        ),
        (
            r#"{"model": "", "num_speculative_tokens": 3}"#,
            "`model` must not be empty",
        ),
    ];
    for (text, want) in cases {
        let e = refused(text);
        assert!(e.contains(want), "{text}: {e}");
    }
}

#[test]
fn incomplete_or_mixed_configs_are_refused() {
    let cases = [
        (
            r#"{"method": "ngram"}"#,
            "method `ngram` needs `num_speculative_tokens`",
        ),
        (
            r#"{"method": "ngram", "prompt_lookup_max": 3}"#,
            "needs `num_speculative_tokens`",
        ),
        (
            r#"{"method": "draft_model", "num_speculative_tokens": 3}"#,
            "method `draft_model` needs `model`",
        ),
        (
            r#"{"num_speculative_tokens": 3}"#,
            "names neither a `method` nor a draft `model`",
        ),
        (r#"{}"#, "names neither"),
        (
            r#"{"method": "ngram", "model": "d.gguf", "num_speculative_tokens": 3}"#,
            "method `ngram` takes no `model` (got `d.gguf`)",
        ),
        (
            r#"{"model": "d.gguf", "num_speculative_tokens": 3, "prompt_lookup_max": 3}"#,
            "`prompt_lookup_max` applies to method `ngram`",
        ),
        (
            r#"{"model": "d.gguf", "prompt_lookup_min": 1}"#,
            "`prompt_lookup_min` applies to method `ngram`",
        ),
        (r#"["ngram", 3]"#, "must be a JSON object"),
        (r#"{"method": "ngram", "#, "not JSON"),
        ("ngram", "not JSON"),
    ];
    for (text, want) in cases {
        let e = refused(text);
        assert!(e.contains(want), "{text}: {e}");
    }
}

#[test]
fn it_applies_to_the_one_model_served() {
    let mut specs = vec![ModelSpec::source("m.gguf")];
    parse(r#"{"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 3, "prompt_lookup_min": 2}"#)
        .apply(&mut specs)
        .expect("applies");
    assert_eq!(
        specs[0],
        ModelSpec {
            prompt_lookup: Some(6),
            prompt_lookup_max: Some(3),
            prompt_lookup_min: Some(2),
            ..ModelSpec::source("m.gguf")
        }
    );
    let mut specs = vec![ModelSpec::source("m.gguf")];
    parse(r#"{"model": "d.gguf", "num_speculative_tokens": 3}"#)
        .apply(&mut specs)
        .expect("applies");
    assert_eq!(
        specs[0],
        ModelSpec {
            draft: Some("d.gguf".into()),
            draft_tokens: Some(3),
            ..ModelSpec::source("m.gguf")
        }
    );
}

#[test]
fn it_is_refused_with_several_models_or_beside_the_models_own_speculation() {
    let cfg = parse(r#"{"model": "d.gguf", "num_speculative_tokens": 3}"#);
    let mut two = vec![ModelSpec::source("a"), ModelSpec::source("b")];
    let e = cfg.apply(&mut two).expect_err("two models").to_string();
    assert!(
        e.contains("applies to a single model, and 2 are served"),
        "{e}"
    );
    assert_eq!(two, [ModelSpec::source("a"), ModelSpec::source("b")]);
    for (spec, key) in [
        (
            ModelSpec {
                draft: Some("x".into()),
                ..ModelSpec::source("a")
            },
            "draft",
        ),
        (
            ModelSpec {
                prompt_lookup: Some(0),
                ..ModelSpec::source("a")
            },
            "prompt_lookup",
        ),
    ] {
        let mut one = vec![spec];
        let e = cfg.apply(&mut one).expect_err(key).to_string();
        assert!(
            e.contains(&format!("the model's `{key}` sets speculation too")),
            "{e}"
        );
    }
}
