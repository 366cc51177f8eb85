//! The hostile input corpus (`tests/corpus/`, one file per case) through the manifests source,
//! every file at once, next to the demo's `demo/web`: each bad object is refused on its own (the
//! Service, or only its bad port, endpoint or IP, as kube-proxy would), named in a controller log
//! line and, for skipped Services, counted in `splitproxy_controller_invalid_services`; every
//! valid Service keeps answering real traffic; the controller and both agents stay up, and the
//! agents are handed nothing they must skip or reject. Needs root; `scripts/test.sh` builds the
//! binaries first.

#![allow(clippy::unwrap_used)]

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    corpus::{self, Expect},
    demo_cluster::{CONVERGE, DemoCluster},
    eventually,
};
use std::time::Instant;

const REQUESTS: u32 = 20;

#[test]
fn every_hostile_input_is_refused_on_its_own_and_the_valid_services_keep_working() -> Result<()> {
    let cases = corpus::load()?;
    println!(
        "corpus: {} cases by category: {:?}",
        cases.len(),
        corpus::sizes(&cases)
    );
    let mut cluster = DemoCluster::start("hostile")?;
    eventually("demo/web to work before the corpus", CONVERGE, || {
        cluster.check_traffic(REQUESTS)
    })
    .with_context(|| cluster.logs())?;

    let written = Instant::now();
    for case in &cases {
        cluster.write_manifest_bytes(&case.file, &case.bytes)?;
    }
    let expects: Vec<&Expect> = cases.iter().flat_map(|case| &case.expects).collect();
    let invalid = expects
        .iter()
        .filter(|e| matches!(e, Expect::Invalid(_)))
        .count();
    eventually("the valid Services to answer", CONVERGE, || {
        cluster.check_traffic(REQUESTS)?;
        for expect in &expects {
            if let Expect::Answers(ip) = expect {
                let answered = cluster.answered(*ip, REQUESTS)?;
                ensure!(
                    answered == REQUESTS,
                    "{ip} answered {answered} of {REQUESTS}"
                );
            }
        }
        let counted = cluster.controller_metric("splitproxy_controller_invalid_services")?;
        ensure!(
            counted == Some(invalid as f64),
            "splitproxy_controller_invalid_services is {counted:?}, not {invalid}"
        );
        Ok(())
    })
    .with_context(|| cluster.logs())?;
    println!(
        "every valid Service answered {:.1} s after the corpus was written",
        written.elapsed().as_secs_f64()
    );

    let log = cluster.controller.as_ref().unwrap().log();
    for expect in &expects {
        match expect {
            Expect::NoAnswer(ip) => {
                ensure!(cluster.answered(*ip, 3)? == 0, "{ip} answered");
            }
            Expect::Invalid(text) | Expect::Log(text) => {
                ensure!(log.contains(text), "no controller log line holds {text:?}");
            }
            Expect::Answers(_) => {}
        }
    }
    let processes: Vec<_> = cluster
        .controller
        .iter()
        .chain(&cluster.agents)
        .cloned()
        .collect();
    let nodes = cluster.nodes.clone();
    corpus::expect_unharmed(&mut cluster.lab, &nodes, &processes)
}
