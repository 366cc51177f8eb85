//! The executor against fake tools: what it runs, in which order, and what a failure leaves.
#![allow(clippy::unwrap_used)]

use super::*;

#[test]
fn command_prefix_goes_before_every_command() {
    let args = ["-t".to_owned(), "nat".to_owned()];

    let plain = Config::default().command_line("iptables-save", &args);
    assert_eq!(plain, ("iptables-save".to_owned(), args.to_vec()));

    let in_netns = Config::default()
        .with_command_prefix(["ip", "netns", "exec", "ns1"])
        .command_line("iptables-save", &args);
    assert_eq!(in_netns.0, "ip");
    assert_eq!(
        in_netns.1,
        ["netns", "exec", "ns1", "iptables-save", "-t", "nat"]
    );
}

#[test]
fn mode_is_iptables() {
    assert_eq!(FamilyExecutor::new().mode(), "iptables");
}

#[tokio::test]
async fn a_full_sync_reads_both_tables_then_restores_the_render_with_the_missing_jumps() {
    let scratch = Scratch::new("sync");
    let saved = format!(
        "{SAVED}*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m comment --comment \"kubernetes health check service ports\" -j KUBE-NODEPORTS\nCOMMIT\n"
    );
    let mut iptables = fake_tools(&scratch, &saved, 0);
    let (state, _) = everything();

    let report = iptables.sync(&state).await.unwrap();

    let expected = render_nat(
        &state,
        &NodeOptions::default(),
        &chains(&["PREROUTING", "KUBE-SVC-GNZBNJ2PO5MGZ6GT"]),
    );
    let filter = render_filter(&state);
    assert_eq!(
        report.rules_written(),
        [
            ("filter".to_owned(), filter.rule_count),
            ("nat".to_owned(), expected.rule_count)
        ]
    );
    assert!(expected.payload.contains("-X KUBE-SVC-GNZBNJ2PO5MGZ6GT"));
    let payload = scratch.read("payload");
    let (rendered, jumps) = split_hooks(&payload);
    assert_rules_eq(
        &rendered,
        &format!("{}{}*mangle\nCOMMIT\n", filter.payload, expected.payload),
    );
    // Every jump but the one already there, and kubelet's two.
    assert_eq!(jumps.len(), JUMPS.len() - 1 + 2, "{payload}");
    assert!(!payload.contains("-I INPUT 1 -m comment --comment \"kubernetes health check"));
    // Nothing but the two saves and one restore: no process per jump.
    assert_rules_eq(
        &scratch.read("calls"),
        "iptables-save -t nat\niptables-save -t filter\niptables-restore -w 5 --noflush\n",
    );
}

#[tokio::test]
async fn rejected_restore_reports_its_stderr() {
    let scratch = Scratch::new("restore");
    let mut iptables = fake_tools(&scratch, SAVED, 2);

    let err = iptables.sync(&ProxyState::default()).await.unwrap_err();

    assert!(
        matches!(&err, Error::Restore { stderr, .. } if stderr == "iptables-restore: line 2 failed"),
        "{err:?}"
    );
    assert!(err.to_string().contains("line 2 failed"), "{err}");
    // The first sync is full: kube-proxy counts it as a restore failure, not a partial one.
    assert_eq!(
        crate::SyncError::failed_step(&err),
        crate::FailedStep::Restore { partial: false }
    );
}

#[tokio::test]
async fn a_refused_partial_sync_says_it_was_partial_and_the_next_sync_is_full() {
    let scratch = Scratch::new("partial-restore");
    let saved = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n";
    let mut iptables = fake_tools(&scratch, saved, 0);
    let (state, _) = everything();
    assert!(iptables.sync(&state).await.unwrap().full);

    std::fs::write(scratch.0.join("restore-fails"), "").unwrap();
    let err = iptables.sync(&state).await.unwrap_err();
    assert_eq!(
        crate::SyncError::failed_step(&err),
        crate::FailedStep::Restore { partial: true },
        "{err:?}"
    );

    std::fs::remove_file(scratch.0.join("restore-fails")).unwrap();
    assert!(iptables.sync(&state).await.unwrap().full);
}

#[tokio::test]
async fn failed_save_reports_its_stderr() {
    let mut iptables = FamilyExecutor::with_config(Config::default().with_command_prefix([
        "sh",
        "-c",
        "echo 'iptables-save: no such table' >&2; exit 1",
    ]));

    let err = iptables.sync(&ProxyState::default()).await.unwrap_err();

    assert!(
        matches!(&err, Error::Save { stderr, .. } if stderr == "iptables-save: no such table"),
        "{err:?}"
    );
}

#[tokio::test]
async fn missing_binary_is_a_run_error_naming_it() {
    let mut iptables = FamilyExecutor::with_config(Config {
        iptables_save: "/nonexistent/iptables-save".to_owned(),
        ..Config::default()
    });

    let err = iptables.sync(&ProxyState::default()).await.unwrap_err();

    assert!(
        matches!(&err, Error::Run(run) if run.program == "/nonexistent/iptables-save"),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "could not run /nonexistent/iptables-save");
}

#[test]
fn health_check_node_ports_of_local_policy_services_are_accepted_even_without_endpoints() {
    let local_policy = |name: &str, cluster_ip: &str, endpoints: Vec<Endpoint>| Service {
        external_traffic_policy: TrafficPolicy::Local,
        health_check_node_port: Some(30000),
        ..service(
            "ns1",
            name,
            &[cluster_ip],
            vec![
                ServicePort::new("p80", Protocol::Tcp, 80, Some(3001), endpoints.clone()),
                ServicePort::new("p81", Protocol::Udp, 81, Some(3002), endpoints),
            ],
        )
    };
    let state = state(vec![
        local_policy("svc1", "172.30.0.41", vec![local("10.180.0.1", 80)]),
        Service {
            health_check_node_port: Some(30002),
            ..local_policy("svc2", "172.30.0.42", Vec::new())
        },
        // A health-check port left on a Cluster-policy Service serves nothing: no ACCEPT.
        Service {
            external_traffic_policy: TrafficPolicy::Cluster,
            health_check_node_port: Some(30003),
            ..local_policy("svc3", "172.30.0.43", vec![ready("10.180.2.3", 80)])
        },
    ]);

    let filter = render_filter(&state);

    let accepts: Vec<&str> = filter
        .payload
        .lines()
        .filter(|l| l.starts_with("-A KUBE-NODEPORTS"))
        .collect();
    assert_eq!(
        accepts,
        [
            r#"-A KUBE-NODEPORTS -m comment --comment "ns1/svc1:p80 health check node port" -m tcp -p tcp --dport 30000 -j ACCEPT"#,
            r#"-A KUBE-NODEPORTS -m comment --comment "ns1/svc1:p81 health check node port" -m tcp -p tcp --dport 30000 -j ACCEPT"#,
            r#"-A KUBE-NODEPORTS -m comment --comment "ns1/svc2:p80 health check node port" -m tcp -p tcp --dport 30002 -j ACCEPT"#,
            r#"-A KUBE-NODEPORTS -m comment --comment "ns1/svc2:p81 health check node port" -m tcp -p tcp --dport 30002 -j ACCEPT"#,
        ]
    );
    assert!(filter.payload.contains(":KUBE-NODEPORTS - [0:0]\n"));
    let rules = filter
        .payload
        .lines()
        .filter(|l| l.starts_with("-A "))
        .count();
    assert_eq!(filter.rule_count as usize, rules);
}
