//! Bad objects are skipped one by one: Services with an invalid IP, port or protocol next to
//! valid ones, through the manifests source (the real API server refuses them at admission). The
//! valid Services keep working, each bad one is named in a log line and counted in the
//! controller's `splitproxy_controller_invalid_services`, and fixing one brings it in. Needs root;
//! `scripts/test.sh` builds the binaries first.

#![allow(clippy::unwrap_used)]

use anyhow::{Context, Result, ensure};
use splitproxy_e2e::{
    demo_cluster::{DemoCluster, POD_PORT},
    eventually,
};
use std::{net::Ipv4Addr, time::Duration};

/// The longest wait for rules to converge; generous because CI machines are slow and shared.
const CONVERGE: Duration = Duration::from_secs(90);
const REQUESTS: u32 = 20;

/// A ClusterIP Service `demo/<name>` on `cluster_ip:port/protocol`, targeting the web pods'
/// port, with the web pods' EndpointSlice.
fn service_yaml(
    cluster: &DemoCluster,
    name: &str,
    cluster_ip: &str,
    (port, protocol): (u32, &str),
) -> String {
    let slice = cluster.endpoint_slice_yaml(name);
    format!(
        "apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: demo
spec:
  clusterIP: {cluster_ip}
  clusterIPs: [{cluster_ip}]
  ports:
  - name: http
    protocol: {protocol}
    port: {port}
    targetPort: {POD_PORT}
---
{slice}"
    )
}

/// The controller's `splitproxy_controller_invalid_services`.
fn invalid_services(cluster: &DemoCluster) -> Result<f64> {
    cluster
        .controller_metric("splitproxy_controller_invalid_services")?
        .context("the controller exports no splitproxy_controller_invalid_services")
}

#[test]
fn bad_services_are_skipped_one_by_one_and_the_others_keep_working() -> Result<()> {
    let cluster = DemoCluster::start("badobj")?;
    let bad = [
        ("bad-ip", "10.96.0.999", (80, "TCP")),
        ("bad-port", "10.96.0.21", (70000, "TCP")),
        ("bad-protocol", "10.96.0.22", (80, "ICMP")),
    ];
    let mut yaml = service_yaml(&cluster, "good", "10.96.0.20", (80, "TCP"));
    for (name, ip, port) in bad {
        yaml.push_str("---\n");
        yaml.push_str(&service_yaml(&cluster, name, ip, port));
    }
    cluster.write_manifest("mixed.yaml", &yaml)?;

    eventually("the valid Services to work", CONVERGE, || {
        cluster.check_traffic(REQUESTS)?;
        let good = cluster.answered(Ipv4Addr::new(10, 96, 0, 20), REQUESTS)?;
        ensure!(good == REQUESTS, "demo/good answered {good} of {REQUESTS}");
        Ok(())
    })
    .with_context(|| cluster.logs())?;
    let logs = cluster.logs();
    for (name, ..) in bad {
        ensure!(
            logs.contains(&format!("demo/{name}")),
            "no log line names demo/{name}:\n{logs}"
        );
    }
    for (host, name) in [(21, "bad-port"), (22, "bad-protocol")] {
        let ip = Ipv4Addr::new(10, 96, 0, host);
        let reached = cluster.answered(ip, 1)?;
        ensure!(reached == 0, "demo/{name} answered on {ip}");
    }
    let counted = invalid_services(&cluster)?;
    ensure!(
        counted == 3.0,
        "splitproxy_controller_invalid_services is {counted}"
    );

    // Fixing one brings it in, and the count goes down.
    let fixed = yaml.replace("10.96.0.999", "10.96.0.24");
    cluster.write_manifest("mixed.yaml", &fixed)?;
    eventually("the fixed Service to work", CONVERGE, || {
        let reached = cluster.answered(Ipv4Addr::new(10, 96, 0, 24), REQUESTS)?;
        ensure!(
            reached == REQUESTS,
            "demo/bad-ip answered {reached} of {REQUESTS}"
        );
        let now = invalid_services(&cluster)?;
        ensure!(
            now == 2.0,
            "splitproxy_controller_invalid_services is {now}"
        );
        Ok(())
    })
    .with_context(|| cluster.logs())?;
    cluster.check_traffic(REQUESTS)?;
    Ok(())
}
