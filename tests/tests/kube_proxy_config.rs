//! The agent reads kube-proxy's configuration as upstream kube-proxy v1.36.3 does, judged by
//! kube-proxy itself: for the same flags or file, both write their resolved configuration
//! (`--write-config-to`) and the two must agree field for field; what one refuses the other
//! refuses too, but for the deliberate difference that the agent refuses unknown fields. And
//! `--init-only` leaves a node as kube-proxy's leaves it, both export the process metrics, and
//! both stop when their `--config` file is written to.

use anyhow::{Context, Result, bail, ensure};
use serde_json::Value;
use splitproxy_e2e::{
    addresses::CONTROL_PLANE,
    control_plane::{Binaries, ControlPlane},
    eventually, hit,
    lab::{Lab, Node},
    workspace_binary,
};
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

/// The `config.conf` kubeadm v1.36 writes into the `kube-proxy` ConfigMap: every field, unset
/// ones null, zero or empty.
const KUBEADM_CONFIG: &str = include_str!("../../node-agent/testdata/kubeadm-config.conf");

const HEADER: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n";

/// Runs `binary args --write-config-to=…` and returns the configuration written, or what it
/// said on refusing.
fn written(binary: &Path, args: &[String], dir: &Path) -> Result<Result<Value, String>> {
    let out = dir.join("written.yaml");
    let _ = std::fs::remove_file(&out);
    let output = Command::new(binary)
        .args(args)
        .arg(format!("--write-config-to={}", out.display()))
        .env_remove("NODE_NAME")
        .output()
        .with_context(|| format!("running {}", binary.display()))?;
    if !output.status.success() {
        return Ok(Err(String::from_utf8_lossy(&output.stderr).into_owned()));
    }
    let text = std::fs::read_to_string(&out).context("reading the written configuration")?;
    let value: Value = serde_norway::from_str(&text).context("parsing the written YAML")?;
    Ok(Ok(normalised(value)))
}

/// Numbers as numbers whatever their written form (`5` and `5.0`).
fn normalised(value: Value) -> Value {
    match value {
        Value::Number(n) => n
            .as_f64()
            .and_then(serde_json::Number::from_f64)
            .map_or(Value::Number(n), Value::Number),
        Value::Array(items) => Value::Array(items.into_iter().map(normalised).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, normalised(v))).collect())
        }
        other => other,
    }
}

/// The fields where `a` and `b` differ, by path.
fn differences(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for key in keys {
                let null = Value::Null;
                differences(
                    a.get(key).unwrap_or(&null),
                    b.get(key).unwrap_or(&null),
                    &format!("{path}.{key}"),
                    out,
                );
            }
        }
        _ if a != b => out.push(format!("{path}: kube-proxy {a}, splitproxy {b}")),
        _ => {}
    }
}

struct Subjects {
    kube_proxy: PathBuf,
    agent: PathBuf,
    dir: tempfile::TempDir,
}

impl Subjects {
    fn new() -> Result<Self> {
        Ok(Self {
            kube_proxy: Binaries::ensure()?.kubernetes.join("kube-proxy"),
            agent: workspace_binary("splitproxy-agent")?,
            dir: tempfile::tempdir()?,
        })
    }

    /// A file in the scratch directory holding `text`, as a `--config` flag.
    fn config_flag(&self, name: &str, text: &str) -> Result<String> {
        let path = self.dir.path().join(name);
        std::fs::write(&path, text)?;
        Ok(format!("--config={}", path.display()))
    }

    /// Both programs' outcome for `args`.
    fn both(&self, args: &[String]) -> Result<(Result<Value, String>, Result<Value, String>)> {
        Ok((
            written(&self.kube_proxy, args, self.dir.path())?,
            written(&self.agent, args, self.dir.path())?,
        ))
    }
}

/// What a program did with a configuration, for a failure message.
fn outcome(result: &Result<Value, String>) -> String {
    match result {
        Ok(_) => "accepted".to_owned(),
        Err(stderr) => format!("refused: {stderr}"),
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|arg| (*arg).to_owned()).collect()
}

#[test]
fn the_agent_resolves_flags_and_files_as_kube_proxy_does() -> Result<()> {
    let subjects = Subjects::new()?;
    let kubeadm = subjects.config_flag("kubeadm.yaml", KUBEADM_CONFIG)?;
    let ipvs_file = subjects.config_flag(
        "ipvs.yaml",
        &format!(
            "{HEADER}mode: ipvs\nipvs:\n  scheduler: wrr\n  syncPeriod: 1m\n  excludeCIDRs: [10.0.0.0/8]\n\
             iptables:\n  masqueradeAll: true\nmetricsBindAddress: 0.0.0.0\nbindAddress: fd00::1\n\
             logging:\n  flushFrequency: 2000000000\n  verbosity: 2\n"
        ),
    )?;
    let nftables_file = subjects.config_flag(
        "nftables.yaml",
        &format!(
            "{HEADER}mode: nftables\nnftables:\n  masqueradeAll: true\n  minSyncPeriod: 0s\n\
             iptables:\n  syncPeriod: 10s\nconntrack:\n  maxPerCore: 0\n  tcpBeLiberal: true\n  \
             udpTimeout: 30s\n  tcpEstablishedTimeout: 0s\nfeatureGates:\n  AllBeta: false\n\
             detectLocalMode: InterfaceNamePrefix\ndetectLocal:\n  interfaceNamePrefix: veth\n"
        ),
    )?;
    let cases: Vec<Vec<String>> = vec![
        strings(&[]),
        strings(&["--proxy-mode=ipvs"]),
        strings(&["--proxy-mode=nftables", "--masquerade-all"]),
        strings(&[
            "--proxy-mode=ipvs",
            "--ipvs-min-sync-period=0s",
            "--iptables-sync-period=1m",
            "--ipvs-scheduler=sh",
            "--ipvs-exclude-cidrs=10.0.0.0/8,10.1.0.0/16",
            "--ipvs-strict-arp",
            "--ipvs-tcp-timeout=15m",
            "--ipvs-tcpfin-timeout=30s",
            "--ipvs-udp-timeout=45s",
        ]),
        strings(&[
            "--cluster-cidr=10.244.0.0/16,fd00:10:244::/56",
            "--nodeport-addresses=primary",
            "--bind-address=fd00::1",
        ]),
        strings(&[
            "--conntrack-max-per-core=0",
            "--conntrack-min=1000",
            "--conntrack-tcp-be-liberal",
            "--conntrack-udp-timeout=30s",
            "--conntrack-udp-timeout-stream=2m",
            "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=5m",
        ]),
        strings(&[
            "--metrics-bind-address=0.0.0.0:9999",
            "--healthz-bind-address=[::]:1234",
            "--bind-address-hard-fail",
            "--oom-score-adj=-500",
        ]),
        strings(&["--metrics-bind-address=", "--bind-address="]),
        strings(&[
            "--detect-local-mode=BridgeInterface",
            "--pod-bridge-interface=cni0",
            "--iptables-localhost-nodeports=false",
            "--iptables-masquerade-bit=14",
        ]),
        strings(&[
            "--feature-gates=AllAlpha=false,NFTablesProxyMode=true",
            "--v=3",
            "--logging-format=json",
        ]),
        strings(&[
            "--kube-api-qps=7.5",
            "--kube-api-burst=3",
            "--kube-api-content-type=application/json",
            "--kubeconfig=/etc/kubeconfig",
            "--config-sync-period=1m",
            "--profiling",
        ]),
        vec![kubeadm.clone()],
        vec![
            kubeadm,
            "--hostname-override=Node-1".to_owned(),
            "--proxy-mode=ipvs".to_owned(),
            "--masquerade-all".to_owned(),
            "-v=2".to_owned(),
        ],
        vec![ipvs_file],
        vec![nftables_file],
    ];
    let mut failures = Vec::new();
    for args in &cases {
        match subjects.both(args)? {
            (Ok(upstream), Ok(ours)) => {
                let mut found = Vec::new();
                differences(&upstream, &ours, "", &mut found);
                if !found.is_empty() {
                    failures.push(format!("{args:?}:\n  {}", found.join("\n  ")));
                }
            }
            (upstream, ours) => failures.push(format!(
                "{args:?}: kube-proxy {}, splitproxy {}",
                outcome(&upstream),
                outcome(&ours),
            )),
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

#[test]
fn what_kube_proxy_refuses_the_agent_refuses_naming_the_field() -> Result<()> {
    let subjects = Subjects::new()?;
    let file = |name: &str, body: &str| subjects.config_flag(name, &format!("{HEADER}{body}"));
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            strings(&["--iptables-sync-period=0"]),
            "iptables.syncPeriod",
        ),
        (
            strings(&["--iptables-sync-period=1s", "--iptables-min-sync-period=2s"]),
            "iptables.minSyncPeriod",
        ),
        (
            strings(&["--iptables-masquerade-bit=32"]),
            "iptables.masqueradeBit",
        ),
        (strings(&["--oom-score-adj=1001"]), "oomScoreAdj"),
        (strings(&["--conntrack-min=-1"]), "conntrack.min"),
        (
            strings(&["--nodeport-addresses=primary,10.0.0.0/8"]),
            "nodePortAddresses",
        ),
        (
            strings(&["--cluster-cidr=10.0.0.0/8,10.1.0.0/16"]),
            "clusterCIDR",
        ),
        (strings(&["--detect-local-mode=Bogus"]), "detectLocalMode"),
        (
            strings(&["--detect-local-mode=BridgeInterface"]),
            "detectLocal.bridgeInterface",
        ),
        (
            strings(&["--feature-gates=NoSuchGate=true"]),
            "featureGates.NoSuchGate",
        ),
        (strings(&["--logging-format=xml"]), "logging.format"),
        (vec![file("mode.yaml", "mode: userspace\n")?], "mode"),
        (
            vec![file("bind.yaml", "bindAddress: node-1\n")?],
            "bindAddress",
        ),
        (
            vec![file(
                "ipvs.yaml",
                "mode: ipvs\nipvs:\n  excludeCIDRs: [10.0.0.0]\n",
            )?],
            "ipvs.excludeCIDRs[0]",
        ),
        (
            vec![file("type.yaml", "conntrack:\n  min: lots\n")?],
            "conntrack.min",
        ),
        (
            vec![file("duration.yaml", "iptables:\n  syncPeriod: 30\n")?],
            "iptables.syncPeriod",
        ),
    ];
    let mut failures = Vec::new();
    for (args, field) in &cases {
        match subjects.both(args)? {
            (Err(_), Err(ours)) if ours.contains(field) => {}
            (upstream, ours) => failures.push(format!(
                "{args:?} (expected both to refuse, the agent naming {field}): kube-proxy {}, splitproxy {}",
                outcome(&upstream),
                outcome(&ours),
            )),
        }
    }
    ensure!(failures.is_empty(), "{}", failures.join("\n"));
    Ok(())
}

#[test]
fn an_unknown_field_is_refused_by_name_where_kube_proxy_drops_it() -> Result<()> {
    let subjects = Subjects::new()?;
    let args = vec![subjects.config_flag(
        "typo.yaml",
        &format!("{HEADER}conntrack:\n  maxPercore: 0\n"),
    )?];
    match subjects.both(&args)? {
        (Ok(_), Err(ours)) if ours.contains("conntrack.maxPercore") => Ok(()),
        (upstream, ours) => bail!(
            "expected kube-proxy to accept and splitproxy to refuse naming the field: \
             kube-proxy {}, splitproxy {}",
            outcome(&upstream),
            outcome(&ours),
        ),
    }
}

/// The sysctls kube-proxy's start sets on a node, by `/proc/sys` path.
const NODE_SYSCTLS: [&str; 6] = [
    "net/netfilter/nf_conntrack_tcp_timeout_established",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
    "net/netfilter/nf_conntrack_tcp_be_liberal",
    "net/netfilter/nf_conntrack_udp_timeout",
    "net/netfilter/nf_conntrack_udp_timeout_stream",
    "net/ipv4/conf/all/route_localnet",
];

fn sysctls(lab: &Lab, node: &Node) -> Result<Vec<(String, String)>> {
    NODE_SYSCTLS
        .iter()
        .map(|name| {
            let value = lab.exec_ok(node, "cat", &[&format!("/proc/sys/{name}")])?;
            Ok(((*name).to_owned(), value.trim().to_owned()))
        })
        .collect()
}

#[test]
fn init_only_sets_the_node_up_as_kube_proxy_does() -> Result<()> {
    let binaries = Binaries::ensure()?;
    let kube_proxy = binaries.kubernetes.join("kube-proxy");
    let agent = workspace_binary("splitproxy-agent")?;
    let mut lab = Lab::new("initonly")?;
    let cp_host = lab.add_host("cp", CONTROL_PLANE)?;
    let nodes = lab.add_nodes(2)?;
    let control_plane = ControlPlane::start(&mut lab, &cp_host, binaries)?;
    for node in &nodes {
        control_plane.register_node(&lab, node)?;
    }
    let before = sysctls(&lab, &nodes[1])?;
    // Every value away from the kernel's defaults, so a step left out shows. A node that is a
    // network namespace cannot size the machine's table: maxPerCore 0, as kind sets it.
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("config.conf");
    std::fs::write(
        &config,
        format!(
            "{HEADER}mode: iptables\nclientConnection:\n  kubeconfig: {}\nconntrack:\n  \
             maxPerCore: 0\n  tcpEstablishedTimeout: 2h\n  tcpCloseWaitTimeout: 30m\n  \
             tcpBeLiberal: true\n  udpTimeout: 33s\n  udpStreamTimeout: 150s\n",
            control_plane.lan_admin_kubeconfig()?.display()
        ),
    )?;
    let config_flag = format!("--config={}", config.display());
    for (program, node) in [(&kube_proxy, &nodes[0]), (&agent, &nodes[1])] {
        let output = lab.exec(
            node,
            program,
            &[
                "--init-only",
                &config_flag,
                &format!("--hostname-override={}", node.name()),
            ],
        )?;
        ensure!(
            output.status.success(),
            "{} --init-only failed: {}{}",
            program.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let upstream = sysctls(&lab, &nodes[0])?;
    let ours = sysctls(&lab, &nodes[1])?;
    ensure!(
        upstream == ours,
        "kube-proxy set {upstream:?}, splitproxy {ours:?}"
    );
    let changed: Vec<&str> = before
        .iter()
        .zip(&ours)
        .filter(|(b, o)| b != o)
        .map(|(b, _)| b.0.as_str())
        .collect();
    ensure!(
        changed.len() == NODE_SYSCTLS.len(),
        "the test sets every sysctl away from its default, but only {changed:?} changed"
    );
    Ok(())
}

#[test]
fn both_stop_when_their_config_file_is_written_to() -> Result<()> {
    const BOUND: Duration = Duration::from_secs(90);
    let binaries = Binaries::ensure()?;
    let kube_proxy = binaries.kubernetes.join("kube-proxy");
    let mut lab = Lab::new("configwatch")?;
    let cp_host = lab.add_host("cp", CONTROL_PLANE)?;
    let nodes = lab.add_nodes(2)?;
    let control_plane = ControlPlane::start(&mut lab, &cp_host, binaries)?;
    for node in &nodes {
        control_plane.register_node(&lab, node)?;
    }
    control_plane.start_controller(&mut lab, &control_plane.admin_kubeconfig())?;
    let dir = tempfile::tempdir()?;
    let config = format!(
        "{HEADER}mode: iptables\nclientConnection:\n  kubeconfig: {}\nconntrack:\n  maxPerCore: 0\n",
        control_plane.lan_admin_kubeconfig()?.display()
    );
    // One file each, as each node mounts its own copy of the ConfigMap.
    let files: Vec<PathBuf> = (0..2)
        .map(|n| dir.path().join(format!("config-{n}.conf")))
        .collect();
    for file in &files {
        std::fs::write(file, &config)?;
    }
    let flag = |n: usize| format!("--config={}", files[n].display());
    let upstream = lab.spawn(
        &nodes[0],
        &kube_proxy,
        &[
            &flag(0),
            &format!("--hostname-override={}", nodes[0].name()),
        ],
    )?;
    let agent = control_plane.start_agent_with(&mut lab, &nodes[1], &[&flag(1)])?;
    for node in &nodes {
        eventually(&format!("{} answers /livez", node.name()), BOUND, || {
            let report = hit(&lab, node, "http://127.0.0.1:10256/livez", 1)?;
            ensure!(report.failures == 0, "{report:?}");
            Ok(())
        })
        .with_context(|| format!("{}\n{}", upstream.log(), agent.log()))?;
    }
    // Meanwhile, both export the process metrics under the same names (Go's process collector
    // upstream).
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        for node in &nodes {
            let scrape = lab.exec_ok(
                node,
                "curl",
                &["-s", "--max-time", "5", "http://127.0.0.1:10249/metrics"],
            )?;
            ensure!(
                scrape
                    .lines()
                    .any(|line| line.starts_with(&format!("{name} "))),
                "{} exports no {name}",
                node.name()
            );
        }
    }
    for file in &files {
        std::fs::write(file, format!("{config}# edited\n"))?;
    }
    for (name, process) in [("kube-proxy", &upstream), ("splitproxy-agent", &agent)] {
        let status = eventually(&format!("{name} stops"), BOUND, || {
            lab.exit_status(process)?
                .ok_or_else(|| anyhow::anyhow!("{name} still runs"))
        })
        .with_context(|| process.log())?;
        ensure!(!status.success(), "{name} stopped with {status}");
    }
    // Each because of the file, not anything else.
    ensure!(
        upstream.log().contains("configuration file was updated"),
        "kube-proxy stopped for another reason:\n{}",
        upstream.log()
    );
    ensure!(
        agent
            .log()
            .contains("was updated; exiting so that the restart reads it"),
        "the agent does not say why it stopped:\n{}",
        agent.log()
    );
    Ok(())
}
