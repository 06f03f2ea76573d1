//! `--model` arguments, config files and dates.

use super::*;

#[test]
fn a_plain_path_is_only_a_source() {
    assert_eq!(
        ModelSpec::parse("models/tiny-llama").expect("ok"),
        ModelSpec::source("models/tiny-llama")
    );
}

#[test]
fn every_key_of_a_model_argument_is_read() {
    let spec = ModelSpec::parse(
        "m/a.gguf,name=chat, alias=gpt-4o-mini,alias=small,version=2026-11-01,revision=v2,deprecated=2026-12-31,sunset=2027-03-31,owned_by=acme,kv_cache_mib=64,prompt_lookup=8,draft=m/d.gguf,draft_tokens=3",
    )
    .expect("ok");
    assert_eq!(
        spec,
        ModelSpec {
            source: "m/a.gguf".into(),
            revision: Some("v2".into()),
            name: Some("chat".into()),
            aliases: vec!["gpt-4o-mini".into(), "small".into()],
            version: Some("2026-11-01".into()),
            deprecation: Some(1_798_675_200),
            sunset: Some(1_806_451_200),
            owned_by: Some("acme".into()),
            kv_cache_mib: Some(64),
            prompt_lookup: Some(8),
            draft: Some("m/d.gguf".into()),
            draft_tokens: Some(3),
            prompt_lookup_max: None,
            prompt_lookup_min: None,
        }
    );
}

#[test]
fn bad_model_arguments_say_what_is_wrong() {
    let err = |arg: &str| ModelSpec::parse(arg).expect_err("an error");
    assert!(matches!(err(",name=x"), SpecError::EmptySource(_)));
    assert!(matches!(err("p,name"), SpecError::NotKeyValue { .. }));
    assert!(matches!(err("p,nmae=x"), SpecError::UnknownKey { key, .. } if key == "nmae"));
    assert!(matches!(err("p,name=a,name=b"), SpecError::Repeated { key, .. } if key == "name"));
    assert!(matches!(err("p,name="), SpecError::Empty { key, .. } if key == "name"));
    assert!(matches!(
        err("p,kv_cache_mib=lots"),
        SpecError::BadNumber { .. }
    ));
    for bad in [
        "p,prompt_lookup=65",
        "p,prompt_lookup=-1",
        "p,prompt_lookup=some",
    ] {
        let e = err(bad);
        assert!(
            matches!(e, SpecError::BadLookup { max: 64, .. }),
            "{bad}: {e}"
        );
        assert!(e.to_string().contains("prompt_lookup"), "{e}");
    }
    for bad in ["p,draft=d,draft_tokens=65", "p,draft=d,draft_tokens=x"] {
        let e = err(bad);
        assert!(
            matches!(
                e,
                SpecError::BadLookup {
                    key: "draft_tokens",
                    max: 64,
                    ..
                }
            ),
            "{bad}: {e}"
        );
    }
    let e = err("p,draft_tokens=3");
    assert!(
        matches!(e, SpecError::DraftTokensWithoutDraft { .. }),
        "{e}"
    );
    assert!(
        e.to_string().contains("draft_tokens needs a draft model"),
        "{e}"
    );
    let e = err("p,deprecated=31/12/2026");
    assert!(matches!(e, SpecError::BadDate { .. }));
    assert!(e.to_string().contains("deprecated"), "{e}");
}

#[test]
fn a_config_file_lists_models_in_order() {
    let text = r#"
        [[models]]
        source = "a.gguf"
        name = "chat"
        aliases = ["gpt-4o-mini"]
        version = "2026-11-01"
        deprecated = "2026-12-31"
        kv_cache_mib = 32
        prompt_lookup = 12
        draft = "a-draft.gguf"
        draft_tokens = 4

        [[models]]
        source = "org/name"
        revision = "main"
        sunset = "2027-03-31T00:00:00Z"
        owned_by = "acme"
    "#;
    let specs = parse_config(text, "models.toml").expect("ok");
    assert_eq!(specs.len(), 2);
    assert_eq!(specs[0].source, "a.gguf");
    assert_eq!(specs[0].name.as_deref(), Some("chat"));
    assert_eq!(specs[0].aliases, ["gpt-4o-mini"]);
    assert_eq!(specs[0].deprecation, Some(1_798_675_200));
    assert_eq!(specs[0].kv_cache_mib, Some(32));
    assert_eq!(specs[0].prompt_lookup, Some(12));
    assert_eq!(specs[1].prompt_lookup, None);
    assert_eq!(specs[0].draft.as_deref(), Some("a-draft.gguf"));
    assert_eq!(specs[1].draft, None);
    assert_eq!(specs[0].draft_tokens, Some(4));
    assert_eq!(specs[1].draft_tokens, None);
    assert_eq!(specs[0].sunset, None);
    assert_eq!(specs[1].source, "org/name");
    assert_eq!(specs[1].revision.as_deref(), Some("main"));
    assert_eq!(specs[1].sunset, Some(1_806_451_200));
    assert_eq!(specs[1].owned_by.as_deref(), Some("acme"));
    assert_eq!(specs[1].name, None);
}

#[test]
fn config_file_errors_name_the_file_and_the_entry() {
    // An unknown key (a typo) is refused, not ignored.
    let e = parse_config("[[models]]\nsource = \"a\"\nalias = [\"x\"]\n", "m.toml")
        .expect_err("an error");
    assert!(
        matches!(&e, SpecError::Config { path, .. } if path == "m.toml"),
        "{e}"
    );
    assert!(e.to_string().contains("alias"), "{e}");
    // A missing source.
    let e = parse_config("[[models]]\nname = \"x\"\n", "m.toml").expect_err("an error");
    assert!(e.to_string().contains("source"), "{e}");
    // draft_tokens without a draft, or out of range, names its entry.
    let e = parse_config("[[models]]\nsource = \"a\"\ndraft_tokens = 3\n", "m.toml")
        .expect_err("an error");
    assert!(
        e.to_string()
            .contains("m.toml: models[0]: draft_tokens needs a draft model"),
        "{e}"
    );
    let e = parse_config(
        "[[models]]\nsource = \"a\"\ndraft = \"d\"\ndraft_tokens = 65\n",
        "m.toml",
    )
    .expect_err("an error");
    assert!(
        matches!(
            e,
            SpecError::BadLookup {
                key: "draft_tokens",
                ..
            }
        ),
        "{e}"
    );
    // Not TOML.
    assert!(matches!(
        parse_config("[[models]\n", "m.toml"),
        Err(SpecError::Config { .. })
    ));
    // A bad date names its entry and key.
    let e = parse_config(
        "[[models]]\nsource = \"a\"\n[[models]]\nsource = \"b\"\ndeprecated = \"2026-02-30\"\n",
        "m.toml",
    )
    .expect_err("an error");
    assert!(e.to_string().contains("models[1].deprecated"), "{e}");
    // Empty names.
    let e = parse_config("[[models]]\nsource = \"a\"\naliases = [\"\"]\n", "m.toml")
        .expect_err("an error");
    assert!(matches!(e, SpecError::Empty { .. }), "{e}");
    // No models at all is an empty list (the caller decides).
    assert_eq!(parse_config("", "m.toml").expect("ok"), vec![]);
}

#[test]
fn dates_are_read_as_utc_unix_seconds() {
    let d = |s: &str| parse_date(s, "t");
    assert_eq!(d("2026-12-31"), Ok(1_798_675_200));
    assert_eq!(d("2024-02-29"), Ok(1_709_164_800));
    assert_eq!(d("2026-12-31T12:00:00+02:00"), Ok(1_798_711_200));
    assert_eq!(d("1969-07-20T20:17:40Z"), Ok(-14_182_940));
    assert_eq!(d("2026-12-31T00:00:00.250Z"), Ok(1_798_675_200));
    for bad in [
        "",
        "2026-12",
        "2026-13-01",
        "2026-02-29",
        "2026-1-01",
        "2026-12-31T25:00:00Z",
        "2026-12-31T12:00:00",
        "2026-12-31T12:00Z",
        "tomorrow",
    ] {
        assert!(d(bad).is_err(), "{bad:?}");
    }
}
