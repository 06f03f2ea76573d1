//! Tests of the quota arithmetic: windows, reserve and settle, reset times.

use super::*;

fn limits() -> Limits {
    Limits::default()
}

#[test]
fn requests_per_minute_refuse_until_the_window_closes() {
    let t0 = Instant::now();
    let l = Limits {
        requests_per_minute: Some(2),
        ..limits()
    };
    let mut q = Quota::default();
    let a = q.admit(t0, &l, 0).expect("first");
    assert_eq!(a.requests, Some((2, 1, MINUTE)));
    q.settle(t0, 0, 0);
    let b = q
        .admit(t0 + Duration::from_secs(10), &l, 0)
        .expect("second");
    assert_eq!(b.requests, Some((2, 0, Duration::from_secs(50))));
    q.settle(t0, 0, 0);
    let r = q
        .admit(t0 + Duration::from_secs(20), &l, 0)
        .expect_err("third in the minute");
    assert_eq!(r.limit, Limit::RequestsPerMinute);
    assert_eq!(r.retry_after, Duration::from_secs(40));
    assert_eq!(r.snapshot.requests, Some((2, 0, Duration::from_secs(40))));
    // The window opened at t0 closes at t0 + 60 s.
    let c = q.admit(t0 + MINUTE, &l, 0).expect("next window");
    assert_eq!(c.requests, Some((2, 1, MINUTE)));
}

#[test]
fn requests_per_day_outlast_the_minute() {
    let t0 = Instant::now();
    let l = Limits {
        requests_per_minute: Some(10),
        requests_per_day: Some(2),
        ..limits()
    };
    let mut q = Quota::default();
    for i in 0..2 {
        q.admit(t0 + MINUTE * i, &l, 0).expect("within the day");
        q.settle(t0, 0, 0);
    }
    let r = q.admit(t0 + MINUTE * 5, &l, 0).expect_err("day used up");
    assert_eq!(r.limit, Limit::RequestsPerDay);
    assert_eq!(r.retry_after, DAY - MINUTE * 5);
    // The headers report the per-minute window, the one that is set first.
    assert_eq!(r.snapshot.requests, Some((10, 10, MINUTE)));
    assert!(q.admit(t0 + DAY, &l, 0).is_ok());
}

#[test]
fn a_reservation_holds_tokens_until_it_settles_to_real_usage() {
    let t0 = Instant::now();
    let l = Limits {
        tokens_per_minute: Some(100),
        ..limits()
    };
    let mut q = Quota::default();
    let a = q.admit(t0, &l, 70).expect("fits");
    assert_eq!(a.tokens, Some((100, 30, MINUTE)));
    // While the first is in flight, 70 more do not fit beside it.
    let r = q.admit(t0, &l, 70).expect_err("over the reservation");
    assert_eq!(r.limit, Limit::TokensPerMinute);
    assert_eq!(r.reserve, 70);
    // The first used only 20: after the settle, 70 fit (20 + 70 <= 100).
    q.settle(t0, 70, 20);
    let b = q.admit(t0, &l, 70).expect("fits after the settle");
    assert_eq!(b.tokens, Some((100, 10, MINUTE)));
    q.settle(t0, 70, 70);
    // 90 used: 11 no longer fit, 10 do.
    assert!(q.admit(t0, &l, 11).is_err());
    assert!(q.admit(t0, &l, 10).is_ok());
}

#[test]
fn a_request_larger_than_the_token_limit_is_always_refused() {
    let t0 = Instant::now();
    let l = Limits {
        tokens_per_minute: Some(100),
        ..limits()
    };
    let mut q = Quota::default();
    assert!(q.admit(t0, &l, 101).is_err());
    assert!(q.admit(t0 + DAY, &l, 101).is_err());
    assert!(q.admit(t0 + DAY, &l, 100).is_ok());
}

#[test]
fn in_flight_reservations_carry_into_the_next_window() {
    let t0 = Instant::now();
    let l = Limits {
        tokens_per_minute: Some(100),
        ..limits()
    };
    let mut q = Quota::default();
    q.admit(t0, &l, 80).expect("fits");
    // A minute later the window is new but the 80 are still reserved.
    let later = t0 + MINUTE + Duration::from_secs(1);
    assert!(q.admit(later, &l, 30).is_err());
    // Settled in the new window, the real usage counts there.
    q.settle(later, 80, 50);
    assert_eq!(q.snapshot(later, &l).tokens, Some((100, 50, MINUTE)));
    assert!(q.admit(later, &l, 50).is_ok());
}

#[test]
fn concurrent_requests_are_capped_and_freed_by_the_settle() {
    let t0 = Instant::now();
    let l = Limits {
        max_concurrent: Some(1),
        ..limits()
    };
    let mut q = Quota::default();
    q.admit(t0, &l, 5).expect("first");
    assert_eq!(q.in_flight(), 1);
    let r = q.admit(t0, &l, 5).expect_err("second at once");
    assert_eq!(r.limit, Limit::Concurrent);
    q.settle(t0, 5, 5);
    assert_eq!(q.in_flight(), 0);
    assert!(q.admit(t0, &l, 5).is_ok());
}

#[test]
fn a_refusal_changes_nothing() {
    let t0 = Instant::now();
    let l = Limits {
        requests_per_minute: Some(5),
        tokens_per_minute: Some(10),
        ..limits()
    };
    let mut q = Quota::default();
    for _ in 0..3 {
        assert!(q.admit(t0, &l, 11).is_err());
    }
    let s = q.admit(t0, &l, 10).expect("first that fits");
    assert_eq!(s.requests, Some((5, 4, MINUTE)));
    assert_eq!(s.tokens, Some((10, 0, MINUTE)));
}

#[test]
fn no_limits_means_no_headers() {
    let t0 = Instant::now();
    let mut q = Quota::default();
    let s = q.admit(t0, &limits(), 1_000_000).expect("unlimited");
    assert_eq!(s, Snapshot::default());
    assert!(!limits().any());
}

#[test]
fn reset_times_read_as_openai_writes_them() {
    assert_eq!(format_reset(Duration::from_millis(250)), "250ms");
    assert_eq!(format_reset(Duration::from_secs(12)), "12s");
    assert_eq!(format_reset(Duration::from_millis(12_001)), "13s");
    assert_eq!(format_reset(Duration::from_secs(90)), "1m30s");
    assert_eq!(format_reset(Duration::from_secs(86_400)), "24h0m0s");
}
