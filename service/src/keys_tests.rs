//! Tests of the keys file: both formats, and the errors of bad files.

use super::*;

const FILE: &str = r#"
[tenants.acme]
models = ["m1"]
requests_per_minute = 3
tokens_per_minute = 500
priority = 2
weight = 4

[tenants.free]

[[keys]]
sha256 = "HASH_A"
tenant = "acme"

[[keys]]
sha256 = "HASH_B"
tenant = "free"
"#;

/// The same file in YAML: a tenant with nothing under it has no settings.
const YAML: &str = r#"
# tenants first, then the keys that name them
tenants:
  acme:
    models: [m1]
    requests_per_minute: 3
    tokens_per_minute: 500
    priority: 2
    weight: 4
  free:
keys:
  - sha256: "HASH_A"
    tenant: acme
  - sha256: HASH_B
    tenant: free
"#;

fn with_hashes(text: &str) -> String {
    text.replace("HASH_A", &hash_key("key-a"))
        .replace("HASH_B", &hash_key("key-b"))
}

fn file() -> String {
    with_hashes(FILE)
}

#[test]
fn keys_resolve_to_their_tenants() {
    check_the_example(&Keys::parse(&file(), Format::Toml).expect("valid"));
}

#[test]
fn a_yaml_file_reads_as_the_toml_one() {
    let yaml = Keys::parse(&with_hashes(YAML), Format::Yaml).expect("valid YAML");
    check_the_example(&yaml);
    let toml = Keys::parse(&file(), Format::Toml).expect("valid TOML");
    assert_eq!(yaml.policies(), toml.policies());
    // `{}` is the other way to write a tenant without settings.
    let braces = with_hashes(YAML).replace("  free:\n", "  free: {}\n");
    assert_ne!(braces, with_hashes(YAML));
    let braces = Keys::parse(&braces, Format::Yaml).expect("valid YAML");
    assert_eq!(braces.policies(), toml.policies());
    // The TOML text is no YAML file, and the YAML one no TOML file.
    assert!(Keys::parse(&file(), Format::Yaml).is_err());
    assert!(Keys::parse(&with_hashes(YAML), Format::Toml).is_err());
}

#[test]
fn the_format_follows_the_extension() {
    use std::path::Path;
    for (name, format) in [
        ("keys.yaml", Format::Yaml),
        ("keys.yml", Format::Yaml),
        ("KEYS.YML", Format::Yaml),
        ("dir.yaml/keys.toml", Format::Toml),
        ("keys.toml", Format::Toml),
        ("keys", Format::Toml),
        ("keys.yaml.bak", Format::Toml),
    ] {
        assert_eq!(Format::of(Path::new(name)), format, "{name}");
    }
}

#[test]
fn load_reads_each_format_by_its_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, text) in [("k.yml", YAML), ("k.toml", FILE)] {
        let path = dir.path().join(name);
        std::fs::write(&path, with_hashes(text)).expect("write");
        check_the_example(&Keys::load(&path).expect(name));
    }
    // YAML text under a TOML name is read as TOML, and refused as such.
    let path = dir.path().join("k.conf");
    std::fs::write(&path, with_hashes(YAML)).expect("write");
    let err = Keys::load(&path)
        .expect_err("YAML read as TOML")
        .to_string();
    assert!(err.contains("k.conf") && err.contains("TOML"), "{err}");
}

fn check_the_example(keys: &Keys) {
    assert_eq!(keys.counts(), (2, 2));
    let a = keys.find("key-a").expect("key a");
    assert_eq!(&*a.tenant.name, "acme");
    assert_eq!((a.tenant.priority, a.tenant.weight), (2, 4));
    assert_eq!(a.limits.requests_per_minute, Some(3));
    assert_eq!(a.limits.tokens_per_minute, Some(500));
    assert!(a.allows(["x", "m1"].into_iter()));
    assert!(!a.allows(["m2"].into_iter()));
    let b = keys.find("key-b").expect("key b");
    assert_eq!(&*b.tenant.name, "free");
    assert_eq!(b.tenant.weight, 1);
    assert!(!b.limits.any());
    assert!(b.allows(["anything"].into_iter()));
    assert!(keys.find("key-c").is_none());
    assert!(keys.find("").is_none());
}

#[test]
fn the_hash_is_sha256_hex() {
    assert_eq!(
        hash_key("abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

#[test]
fn bad_toml_files_say_why() {
    let cases = [
        ("", "no [[keys]]"),
        (
            "[[keys]]\nsha256 = \"abc\"\ntenant = \"t\"\n",
            "64 hex digits",
        ),
        (
            &format!("[[keys]]\nsha256 = \"{}\"\ntenant = \"t\"\n", hash_key("k")),
            "no [tenants] table",
        ),
        (
            &format!(
                "[tenants.t]\nweight = 0\n[[keys]]\nsha256 = \"{}\"\ntenant = \"t\"\n",
                hash_key("k")
            ),
            "weight",
        ),
        (
            &format!(
                "[tenants.t]\nmodels = []\n[[keys]]\nsha256 = \"{}\"\ntenant = \"t\"\n",
                hash_key("k")
            ),
            "`models` is empty",
        ),
        (
            &format!(
                "[tenants.t]\n[[keys]]\nsha256 = \"{h}\"\ntenant = \"t\"\n[[keys]]\nsha256 = \"{h}\"\ntenant = \"t\"\n",
                h = hash_key("k")
            ),
            "repeats",
        ),
        ("[tenants.t]\nrpm = 3\n", "unknown field `rpm`"),
        ("this is [not toml", "TOML"),
    ];
    for (text, why) in cases {
        let err = Keys::parse(text, Format::Toml).expect_err(text);
        assert!(err.contains(why), "{text:?}: {err}");
    }
}

#[test]
fn bad_yaml_files_say_why() {
    let h = hash_key("k");
    let cases = [
        (String::new(), "no `keys:`"),
        ("# only a comment\n---\n".into(), "no `keys:`"),
        ("tenants:\n  t: {}\nkeys: []\n".into(), "no `keys:`"),
        (
            "tenants:\n  t:\nkeys:\n  - sha256: abc\n    tenant: t\n".into(),
            "keys[0].sha256 is not 64 hex digits",
        ),
        (
            format!("keys:\n  - sha256: \"{h}\"\n    tenant: t\n"),
            "tenant `t`, which is not under `tenants:`",
        ),
        (
            format!("tenants:\n  t:\n    rpm: 3\nkeys:\n  - sha256: \"{h}\"\n    tenant: t\n"),
            "unknown field `rpm`",
        ),
        (
            format!("tenants:\n  t:\nkeys:\n  - sha256: \"{h}\"\n    tenant: t\n    note: x\n"),
            "unknown field `note`",
        ),
        (
            format!("tenants:\n  t:\n    weight: 0\nkeys:\n  - sha256: \"{h}\"\n    tenant: t\n"),
            "weight must be at least 1",
        ),
        (
            format!(
                "tenants:\n  t:\n    requests_per_minute: many\nkeys:\n  - sha256: \"{h}\"\n    tenant: t\n"
            ),
            "requests_per_minute",
        ),
        (
            format!(
                "tenants:\n  t:\nkeys:\n  - {{sha256: \"{h}\", tenant: t}}\n  - {{sha256: \"{h}\", tenant: t}}\n"
            ),
            "keys[1] repeats",
        ),
        ("tenants: [not, a, map\n".into(), "YAML"),
        ("- just\n- a list\n".into(), "YAML"),
    ];
    for (text, why) in cases {
        let err = Keys::parse(&text, Format::Yaml).expect_err(&text);
        assert!(err.contains(why), "{text:?}: {err}");
    }
}
