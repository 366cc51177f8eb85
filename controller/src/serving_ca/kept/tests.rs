use super::*;

fn now() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// The contents after each step of a rollover from a steady CA: before, staged, switched,
/// finished, each read back from the Secret data it writes.
fn rollover() -> Vec<(Kept, Option<Step>)> {
    let mut steps = vec![(Kept::new(Ca::generate(now()).expect("a CA")), None)];
    for _ in 0..3 {
        let (last, _) = steps.last().expect("a step");
        let (next, step) = last.next_step(now()).expect("a step");
        let read = Kept::from_data(&next.to_data(), "ns/ca").expect("read back");
        steps.push((read, Some(step)));
    }
    steps
}

#[test]
fn a_rollover_stages_switches_and_finishes_and_each_step_reads_back() {
    let steps = rollover();
    let taken: Vec<Option<Step>> = steps.iter().map(|(_, step)| *step).collect();
    assert_eq!(
        taken,
        [
            None,
            Some(Step::Staged),
            Some(Step::Switched),
            Some(Step::Finished)
        ]
    );
    let rolling: Vec<bool> = steps.iter().map(|(kept, _)| kept.rolling_over()).collect();
    assert_eq!(rolling, [false, true, true, false]);
    let (first, last) = (&steps[0].0, &steps[3].0);
    assert_ne!(first.signing.cert_pem(), last.signing.cert_pem());
    assert_eq!(last.trust_bundle().matches("BEGIN CERTIFICATE").count(), 1);
    assert!(
        last.trust_bundle()
            .contains(last.signing.cert_pem().trim_end())
    );
    // The next rollover starts afresh.
    let (_, step) = last.next_step(now()).expect("a step");
    assert_eq!(step, Step::Staged);
}

/// Agents and certificate sidecars each see a step late or on time, never two steps apart (the
/// rollover waits between steps for that): whatever the pairing, the agent trusts the CA that
/// signed what the replica serves.
#[test]
fn an_agent_one_step_behind_or_ahead_trusts_every_replicas_signer() {
    let steps = rollover();
    for pair in steps.windows(2) {
        for agent in pair {
            for replica in pair {
                let bundle = agent.0.trust_bundle();
                let signer = replica.0.signing.cert_pem().trim_end();
                assert!(
                    bundle.contains(signer),
                    "an agent at {:?} does not trust a replica at {:?}",
                    agent.1,
                    replica.1
                );
            }
        }
    }
    // Two steps apart they would not: the waits are what keeps every agent connected.
    let (before, switched) = (&steps[0].0, &steps[2].0);
    assert!(
        !before
            .trust_bundle()
            .contains(switched.signing.cert_pem().trim_end())
    );
}

#[test]
fn a_secret_without_a_usable_ca_is_refused_by_name() {
    let kept = Kept::new(Ca::generate(now()).expect("a CA"));
    let mut data = kept.to_data();
    data.insert(PRIVATE_KEY_KEY.to_owned(), ByteString(b"junk".to_vec()));
    let err = Kept::from_data(&data, "ns/ca")
        .expect_err("unusable")
        .to_string();
    assert!(
        err.starts_with("Secret ns/ca (tls.crt, tls.key) is not"),
        "{err}"
    );
    data.remove(PRIVATE_KEY_KEY);
    let err = Kept::from_data(&data, "ns/ca")
        .expect_err("unusable")
        .to_string();
    assert!(err.ends_with("no tls.key"), "{err}");
    let err = Kept::from_data(&BTreeMap::new(), "ns/ca")
        .expect_err("unusable")
        .to_string();
    assert!(err.ends_with("no tls.crt"), "{err}");
}
