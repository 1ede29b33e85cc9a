use super::session::ByProbe;
use super::*;

#[test]
fn numbers_are_rounded_to_six_decimals_and_non_finite_is_null() {
    let j = |v: f64| serde_json::to_string(&Num(v)).unwrap();
    assert_eq!(j(0.8 / 3.0), "0.266667");
    assert_eq!(j(1.0), "1.0");
    assert_eq!(j(1e-7), "0.0");
    assert_eq!(j(f64::NAN), "null");
    assert_eq!(j(f64::INFINITY), "null");
}

#[test]
fn by_probe_keys_are_unique_in_first_seen_order() {
    let known = llmprof_abi::PROBE_NAMES[0];
    let v = [
        ("not-a-probe".to_owned(), 1.0),
        (known.to_owned(), 2.0),
        ("also-not".to_owned(), 3.0),
    ];
    let got = serde_json::to_string(&ByProbe::of(&v)).unwrap();
    assert_eq!(got, format!(r#"{{"other":3.0,"{known}":2.0}}"#));
}

#[test]
fn keys_follow_the_documented_order() {
    let r = Report {
        trace: "t".into(),
        drops_source: "summary",
        ..Default::default()
    };
    let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "format",
            "trace",
            "truncated",
            "has_summary",
            "end_reason",
            "requests",
            "steps",
            "counters",
            "syscalls",
            "model_files",
            "egress",
            "drops",
            "overhead",
            "gpu",
            "thread_states",
            "cpu_samples",
            "kernels"
        ]
    );
    assert_eq!(v["format"], JSON_FORMAT);
    assert_eq!(v["steps"]["by_kind"]["decode"]["p50"], serde_json::Value::Null);
}
