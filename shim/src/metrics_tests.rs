//! The exposition format gyre's recorder produces: `gyre:` names with
//! their labels, `_seconds` histograms with buckets from 1 ms to minutes,
//! the tenants' rejection counter, and the vLLM renaming.

use super::*;

/// Renders what `record` records into a recorder built as [`install`]
/// builds it (local to this thread, so tests do not share one).
fn rendered(vllm: bool, record: impl FnOnce()) -> String {
    let recorder = builder().expect("builder").build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, record);
    Metrics::new(handle, vllm).render()
}

fn record_some() {
    let model = [("model_name", "tiny".to_owned())];
    metrics::histogram!("gyre:time_to_first_token_seconds", &model).record(0.003);
    metrics::histogram!("gyre:time_to_first_token_seconds", &model).record(42.0);
    metrics::counter!("gyre:prompt_tokens_total", &model).increment(7);
    metrics::gauge!("gyre:num_requests_running", &model).set(2.0);
    metrics::counter!("gyre:http_requests_total", "route" => "/v1/chat/completions", "status" => "200")
        .increment(1);
    metrics::counter!("gyre:rate_limit_rejections_total", "tenant" => "acme", "limit" => "requests")
        .increment(3);
}

#[test]
fn seconds_histograms_have_buckets_from_a_millisecond_to_minutes() {
    let text = rendered(false, record_some);
    assert!(
        text.contains("# TYPE gyre:time_to_first_token_seconds histogram"),
        "{text}"
    );
    let bucket = |le: &str| {
        let prefix =
            format!("gyre:time_to_first_token_seconds_bucket{{model_name=\"tiny\",le=\"{le}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("no bucket le={le} in\n{text}"))
            .to_owned()
    };
    assert_eq!(bucket("0.001"), "0");
    assert_eq!(bucket("0.005"), "1");
    assert_eq!(bucket("40"), "1");
    assert_eq!(bucket("80"), "2");
    assert_eq!(bucket("600"), "2");
    assert_eq!(bucket("+Inf"), "2");
    assert!(text.contains("gyre:time_to_first_token_seconds_count{model_name=\"tiny\"} 2"));
}

#[test]
fn counters_and_gauges_keep_their_names_and_labels() {
    let text = rendered(false, record_some);
    for line in [
        "gyre:prompt_tokens_total{model_name=\"tiny\"} 7",
        "gyre:num_requests_running{model_name=\"tiny\"} 2",
        "gyre:http_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 1",
        "gyre:rate_limit_rejections_total{tenant=\"acme\",limit=\"requests\"} 3",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
    }
    assert!(!text.contains("vllm:"), "{text}");
}

#[test]
fn vllm_names_rename_only_the_metrics_vllm_has() {
    let text = rendered(true, record_some);
    for line in [
        "vllm:prompt_tokens_total{model_name=\"tiny\"} 7",
        "vllm:num_requests_running{model_name=\"tiny\"} 2",
        "vllm:time_to_first_token_seconds_count{model_name=\"tiny\"} 2",
        "# TYPE vllm:time_to_first_token_seconds histogram",
        // No vLLM counterpart: the gyre name stays.
        "gyre:http_requests_total{route=\"/v1/chat/completions\",status=\"200\"} 1",
        "gyre:rate_limit_rejections_total{tenant=\"acme\",limit=\"requests\"} 3",
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("vllm:time_to_first_token_seconds_bucket{")),
        "{text}"
    );
    assert!(!text.contains("gyre:prompt_tokens_total"), "{text}");
    assert!(!text.contains("gyre:time_to_first_token"), "{text}");
}

#[test]
fn renaming_leaves_names_that_only_start_like_a_vllm_name() {
    let text = "gyre:num_requests_running_max 1\n# HELP gyre:num_requests_waiting w\ngyre:num_requests_waiting 0\n";
    assert_eq!(
        vllm_names(text),
        "gyre:num_requests_running_max 1\n# HELP vllm:num_requests_waiting w\nvllm:num_requests_waiting 0\n"
    );
}

#[test]
fn collectors_run_before_each_render() {
    let recorder = builder().expect("builder").build_recorder();
    let m = Metrics::new(recorder.handle(), false);
    let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen = calls.clone();
    m.add_collector(Arc::new(move || {
        seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }));
    m.render();
    m.render();
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 2);
}
