//! B5's quick profile at its smallest size, as a smoke test: every implementation carries
//! traffic through its rules, and every trial is valid. It checks no speed (the machine runs
//! other tests beside it); `scripts/bench.sh b5` measures.

use std::process::Command;

#[test]
fn every_implementation_carries_clean_trials_at_one_service() {
    // A retransmission is timing, not rules: on a machine loaded by the other tests a delayed
    // ACK can make one trial invalid, so a second run is allowed; both failing fails.
    if let Err(why) = run_smallest_quick_profile()
        && let Err(again) = run_smallest_quick_profile()
    {
        panic!("twice invalid:\n{why}\nthen:\n{again}");
    }
}

/// Runs B5's quick profile at 1 Service and checks its results; `Err` names the invalid cells.
fn run_smallest_quick_profile() -> Result<(), String> {
    let output = tempfile::tempdir().expect("a results folder");
    let dir = output.path().to_string_lossy().into_owned();
    let status = Command::new(env!("CARGO_BIN_EXE_splitproxy-bench"))
        .args([
            "b5",
            "--profile",
            "quick",
            "--services",
            "1",
            "--rounds",
            "1",
            "--latency-count",
            "200",
            "--rate-seconds",
            "0.5",
            "--timeout-s",
            "600",
            "--output",
            &dir,
        ])
        .status()
        .expect("the benchmark starts");
    assert!(status.success(), "b5 failed: {status}");
    let text = std::fs::read_to_string(output.path().join("b5.json")).expect("b5.json");
    let results: serde_json::Value = serde_json::from_str(&text).expect("b5.json parses");
    let size = &results["sizes"][0];
    assert_eq!(size["services"], 1);
    let cells = size["cells"].as_array().expect("cells");
    // ClusterIP and pod IP, each through five proxies (kube-proxy's two modes, splitproxy's
    // three) and two limits.
    assert_eq!(cells.len(), 14, "{cells:#?}");
    let invalid: Vec<String> = cells
        .iter()
        .filter(|cell| cell["valid"] != true)
        .map(|cell| {
            let what = format!("{} {}", cell["scenario"], cell["subject"]);
            format!("{what}: {}", cell["invalid_because"])
        })
        .collect();
    for cell in cells.iter().filter(|cell| cell["valid"] == true) {
        // A clean trial completed every exchange.
        let what = format!("{} {}", cell["scenario"], cell["subject"]);
        assert_eq!(cell["exchange_us"]["count"], 200, "{what}");
        assert_eq!(cell["connect_us"]["count"], 200, "{what}");
        let rate = cell["per_second"]["median"].as_f64().unwrap_or(0.0);
        assert!(rate > 0.0, "{what}: no exchange in the rate trial");
    }
    let programming = size["programming"].as_array().expect("programming");
    assert_eq!(programming.len(), 5);
    for proxy in programming {
        assert!(proxy["rules"].as_u64() > Some(0), "{proxy}");
    }
    for file in ["b5.md", "b5.svg"] {
        assert!(output.path().join(file).is_file(), "{file} written");
    }
    if invalid.is_empty() {
        Ok(())
    } else {
        Err(invalid.join("\n"))
    }
}
