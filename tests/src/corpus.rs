//! The hostile input corpus (`tests/corpus/`): one file per case, with what should become of it
//! in its `# expect:` comment lines (see `tests/corpus/README.md`).

use crate::{
    agent_metric,
    lab::{Lab, Node, Process},
};
use anyhow::{Context, Result, bail, ensure};
use std::{collections::BTreeMap, net::Ipv4Addr, path::PathBuf};

/// One expected outcome of a case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// The Service `namespace/name` (a prefix of it) is skipped, logged and counted as invalid.
    Invalid(String),
    /// The Service on this cluster IP, port 80, answers.
    Answers(Ipv4Addr),
    /// Nothing answers on this cluster IP, port 80.
    NoAnswer(Ipv4Addr),
    /// A controller log line holds this text.
    Log(String),
}

/// One corpus file.
#[derive(Debug, Clone)]
pub struct Case {
    /// The file name.
    pub file: String,
    /// The category: the file name up to `--`.
    pub category: String,
    /// The file's bytes, exactly (some are not UTF-8 on purpose).
    pub bytes: Vec<u8>,
    /// What should become of it.
    pub expects: Vec<Expect>,
    /// Whether the real API server admits it (its `# api:` line).
    pub api_admits: bool,
}

/// The corpus directory.
#[must_use]
pub fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus")
}

/// Every case of the corpus, by file name.
///
/// # Errors
///
/// If the directory cannot be read, or a file's name has no category or an `# expect:` line
/// does not parse.
pub fn load() -> Result<Vec<Case>> {
    let mut cases = Vec::new();
    for entry in std::fs::read_dir(dir()).context("reading tests/corpus")? {
        let path = entry.context("reading tests/corpus")?.path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let file = path
            .file_name()
            .and_then(|n| n.to_str())
            .context("corpus file name is not UTF-8")?
            .to_owned();
        let (category, _) = file
            .split_once("--")
            .with_context(|| format!("{file}: no `category--` prefix"))?;
        let bytes = std::fs::read(&path).with_context(|| format!("reading {file}"))?;
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let expects = text
            .lines()
            .filter_map(|line| line.strip_prefix("# expect: "))
            .map(|text| expect(text).with_context(|| format!("{file}: bad expectation")))
            .collect::<Result<_>>()?;
        let api_admits = match text.lines().find_map(|line| line.strip_prefix("# api: ")) {
            Some("admitted") => true,
            Some("refused") => false,
            other => bail!("{file}: `# api:` is {other:?}, not admitted or refused"),
        };
        cases.push(Case {
            category: category.to_owned(),
            file,
            bytes,
            expects,
            api_admits,
        });
    }
    cases.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(cases)
}

/// The number of cases per category, for the test's report.
#[must_use]
pub fn sizes(cases: &[Case]) -> BTreeMap<&str, usize> {
    let mut sizes = BTreeMap::new();
    for case in cases {
        *sizes.entry(case.category.as_str()).or_default() += 1;
    }
    sizes
}

/// Fails unless the agents on `nodes` were handed nothing to skip or reject (the controller
/// kept every bad object to itself) and every one of `processes` still runs.
///
/// # Errors
///
/// Naming the agent's counter that moved or the process that exited, with its log's tail.
pub fn expect_unharmed(lab: &mut Lab, nodes: &[Node], processes: &[Process]) -> Result<()> {
    for node in nodes {
        for series in [
            "splitproxy_agent_invalid_services",
            "splitproxy_agent_rejected_revisions_total",
        ] {
            let value = agent_metric(lab, node, series)?;
            ensure!(value == 0.0, "{}: {series} is {value}", node.name());
        }
    }
    for process in processes {
        let exit = lab.exit_status(process)?;
        ensure!(
            exit.is_none(),
            "{} exited: {exit:?}\n{}",
            process.log_path().display(),
            process.log_tail(30)
        );
    }
    Ok(())
}

fn expect(text: &str) -> Result<Expect> {
    let (kind, argument) = text.split_once(' ').unwrap_or((text, ""));
    let ip = || {
        argument
            .parse()
            .with_context(|| format!("{argument:?} is not an IPv4 address"))
    };
    Ok(match kind {
        "invalid" => Expect::Invalid(argument.to_owned()),
        "answers" => Expect::Answers(ip()?),
        "no-answer" => Expect::NoAnswer(ip()?),
        "log" => Expect::Log(argument.to_owned()),
        other => bail!("unknown expectation {other:?} (invalid, answers, no-answer, log)"),
    })
}
