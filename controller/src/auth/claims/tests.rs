use super::*;

fn token(payload: &str) -> String {
    let payload = data_encoding::BASE64URL_NOPAD.encode(payload.as_bytes());
    format!("eyJhbGciOiJSUzI1NiJ9.{payload}.c2ln")
}

const AGENT: &str = "system:serviceaccount:splitproxy:agent";
const EXP: u64 = 1_700_000_000;

fn at(seconds: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
}

#[test]
fn a_service_account_tokens_subject_audiences_and_expiry_are_read() {
    let claims = Claims::read(&token(&format!(
        r#"{{"sub":"{AGENT}","aud":["splitproxy","x"],"exp":{EXP}}}"#
    )))
    .expect("claims");
    assert_eq!(claims.subject, AGENT);
    assert_eq!(claims.audiences, ["splitproxy", "x"]);
    assert_eq!(claims.expires, Some(at(EXP)));
    assert_eq!(claims.mismatch(AGENT, "splitproxy", at(EXP - 1)), None);

    let one = Claims::read(&token(&format!(
        r#"{{"sub":"{AGENT}","aud":"splitproxy"}}"#
    )));
    assert_eq!(
        one.map(|c| c.audiences),
        Some(vec!["splitproxy".to_owned()])
    );
}

#[test]
fn what_cannot_be_an_agents_token_is_told_without_the_api_server() {
    for not_a_jwt in ["", "random", "a.b", "a.b.c.d", "a.!!!.c", &token("[1,2]")] {
        assert_eq!(Claims::read(not_a_jwt), None, "{not_a_jwt:?}");
    }
    let claims = |payload: &str| Claims::read(&token(payload)).expect("claims");
    let now = at(EXP - 1);
    let other_account = claims(&format!(
        r#"{{"sub":"system:serviceaccount:x:y","aud":"splitproxy","exp":{EXP}}}"#
    ));
    let other_audience = claims(&format!(r#"{{"sub":"{AGENT}","aud":"api","exp":{EXP}}}"#));
    let expired = claims(&format!(
        r#"{{"sub":"{AGENT}","aud":"splitproxy","exp":{}}}"#,
        EXP - 5
    ));
    let no_expiry = claims(&format!(r#"{{"sub":"{AGENT}","aud":"splitproxy"}}"#));
    for claims in [other_account, other_audience, expired, no_expiry] {
        assert!(
            claims.mismatch(AGENT, "splitproxy", now).is_some(),
            "{claims:?}"
        );
    }
}
