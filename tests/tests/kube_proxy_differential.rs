//! Differential test against upstream kube-proxy: one real API server; upstream kube-proxy of
//! the pinned release in one network namespace and splitproxy (controller and agent) in
//! another, both programming node-1 from the same `KubeProxyConfiguration`. A seeded generator
//! applies rounds of Services and EndpointSlices over every feature; after each round both
//! nodes' rules must agree: iptables and ip6tables rules in iptables mode (`rule_compare` says
//! what is normalised away and why), both `kube-proxy` tables in nftables mode (`nft_compare`).
//!
//! `SPLITPROXY_DIFF_SEEDS` (comma-separated, default `1,2`), `SPLITPROXY_DIFF_ROUNDS` (default
//! 3) and `SPLITPROXY_DIFF_SERVICES` (default 24) widen it; `scripts/differential.sh` runs many
//! seeds. A failure names its seed, which replays it.

use anyhow::{Context, Result, bail};
use splitproxy_e2e::{
    addresses::CONTROL_PLANE,
    control_plane::{Binaries, CONTROLLER_PORT, ControlPlane},
    eventually,
    lab::{Lab, Node, Process},
    nft_compare::Ruleset,
    rule_compare::Rules,
    service_generator::{Generator, NAMESPACE, NODE, Round, ZONES},
    workspace_binary,
};
use std::{path::Path, time::Duration};

/// How long both proxies may take to program one round.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(180);

fn setting(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

/// What differs between the two nodes' rules (every table, both families, `mode`'s), one line
/// each; `None` until both have programmed `marker`.
fn compare(lab: &Lab, nodes: &[Node], mode: &str, marker: &str) -> Result<Option<Vec<String>>> {
    if mode == "nftables" {
        let mut sides = Vec::new();
        for node in nodes {
            let v4 = lab.exec_ok(node, "nft", &["list", "table", "ip", "kube-proxy"])?;
            if !v4.contains(&format!("{marker} . ")) && !v4.contains(&format!("{marker}:")) {
                return Ok(None);
            }
            let v6 = lab.exec_ok(node, "nft", &["list", "table", "ip6", "kube-proxy"])?;
            sides.push(format!("{v4}{v6}"));
        }
        let kube_proxy = Ruleset::parse(&sides[0])?;
        let splitproxy = Ruleset::parse(&sides[1])?;
        return Ok(Some(kube_proxy.differences(&splitproxy)));
    }
    let mut sides = Vec::new();
    for node in nodes {
        let v4 = lab.exec_ok(node, "iptables-save", &[])?;
        if !v4.contains(&format!("--to-destination {marker}:")) {
            return Ok(None);
        }
        let v6 = lab.exec_ok(node, "ip6tables-save", &[])?;
        sides.push(Rules::parse(&format!("{v4}{}", v6.replace('*', "*ip6-"))));
    }
    let splitproxy = sides.pop().context("two nodes")?;
    let kube_proxy = sides.pop().context("two nodes")?;
    Ok(Some(kube_proxy.differences(&splitproxy)))
}

fn apply(lab: &Lab, control_plane: &ControlPlane, dir: &Path, round: &Round) -> Result<()> {
    if !round.deleted.is_empty() {
        let mut args = vec!["delete", "service", "-n", NAMESPACE, "--ignore-not-found"];
        args.extend(round.deleted.iter().map(String::as_str));
        control_plane.kubectl(lab, &args)?;
        let selector = format!(
            "kubernetes.io/service-name in ({})",
            round.deleted.join(",")
        );
        control_plane.kubectl(
            lab,
            &["delete", "endpointslices", "-n", NAMESPACE, "-l", &selector],
        )?;
    }
    let file = dir.join("round.yaml");
    std::fs::write(&file, &round.apply)?;
    control_plane.kubectl(lab, &["apply", "-f", &file.to_string_lossy()])?;
    for (service, patch) in &round.statuses {
        control_plane.kubectl(
            lab,
            &[
                "patch",
                "service",
                service,
                "-n",
                NAMESPACE,
                "--subresource=status",
                "--type=merge",
                "-p",
                patch,
            ],
        )?;
    }
    Ok(())
}

/// The seeds, rounds and Services per seed of the random runs (`SPLITPROXY_DIFF_*`).
fn random_runs() -> Result<(Vec<u64>, usize, usize)> {
    let seeds = setting("SPLITPROXY_DIFF_SEEDS", "1,2")
        .split(',')
        .map(|seed| seed.trim().parse().context("SPLITPROXY_DIFF_SEEDS"))
        .collect::<Result<_>>()?;
    let rounds = setting("SPLITPROXY_DIFF_ROUNDS", "3").parse()?;
    let size = setting("SPLITPROXY_DIFF_SERVICES", "24").parse()?;
    Ok((seeds, rounds, size))
}

#[test]
fn splitproxy_programs_what_kube_proxy_programs_round_after_round() -> Result<()> {
    let (seeds, rounds, size) = random_runs()?;
    differential(
        "diffcluster",
        "iptables",
        "ClusterCIDR",
        &seeds,
        rounds,
        size,
    )
}

/// The same in nftables mode: both nodes' `kube-proxy` tables, splitproxy's shared endpoint
/// maps resolved into the chains that pick from them.
#[test]
fn in_nftables_mode_splitproxy_programs_what_kube_proxy_programs() -> Result<()> {
    let (seeds, rounds, size) = random_runs()?;
    differential("diffnft", "nftables", "ClusterCIDR", &seeds, rounds, size)
}

/// kube-proxy's NodeCIDR detector: pod traffic told by node-1's own pod CIDR, which splitproxy's
/// controller sends from the Node object. One seed: only the detector differs.
#[test]
fn with_the_node_cidr_detector_splitproxy_programs_what_kube_proxy_programs() -> Result<()> {
    differential("diffnode", "iptables", "NodeCIDR", &[3], 2, 16)
}

/// Gives each node its zone once kube-proxy passes the registration of its topology handler.
/// Upstream (v1.36's `cmd/kube-proxy/app/server.go`) adds the Node informer's topology handler
/// first and registers the proxier with it after, so a zone already on the Node when the
/// informer replays it can be taken before the proxier listens: that kube-proxy never learns
/// its zone and ignores every topology hint until the zone label changes (seen once in CI, a
/// hinted Service programmed with all its endpoints by kube-proxy and its zone's by
/// splitproxy). A zone labelled after "Starting node config controller", which upstream logs
/// after that registration, reaches the proxier as a change.
fn label_zones_once_kube_proxy_listens(
    lab: &Lab,
    control_plane: &ControlPlane,
    nodes: &[Node],
    kube_proxy: &Process,
) -> Result<()> {
    eventually(
        "kube-proxy registers for its node's topology",
        Duration::from_secs(120),
        || {
            if kube_proxy.log().contains("Starting node config controller") {
                Ok(())
            } else {
                bail!("not yet; its log ends:\n{}", kube_proxy.log_tail(5))
            }
        },
    )?;
    for (node, zone) in nodes.iter().zip(ZONES) {
        control_plane.kubectl(
            lab,
            &[
                "label",
                "node",
                node.name(),
                &format!("topology.kubernetes.io/zone={zone}"),
            ],
        )?;
    }
    Ok(())
}

/// One comparison at a time: each runs an API server and both proxies.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs upstream kube-proxy and splitproxy as node-1 in `mode` with `detectLocalMode:
/// detect_local` in a lab tagged `tag`, and compares their rules after each round of every seed.
fn differential(
    tag: &str,
    mode: &str,
    detect_local: &str,
    seeds: &[u64],
    rounds: usize,
    size: usize,
) -> Result<()> {
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);

    let binaries = Binaries::ensure()?;
    let kube_proxy = binaries.kubernetes.join("kube-proxy");
    let mut lab = Lab::new(tag)?;
    let cp_host = lab.add_host("cp", CONTROL_PLANE)?;
    let nodes = lab.add_nodes(2)?;
    let control_plane = ControlPlane::start(&mut lab, &cp_host, binaries)?;
    // Zoneless until kube-proxy listens for its zone: see `label_zones_once_kube_proxy_listens`.
    for node in &nodes {
        control_plane.register_labelled_node(&lab, node, &[])?;
    }
    control_plane.create_namespace(&lab, NAMESPACE)?;
    let dir = tempfile::tempdir()?;
    // node-1's own configuration for both; a node that is a network namespace cannot size the
    // machine's conntrack table, so maxPerCore is 0 (kind's setting).
    let config = dir.path().join("config.conf");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n\
             mode: {mode}\nclusterCIDR: 10.244.0.0/16\ndetectLocalMode: {detect_local}\n\
             bindAddress: {}\nclientConnection:\n  kubeconfig: {}\nconntrack:\n  maxPerCore: 0\n",
            nodes[0].ip(),
            control_plane.lan_admin_kubeconfig()?.display()
        ),
    )?;
    let config_flag = format!("--config={}", config.display());
    let hostname = format!("--hostname-override={NODE}");
    let kube_proxy = lab.spawn(&nodes[0], &kube_proxy, &[&config_flag, &hostname])?;
    label_zones_once_kube_proxy_listens(&lab, &control_plane, &nodes, &kube_proxy)?;
    control_plane.start_controller(&mut lab, &control_plane.admin_kubeconfig())?;
    // splitproxy's agent in node-2's namespace, as node-1 (its token is node-1's).
    let token = control_plane.agent_token(&lab, NODE)?;
    let mut agent_args = vec![
        config_flag.clone(),
        hostname.clone(),
        format!(
            "--controller={}",
            control_plane.controller_url(CONTROLLER_PORT)
        ),
        format!("--token-file={}", token.display()),
    ];
    agent_args.extend(control_plane.controller_tls().agent_flags());
    let agent_args: Vec<&str> = agent_args.iter().map(String::as_str).collect();
    let agent = lab.spawn(
        &nodes[1],
        workspace_binary("splitproxy-agent")?,
        &agent_args,
    )?;

    for &seed in seeds {
        let mut generator = Generator::new(seed);
        for round_number in 0..rounds {
            let round = generator.round(size);
            let started = std::time::Instant::now();
            apply(&lab, &control_plane, dir.path(), &round)?;
            let outcome = eventually(
                &format!("seed {seed} round {round_number}: the same rules on both nodes"),
                CONVERGE_TIMEOUT,
                || {
                    let Some(differences) = compare(&lab, &nodes, mode, &round.marker)? else {
                        bail!("a proxy has not programmed the round yet");
                    };
                    if !differences.is_empty() {
                        bail!("{}", differences.join("\n"));
                    }
                    // Once more after a pause: a sync may have been half-way.
                    std::thread::sleep(Duration::from_secs(2));
                    let Some(differences) = compare(&lab, &nodes, mode, &round.marker)? else {
                        bail!("the marker went away");
                    };
                    if differences.is_empty() {
                        Ok(())
                    } else {
                        bail!("{}", differences.join("\n"))
                    }
                },
            );
            if outcome.is_ok() {
                eprintln!(
                    "{mode}, {detect_local}: seed {seed} round {round_number}: {} Services, the same rules \
                     after {:.1} s",
                    generator.services(),
                    started.elapsed().as_secs_f64()
                );
            }
            if let Err(err) = outcome {
                return Err(err.context(format!(
                    "replay with SPLITPROXY_DIFF_SEEDS={seed} SPLITPROXY_DIFF_ROUNDS={rounds} \
                     SPLITPROXY_DIFF_SERVICES={size}\n--- kube-proxy\n{}\n--- splitproxy-agent\n{}",
                    kube_proxy.log_tail(20),
                    agent.log_tail(20)
                )));
            }
        }
        control_plane.kubectl(
            &lab,
            &["delete", "service,endpointslices", "--all", "-n", NAMESPACE],
        )?;
    }
    Ok(())
}
