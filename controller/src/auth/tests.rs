use super::*;
use tonic::{Code, metadata::MetadataValue};

fn with_authorization(value: &str) -> MetadataMap {
    let mut metadata = MetadataMap::new();
    metadata.insert(
        "authorization",
        MetadataValue::try_from(value).expect("ascii value"),
    );
    metadata
}

/// Static tokens from a file holding `text`; the file lives as long as the returned guard.
fn tokens(text: &str) -> (AgentAuth, tempfile::NamedTempFile) {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), text).expect("write");
    let tokens = StaticTokens::read(file.path()).expect("valid file");
    (AgentAuth::Static(Arc::new(tokens)), file)
}

#[tokio::test]
async fn static_token_identifies_its_node() {
    let (auth, _file) = tokens("# node tokens\nsecret-a,node-a\n\nsecret-b, node-b\n");
    let identity = auth
        .authenticate(&with_authorization("Bearer secret-b"), None)
        .await
        .expect("known token");
    assert_eq!(identity.node.as_deref(), Some("node-b"));
    assert_eq!(identity.admit("node-b"), Ok(()));
    assert!(matches!(
        identity.admit("node-a"),
        Err(Refusal::WrongNode { .. })
    ));
}

#[tokio::test]
async fn missing_unknown_and_malformed_credentials_are_refused() {
    let (auth, _file) = tokens("secret-a,node-a\n");
    let refusal = |metadata: MetadataMap| {
        let auth = auth.clone();
        async move {
            auth.authenticate(&metadata, None)
                .await
                .expect_err("refused")
        }
    };
    assert_eq!(refusal(MetadataMap::new()).await, Refusal::Missing);
    assert!(matches!(
        refusal(with_authorization("Bearer secret-x")).await,
        Refusal::Invalid(_)
    ));
    assert!(matches!(
        refusal(with_authorization("Basic c2VjcmV0")).await,
        Refusal::Invalid(_)
    ));
    assert!(matches!(
        refusal(with_authorization("Bearer ")).await,
        Refusal::Invalid(_)
    ));
}

#[tokio::test]
async fn refusals_never_echo_the_token() {
    let (auth, _file) = tokens("secret-a,node-a\n");
    let refusal = auth
        .authenticate(&with_authorization("Bearer secret-zzz"), None)
        .await
        .expect_err("unknown");
    assert!(!refusal.to_string().contains("secret-zzz"));
}

#[tokio::test]
async fn a_changed_tokens_file_applies_to_the_next_stream_and_a_broken_one_is_ignored() {
    let (auth, file) = tokens("old-token,node-a\n");
    let write = |text: &str| {
        // A later modification time than the first version's, whatever the clock granularity.
        let previous = std::fs::metadata(file.path())
            .and_then(|m| m.modified())
            .expect("mtime");
        std::fs::write(file.path(), text).expect("write");
        let f = std::fs::File::options()
            .write(true)
            .open(file.path())
            .expect("open");
        f.set_modified(previous + Duration::from_secs(1))
            .expect("set mtime");
    };
    write("new-token,node-b\n");
    let identity = auth
        .authenticate(&with_authorization("Bearer new-token"), None)
        .await
        .expect("added token");
    assert_eq!(identity.node.as_deref(), Some("node-b"));
    assert!(
        auth.authenticate(&with_authorization("Bearer old-token"), None)
            .await
            .is_err(),
        "a removed token is revoked"
    );
    write("broken line\n");
    assert!(
        auth.authenticate(&with_authorization("Bearer new-token"), None)
            .await
            .is_ok(),
        "the last good file stays in force"
    );
}

#[test]
fn refusals_map_to_grpc_codes() {
    assert_eq!(Status::from(Refusal::Missing).code(), Code::Unauthenticated);
    assert_eq!(
        Status::from(Refusal::Invalid("expired".to_owned())).code(),
        Code::Unauthenticated
    );
    let wrong = Refusal::WrongNode {
        credential: "a".to_owned(),
        requested: "b".to_owned(),
    };
    assert_eq!(wrong.reason(), "wrong_node");
    assert_eq!(Status::from(wrong).code(), Code::PermissionDenied);
    assert_eq!(
        Status::from(Refusal::Unavailable("down".to_owned())).code(),
        Code::Unavailable
    );
}

#[test]
fn tokens_file_errors_name_the_line_not_the_secret() {
    assert_eq!(parse("ok,node\nno-comma-secret\n").err(), Some(2));
    assert_eq!(parse(",node\n").err(), Some(1));
    assert_eq!(parse("t,a,b\n").err(), Some(1));
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), "good,node\nleaky-secret\n").expect("write");
    let err = StaticTokens::read(file.path()).err().expect("bad line");
    assert!(err.to_string().contains("line 2"), "{err}");
    assert!(!err.to_string().contains("leaky-secret"), "{err}");
}

#[test]
fn open_identity_admits_any_node() {
    let identity = Identity {
        node: None,
        expires: None,
    };
    assert_eq!(identity.admit("anything"), Ok(()));
}
