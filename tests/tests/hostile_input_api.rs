//! The hostile input corpus (`tests/corpus/`) against a real API server (etcd, kube-apiserver and
//! kube-controller-manager built from the official modules, driven with kubectl): each file is
//! refused or admitted as its `# api:` line says (what kubectl cannot even parse is refused
//! before the server), and the admitted ones (odd but valid: duplicate and overlapping
//! endpoints, slices without their Service, 2000 ports, the longest names, a slice port 0) are
//! handled as through the manifests source: their Services answer real traffic, the slice port 0
//! the API server lets through is dropped with a log line, nothing is counted invalid or
//! rejected, and no process exits. Needs root and the cached Kubernetes build.

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    addresses,
    control_plane::ControlPlane,
    controller_metric,
    corpus::{self, Expect},
    eventually, hit, serve,
};
use std::time::{Duration, Instant};

const NAMESPACE: &str = "demo";
const POD_PORT: u16 = 8080;
const REQUESTS: u32 = 20;
/// Generous: the API server, the controller and the agents share a 2-core machine.
const CONVERGE: Duration = Duration::from_secs(120);

#[test]
fn the_api_server_refuses_the_malformed_cases_and_the_admitted_ones_are_programmed() -> Result<()> {
    let cases = corpus::load()?;
    let (mut lab, cp_host, nodes, control_plane) =
        ControlPlane::lab_with_two_nodes("hostapi", NAMESPACE)?;
    // The pods the corpus' slices list (see tests/corpus/README.md).
    for (name, node, host) in [("web-a", 0, 2), ("web-c", 1, 3)] {
        let n = u8::try_from(node + 1)?;
        let pod = lab.add_pod(&nodes[node], name, addresses::pod_ip(n, host))?;
        serve(&mut lab, &pod, name, POD_PORT)?;
    }

    let mut admitted = Vec::new();
    let mut mismatches: Vec<String> = Vec::new();
    for case in &cases {
        let path = corpus::dir().join(&case.file);
        let path = path.to_string_lossy();
        // Applied for real: a dry run skips the node-port allocator, which is what refuses a
        // node port out of its range. Of a refused file, the valid objects may be created.
        let applied = control_plane.kubectl(&lab, &["apply", "-f", &path]);
        if applied.is_ok() != case.api_admits {
            mismatches.push(format!("{}: kubectl said {applied:?}", case.file));
        }
        if case.api_admits {
            admitted.push(case);
        }
    }
    ensure!(
        mismatches.is_empty(),
        "admitted or refused against the corpus' `# api:` lines:\n{}",
        mismatches.join("\n")
    );
    println!(
        "API server: {} of {} corpus files admitted, {} refused",
        admitted.len(),
        cases.len(),
        cases.len() - admitted.len()
    );

    let started = Instant::now();
    let mut processes =
        vec![control_plane.start_controller(&mut lab, &control_plane.admin_kubeconfig())?];
    for node in &nodes {
        processes.push(control_plane.start_agent(&mut lab, node)?);
    }
    let logs = || -> String {
        processes.iter().map(|p| p.log_tail(30)).collect::<String>() + &control_plane.logs()
    };
    let expects: Vec<&Expect> = admitted.iter().flat_map(|case| &case.expects).collect();
    ensure!(
        expects.iter().any(|e| matches!(e, Expect::Answers(_))),
        "no admitted case expects a Service to answer"
    );
    eventually("the admitted Services to answer", CONVERGE, || {
        for expect in &expects {
            match expect {
                Expect::Answers(ip) => {
                    let report = hit(&lab, &nodes[0], &format!("http://{ip}:80/"), REQUESTS)?;
                    ensure!(
                        report.failures == 0,
                        "{ip}: {} of {REQUESTS} failed",
                        report.failures
                    );
                }
                Expect::NoAnswer(ip) => {
                    let report = hit(&lab, &nodes[0], &format!("http://{ip}:80/"), 3)?;
                    ensure!(report.failures == 3, "{ip} answered");
                }
                Expect::Invalid(_) | Expect::Log(_) => {}
            }
        }
        Ok(())
    })
    .with_context(logs)?;
    println!(
        "the admitted Services answered {:.1} s after the controller started",
        started.elapsed().as_secs_f64()
    );

    let controller_log = processes[0].log();
    for expect in &expects {
        if let Expect::Invalid(text) | Expect::Log(text) = expect {
            ensure!(
                controller_log.contains(text.as_str()),
                "no controller log line holds {text:?}"
            );
        }
    }
    let invalid = controller_metric(&lab, &cp_host, "splitproxy_controller_invalid_services")?;
    ensure!(
        invalid == Some(0.0),
        "the controller counts {invalid:?} invalid Services"
    );
    corpus::expect_unharmed(&mut lab, &nodes, &processes)
}
