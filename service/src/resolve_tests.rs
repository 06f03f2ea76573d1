//! Unit tests of `--model` resolution: the cache directory's environment
//! rules, repo-id syntax, and resolution against cache layouts built in a
//! temporary directory (blobs, symlinked snapshots, refs).

use super::*;
use std::collections::HashMap;
use std::os::unix::fs::symlink;

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
    let map: HashMap<String, OsString> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), OsString::from(v)))
        .collect();
    move |k| map.get(k).cloned()
}

#[test]
fn cache_dir_follows_huggingface_hub_precedence() {
    let base = [("HOME", "/users/u")];
    assert_eq!(
        hub_cache_dir_from(env(&base)),
        PathBuf::from("/users/u/.cache/huggingface/hub")
    );
    let xdg = [("HOME", "/users/u"), ("XDG_CACHE_HOME", "/xdg")];
    assert_eq!(
        hub_cache_dir_from(env(&xdg)),
        PathBuf::from("/xdg/huggingface/hub")
    );
    let home = [
        ("HOME", "/users/u"),
        ("XDG_CACHE_HOME", "/xdg"),
        ("HF_HOME", "~/hf"),
    ];
    assert_eq!(
        hub_cache_dir_from(env(&home)),
        PathBuf::from("/users/u/hf/hub")
    );
    let legacy = [("HF_HOME", "/hf"), ("HUGGINGFACE_HUB_CACHE", "/legacy")];
    assert_eq!(hub_cache_dir_from(env(&legacy)), PathBuf::from("/legacy"));
    let hub = [
        ("HF_HOME", "/hf"),
        ("HUGGINGFACE_HUB_CACHE", "/legacy"),
        ("HF_HUB_CACHE", "$DATA/${NAME}/hub"),
        ("DATA", "/data"),
        ("NAME", "models"),
    ];
    assert_eq!(
        hub_cache_dir_from(env(&hub)),
        PathBuf::from("/data/models/hub")
    );
}

#[test]
fn unknown_variables_stay_as_written() {
    let e = env(&[("HF_HUB_CACHE", "/a/$NOPE/${ALSO_NOT}/$")]);
    assert_eq!(
        hub_cache_dir_from(e),
        PathBuf::from("/a/$NOPE/${ALSO_NOT}/$")
    );
}

#[test]
fn repo_ids_follow_the_hub_rules() {
    for ok in [
        "gpt2",
        "org/name",
        "Qwen/Qwen2.5-0.5B-Instruct",
        "a_b/c.d-e",
    ] {
        assert!(is_repo_id(ok), "{ok}");
    }
    for bad in [
        "",
        "a/b/c",
        "/abs",
        "./x",
        "x.gguf/",
        "org/-name",
        "org/name.",
        "org--x/name",
        "org/na..me",
        "org/name.git",
        "org/na me",
    ] {
        assert!(!is_repo_id(bad), "{bad}");
    }
}

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// A temporary hub cache holding `models--org--tiny` with the given files
/// in snapshot `COMMIT` (each a link into `blobs/`) and `refs/main`.
struct Cache {
    root: tempfile::TempDir,
}

impl Cache {
    fn new(files: &[&str]) -> Self {
        let root = tempfile::tempdir().expect("temp dir");
        let repo = root.path().join("models--org--tiny");
        let snap = repo.join("snapshots").join(COMMIT);
        std::fs::create_dir_all(repo.join("blobs")).expect("blobs");
        std::fs::create_dir_all(repo.join("refs")).expect("refs");
        std::fs::create_dir_all(&snap).expect("snapshot");
        std::fs::write(repo.join("refs/main"), COMMIT).expect("ref");
        for (i, f) in files.iter().enumerate() {
            let blob = format!("blob{i}");
            std::fs::write(repo.join("blobs").join(&blob), f.as_bytes()).expect("blob");
            symlink(format!("../../blobs/{blob}"), snap.join(f)).expect("link");
        }
        Self { root }
    }
    fn dir(&self) -> &Path {
        self.root.path()
    }
    fn repo(&self) -> PathBuf {
        self.dir().join("models--org--tiny")
    }
    fn snapshot(&self) -> PathBuf {
        self.repo().join("snapshots").join(COMMIT)
    }
}

#[test]
fn a_cached_hub_id_resolves_to_its_main_snapshot() {
    let c = Cache::new(&["config.json", "model.safetensors", "tokenizer.json"]);
    let r = resolve("org/tiny", None, c.dir()).expect("resolves");
    assert_eq!(r.path, c.snapshot());
    assert_eq!(
        r.hub,
        Some(HubModel {
            repo_id: "org/tiny".into(),
            revision: "main".into(),
            commit: COMMIT.into(),
        })
    );
}

#[test]
fn revisions_are_refs_or_commit_hashes() {
    let c = Cache::new(&["config.json", "model.safetensors"]);
    // huggingface_hub keeps a ref under its full name: `refs/pr/1` is the
    // file `refs/refs/pr/1`.
    std::fs::create_dir_all(c.repo().join("refs/refs/pr")).expect("dir");
    std::fs::write(c.repo().join("refs/refs/pr/1"), format!("{COMMIT}\n")).expect("ref");
    std::fs::write(c.repo().join("refs/v1.0"), COMMIT).expect("ref");
    for rev in ["v1.0", "refs/pr/1", COMMIT] {
        let r = resolve("org/tiny", Some(rev), c.dir()).expect(rev);
        assert_eq!(r.path, c.snapshot(), "{rev}");
        let hub = r.hub.expect("hub");
        assert_eq!((hub.revision.as_str(), hub.commit.as_str()), (rev, COMMIT));
    }
    let err = resolve("org/tiny", Some("dev"), c.dir()).expect_err("unknown");
    let msg = err.to_string();
    assert!(matches!(err, ResolveError::UnknownRevision { .. }), "{msg}");
    assert!(msg.contains("`dev`") && msg.contains(COMMIT), "{msg}");
    for bad in ["../x", "/etc", ""] {
        assert_eq!(
            resolve("org/tiny", Some(bad), c.dir()),
            Err(ResolveError::BadRevision {
                revision: bad.into()
            })
        );
    }
}

/// (That an existing relative path spelled like a hub id wins over the
/// cache is tested end to end, in a working directory of its own.)
#[test]
fn a_local_path_resolves_to_itself_and_takes_no_revision() {
    let c = Cache::new(&["config.json", "model.safetensors"]);
    let local = tempfile::tempdir().expect("temp");
    let dir = local.path().join("org/tiny");
    std::fs::create_dir_all(&dir).expect("dir");
    let cwd_relative = dir.display().to_string();
    let r = resolve(&cwd_relative, None, c.dir()).expect("path");
    assert_eq!((r.path, r.hub), (dir, None));
    assert_eq!(
        resolve(&cwd_relative, Some("main"), c.dir()),
        Err(ResolveError::RevisionForPath {
            model: cwd_relative.clone()
        })
    );
}

#[test]
fn an_uncached_id_names_where_it_looked() {
    let c = Cache::new(&["config.json", "model.safetensors"]);
    let err = resolve("org/absent", None, c.dir()).expect_err("absent");
    let msg = err.to_string();
    assert!(matches!(err, ResolveError::NotCached { .. }), "{msg}");
    let looked = c.dir().join("models--org--absent");
    assert!(msg.contains(&looked.display().to_string()), "{msg}");
    let err = resolve("no/such/path.gguf", None, c.dir()).expect_err("path");
    assert!(matches!(err, ResolveError::NoSuchPath { .. }), "{err}");
}

#[test]
fn a_ref_to_a_missing_snapshot_is_an_error() {
    let c = Cache::new(&["config.json", "model.safetensors"]);
    std::fs::write(c.repo().join("refs/main"), "f".repeat(40)).expect("ref");
    let err = resolve("org/tiny", None, c.dir()).expect_err("missing");
    let msg = err.to_string();
    assert!(matches!(err, ResolveError::MissingSnapshot { .. }), "{msg}");
    assert!(
        msg.contains(
            &c.repo()
                .join("snapshots")
                .join("f".repeat(40))
                .display()
                .to_string()
        ),
        "{msg}"
    );
}

#[test]
fn incomplete_snapshots_say_what_is_missing() {
    let no_config = Cache::new(&["model.safetensors", "tokenizer.json"]);
    let msg = resolve("org/tiny", None, no_config.dir())
        .expect_err("no config")
        .to_string();
    assert!(msg.contains("no config.json"), "{msg}");
    assert!(
        msg.contains(&no_config.snapshot().display().to_string()),
        "{msg}"
    );

    let no_weights = Cache::new(&["config.json", "pytorch_model.bin"]);
    let msg = resolve("org/tiny", None, no_weights.dir())
        .expect_err("no weights")
        .to_string();
    assert!(
        msg.contains("no *.safetensors") && msg.contains("pytorch_model.bin"),
        "{msg}"
    );

    let broken = Cache::new(&["config.json", "model.safetensors"]);
    std::fs::remove_file(broken.repo().join("blobs/blob1")).expect("rm");
    let msg = resolve("org/tiny", None, broken.dir())
        .expect_err("broken")
        .to_string();
    assert!(
        msg.contains("blobs are missing") && msg.contains("model.safetensors"),
        "{msg}"
    );
}

#[test]
fn a_gguf_only_snapshot_serves_its_one_gguf_file() {
    let one = Cache::new(&["model-Q4_0.gguf", "README.md"]);
    let r = resolve("org/tiny", None, one.dir()).expect("one gguf");
    assert_eq!(r.path, one.snapshot().join("model-Q4_0.gguf"));

    let two = Cache::new(&["a-Q4_0.gguf", "a-Q8_0.gguf"]);
    let msg = resolve("org/tiny", None, two.dir())
        .expect_err("two ggufs")
        .to_string();
    assert!(msg.contains("a-Q4_0.gguf, a-Q8_0.gguf"), "{msg}");
}
