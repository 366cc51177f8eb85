//! The container images' own promises: `scripts/images.sh` makes the same bytes twice, in the OCI
//! image layout under the names `deploy/` uses and with the documented users; and the agent
//! image's iptables wrapper sends every call to the iptables variant the node uses, as
//! Kubernetes' iptables images choose it. Needs root (the wrapper runs in lab namespaces).

use anyhow::{Context, Result, ensure};
use serde_json::Value;
use splitproxy_e2e::lab::Lab;
use std::{
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative)
}

/// Runs `scripts/images.sh --tag test --output out`.
fn build_images(out: &Path) -> Result<()> {
    let status = Command::new(repo_path("scripts/images.sh"))
        .args(["--tag", "test", "--output"])
        .arg(out)
        .status()
        .context("running scripts/images.sh")?;
    ensure!(status.success(), "scripts/images.sh failed with {status}");
    Ok(())
}

/// The file `name` inside the tar `archive`.
fn member(archive: &Path, name: &str) -> Result<Vec<u8>> {
    let output = Command::new("tar")
        .arg("-xOf")
        .arg(archive)
        .arg(name)
        .output()
        .context("running tar")?;
    ensure!(
        output.status.success(),
        "no {name} in {}",
        archive.display()
    );
    Ok(output.stdout)
}

/// The blob of `digest` (`sha256:…`) in the OCI archive, as JSON.
fn blob(archive: &Path, digest: &str) -> Result<Value> {
    let hex = digest.strip_prefix("sha256:").context("a sha256 digest")?;
    Ok(serde_json::from_slice(&member(
        archive,
        &format!("blobs/sha256/{hex}"),
    )?)?)
}

#[test]
fn images_are_reproducible_oci_archives_with_deploys_names_and_users() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (first, second) = (dir.path().join("first"), dir.path().join("second"));
    build_images(&first)?;
    build_images(&second)?;
    for (name, user) in [
        ("splitproxy-agent", "0:0"),
        ("splitproxy-controller", "65532:65532"),
    ] {
        let archive = first.join(format!("{name}.tar"));
        let bytes = std::fs::read(&archive)?;
        ensure!(
            bytes == std::fs::read(second.join(format!("{name}.tar")))?,
            "{name}: two builds of the same tree differ"
        );
        let layout: Value = serde_json::from_slice(&member(&archive, "oci-layout")?)?;
        ensure!(layout["imageLayoutVersion"] == "1.0.0", "{name}: {layout}");
        let index: Value = serde_json::from_slice(&member(&archive, "index.json")?)?;
        let entry = &index["manifests"][0];
        let reference = format!("localhost/splitproxy/{}:test", &name["splitproxy-".len()..]);
        ensure!(
            entry["annotations"]["io.containerd.image.name"] == reference.as_str()
                && entry["annotations"]["org.opencontainers.image.ref.name"] == reference.as_str(),
            "{name}: named {}",
            entry["annotations"]
        );
        let manifest = blob(&archive, entry["digest"].as_str().context("a digest")?)?;
        let config = blob(
            &archive,
            manifest["config"]["digest"].as_str().context("a digest")?,
        )?;
        ensure!(
            config["config"]["User"] == user,
            "{name}: runs as {}",
            config["config"]["User"]
        );
        ensure!(
            config["created"] == commit_time()?,
            "{name}: created {}",
            config["created"]
        );
    }
    Ok(())
}

/// The instant every time in the images is: the last commit's.
fn commit_time() -> Result<String> {
    let output = Command::new("git")
        .args([
            "log",
            "-1",
            "--format=%cd",
            "--date=format-local:%Y-%m-%dT%H:%M:%SZ",
        ])
        .env("TZ", "UTC")
        .current_dir(repo_path(""))
        .output()
        .context("running git")?;
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// A folder with `iptables`, `iptables-save` and `iptables-restore` linked to the wrapper, as
/// in the agent image, and the file its choice is kept in.
struct Wrapper {
    dir: tempfile::TempDir,
}

impl Wrapper {
    fn new() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        for tool in ["iptables", "iptables-save", "iptables-restore"] {
            symlink(
                repo_path("deploy/images/iptables-wrapper"),
                dir.path().join(tool),
            )?;
        }
        Ok(Self { dir })
    }

    /// Runs `tool args` through the wrapper in `ns`.
    fn run(&self, lab: &Lab, ns: &str, tool: &str, args: &[&str]) -> Result<String> {
        let choice = format!(
            "SPLITPROXY_IPTABLES_VARIANT_FILE={}",
            self.dir.path().join("choice").display()
        );
        let tool = self.dir.path().join(tool);
        let mut all = vec![choice.as_str(), tool.to_str().context("a UTF-8 path")?];
        all.extend_from_slice(args);
        lab.exec_ok(ns, "env", &all)
    }

    fn choice(&self) -> Result<String> {
        Ok(std::fs::read_to_string(self.dir.path().join("choice"))?
            .trim()
            .to_owned())
    }
}

/// In a fresh namespace prepared by `prepare` (commands run there as given), the wrapper
/// chooses `expected`, and a chain it creates lands in that variant only.
fn wrapper_chooses(lab: &mut Lab, name: &str, prepare: &[&[&str]], expected: &str) -> Result<()> {
    let ns = lab.add_namespace(name)?;
    for command in prepare {
        lab.exec_ok(ns.as_str(), command[0], &command[1..])?;
    }
    let wrapper = Wrapper::new()?;
    wrapper.run(
        lab,
        &ns,
        "iptables",
        &["-t", "filter", "-N", "WRAPPER-PROBE"],
    )?;
    ensure!(
        wrapper.choice()? == expected,
        "{name}: chose {}",
        wrapper.choice()?
    );
    let other = if expected == "nft" { "legacy" } else { "nft" };
    let in_expected = lab.exec_ok(ns.as_str(), format!("iptables-{expected}-save"), &[])?;
    let in_other = lab.exec_ok(ns.as_str(), format!("iptables-{other}-save"), &[])?;
    ensure!(
        in_expected.contains(":WRAPPER-PROBE") && !in_other.contains(":WRAPPER-PROBE"),
        "{name}: the probe chain is not only in {expected}"
    );
    // Later calls follow the choice, including the save and restore tools.
    let saved = wrapper.run(lab, &ns, "iptables-save", &["-t", "filter"])?;
    ensure!(
        saved.contains(":WRAPPER-PROBE"),
        "{name}: iptables-save saw {saved}"
    );
    Ok(())
}

#[test]
fn the_iptables_wrapper_follows_the_nodes_variant() -> Result<()> {
    let mut lab = Lab::new("img")?;
    // A node where nothing has written rules yet: nft, as upstream's wrapper.
    wrapper_chooses(&mut lab, "empty", &[], "nft")?;
    // The kubelet's marker chain in the legacy tables, even with more nft rules.
    wrapper_chooses(
        &mut lab,
        "legacy-hint",
        &[
            &[
                "iptables-legacy",
                "-t",
                "mangle",
                "-N",
                "KUBE-IPTABLES-HINT",
            ],
            &["iptables-nft", "-A", "INPUT", "-j", "ACCEPT"],
            &["iptables-nft", "-A", "INPUT", "-j", "ACCEPT"],
        ],
        "legacy",
    )?;
    // The marker in nft, more rules in legacy: the marker wins.
    wrapper_chooses(
        &mut lab,
        "nft-hint",
        &[
            &["iptables-nft", "-t", "mangle", "-N", "KUBE-KUBELET-CANARY"],
            &["iptables-legacy", "-A", "INPUT", "-j", "ACCEPT"],
        ],
        "nft",
    )?;
    // No marker anywhere: the variant holding more rules.
    wrapper_chooses(
        &mut lab,
        "legacy-rules",
        &[&["iptables-legacy", "-A", "INPUT", "-j", "ACCEPT"]],
        "legacy",
    )?;
    Ok(())
}
