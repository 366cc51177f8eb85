//! Agent authentication: which node a stream's credential was issued for, so an agent receives
//! only its own node's view (see `docs/security.md`).
//!
//! The credential is a bearer token in the `authorization` metadata of the `Sync` call. With
//! the Kubernetes source it is a ServiceAccount token the kubelet bound to the agent's Pod, and
//! the API server itself says, through a TokenReview, whether it is valid and which node the
//! Pod runs on. With the manifests source, where there is no API server, a static file maps
//! tokens to nodes. Tokens never reach a log line: only their SHA-256 is kept.

use claims::Claims;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};
use std::{
    collections::HashMap,
    net::IpAddr,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};
use tonic::{Status, metadata::MetadataMap};

/// The TokenReview user-info key holding the node of the Pod a token is bound to (Kubernetes
/// 1.30+, `ServiceAccountTokenPodNodeInfo`).
const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
/// How long a successful review is reused. Reconnect storms (a controller replica going away)
/// then cost the API server one review per agent per window; a revoked token (its Pod deleted)
/// keeps working for new streams at most this long, as with the API server's own webhook cache.
const REVIEW_CACHE_TTL: Duration = Duration::from_secs(120);
/// Reviews kept at most; expired ones are dropped first, and all when still full.
const REVIEW_CACHE_LIMIT: usize = 20_000;

/// Who an authenticated agent is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The node whose view the agent may receive; `None` when agents are not authenticated.
    pub node: Option<String>,
    /// When the credential stops being valid; the stream is closed then, and the agent
    /// reconnects with its rotated token.
    pub expires: Option<SystemTime>,
}

impl Identity {
    /// Whether this identity may receive `node`'s view.
    ///
    /// # Errors
    ///
    /// [`Refusal::WrongNode`] when the credential belongs to another node.
    pub fn admit(&self, node: &str) -> Result<(), Refusal> {
        match &self.node {
            Some(own) if own != node => Err(Refusal::WrongNode {
                credential: own.clone(),
                requested: node.to_owned(),
            }),
            _ => Ok(()),
        }
    }
}

/// Why a stream was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The call carried no bearer token.
    #[error("no credential: send a bearer token in the authorization metadata")]
    Missing,
    /// The token is not valid (unknown, expired, revoked, wrong audience or account).
    #[error("credential refused: {0}")]
    Invalid(String),
    /// The token belongs to another node than the one subscribed.
    #[error("credential of node {credential:?} cannot receive the view of node {requested:?}")]
    WrongNode {
        /// The node the credential was issued for.
        credential: String,
        /// The node the agent subscribed as.
        requested: String,
    },
    /// The API server could not review the token; the agent should retry.
    #[error("cannot review the credential now: {0}")]
    Unavailable(String),
}

impl Refusal {
    /// A short, bounded label for the failures metric.
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Invalid(_) => "invalid",
            Self::WrongNode { .. } => "wrong_node",
            Self::Unavailable(_) => "unavailable",
        }
    }
}

impl From<Refusal> for Status {
    fn from(refusal: Refusal) -> Self {
        let message = refusal.to_string();
        match refusal {
            Refusal::Missing | Refusal::Invalid(_) => Status::unauthenticated(message),
            Refusal::WrongNode { .. } => Status::permission_denied(message),
            Refusal::Unavailable(_) => Status::unavailable(message),
        }
    }
}

/// How agents are authenticated.
#[derive(Clone)]
pub enum AgentAuth {
    /// Any agent may subscribe as any node. Only for a manifests source without a tokens file.
    Open,
    /// Tokens from a static file, each for one node.
    Static(Arc<StaticTokens>),
    /// Tokens reviewed by the API server.
    Review(Arc<TokenReviewer>),
}

impl std::fmt::Debug for AgentAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Open => "AgentAuth::Open",
            Self::Static(_) => "AgentAuth::Static",
            Self::Review(_) => "AgentAuth::Review",
        })
    }
}

impl AgentAuth {
    /// Authenticates the caller of a `Sync` from its request metadata.
    ///
    /// # Errors
    ///
    /// A [`Refusal`] saying why the caller is not let in.
    pub async fn authenticate(
        &self,
        metadata: &MetadataMap,
        peer: Option<IpAddr>,
    ) -> Result<Identity, Refusal> {
        match self {
            Self::Open => Ok(Identity {
                node: None,
                expires: None,
            }),
            Self::Static(tokens) => tokens.authenticate(bearer_token(metadata)?),
            Self::Review(reviewer) => reviewer.authenticate(bearer_token(metadata)?, peer).await,
        }
    }
}

/// The token of an `authorization: Bearer <token>` entry.
fn bearer_token(metadata: &MetadataMap) -> Result<&str, Refusal> {
    let value = metadata.get("authorization").ok_or(Refusal::Missing)?;
    let value = value
        .to_str()
        .map_err(|_| Refusal::Invalid("authorization metadata is not text".to_owned()))?;
    value
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|token| !token.is_empty())
        .ok_or_else(|| Refusal::Invalid("authorization metadata is not a bearer token".to_owned()))
}

/// A token's SHA-256: what is kept in memory instead of the token.
fn fingerprint(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Tokens read from a file of `token,node` lines (the shape of kube-apiserver's
/// `--token-auth-file`; `#` starts a comment). The file is read again when it has changed since
/// the last stream was opened, so tokens can be added, rotated and revoked without a restart; a
/// version that does not parse is reported and the last good one kept.
pub struct StaticTokens {
    path: std::path::PathBuf,
    loaded: Mutex<Loaded>,
}

/// The tokens of one version of the file.
struct Loaded {
    modified: Option<SystemTime>,
    nodes: HashMap<[u8; 32], String>,
}

/// Why a tokens file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokensFileError {
    /// The file cannot be read.
    #[error("reading {0}")]
    Read(String, #[source] std::io::Error),
    /// A line is not `token,node`.
    #[error("{file} line {line}: expected `token,node`")]
    Line {
        /// The file.
        file: String,
        /// The 1-based line number.
        line: usize,
    },
}

impl StaticTokens {
    /// Reads `path`.
    ///
    /// # Errors
    ///
    /// If the file cannot be read or a line is malformed (the line number is reported, never
    /// its content).
    pub fn read(path: &Path) -> Result<Self, TokensFileError> {
        let loaded = Self::load(path)?;
        Ok(Self {
            path: path.to_owned(),
            loaded: Mutex::new(loaded),
        })
    }

    fn load(path: &Path) -> Result<Loaded, TokensFileError> {
        let file = path.display().to_string();
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        let text =
            std::fs::read_to_string(path).map_err(|e| TokensFileError::Read(file.clone(), e))?;
        let nodes = parse(&text).map_err(|line| TokensFileError::Line { file, line })?;
        Ok(Loaded { modified, nodes })
    }

    /// How many tokens the file held when last read.
    #[must_use]
    pub fn len(&self) -> usize {
        self.loaded.lock().map_or(0, |loaded| loaded.nodes.len())
    }

    /// Whether the file held no token when last read.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn authenticate(&self, token: &str) -> Result<Identity, Refusal> {
        let mut loaded = self
            .loaded
            .lock()
            .map_err(|_| Refusal::Unavailable("tokens file state poisoned".to_owned()))?;
        let modified = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok();
        if modified != loaded.modified {
            match Self::load(&self.path) {
                Ok(fresh) => {
                    tracing::info!(tokens = fresh.nodes.len(), "agent tokens file reloaded");
                    *loaded = fresh;
                }
                Err(err) => {
                    tracing::warn!(error = %err, "keeping the last good agent tokens");
                    loaded.modified = modified;
                }
            }
        }
        let node = loaded
            .nodes
            .get(&fingerprint(token))
            .ok_or_else(|| Refusal::Invalid("unknown token".to_owned()))?;
        Ok(Identity {
            node: Some(node.clone()),
            expires: None,
        })
    }
}

/// Parses a tokens file's text; the error is the 1-based number of the first bad line.
fn parse(text: &str) -> Result<HashMap<[u8; 32], String>, usize> {
    let mut nodes = HashMap::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (token, node) = line.split_once(',').ok_or(index + 1)?;
        let (token, node) = (token.trim(), node.trim());
        if token.is_empty() || node.is_empty() || node.contains(',') {
            return Err(index + 1);
        }
        nodes.insert(fingerprint(token), node.to_owned());
    }
    Ok(nodes)
}

/// Reviews tokens with the API server (TokenReview), accepting only tokens of the agents'
/// ServiceAccount, for the agents' audience, bound to a Pod on a node. A token whose own claims
/// say it cannot be one is refused without a review, and reviews are throttled (see
/// [`throttle`]).
pub struct TokenReviewer {
    client: kube::Client,
    audience: String,
    /// `system:serviceaccount:<namespace>:<name>`.
    username: String,
    cache: Mutex<HashMap<[u8; 32], (Identity, SystemTime)>>,
    throttle: throttle::Throttle,
}

impl TokenReviewer {
    /// A reviewer accepting tokens of the ServiceAccount `namespace/name` issued for
    /// `audience`.
    #[must_use]
    pub fn new(client: kube::Client, audience: &str, namespace: &str, name: &str) -> Self {
        Self {
            client,
            audience: audience.to_owned(),
            username: format!("system:serviceaccount:{namespace}:{name}"),
            cache: Mutex::default(),
            throttle: throttle::Throttle::default(),
        }
    }

    async fn authenticate(&self, token: &str, peer: Option<IpAddr>) -> Result<Identity, Refusal> {
        let key = fingerprint(token);
        let now = SystemTime::now();
        if let Some(identity) = self.cached(&key, now) {
            return Ok(identity);
        }
        let claims = Claims::read(token)
            .ok_or_else(|| Refusal::Invalid("not a service account token".to_owned()))?;
        if let Some(why) = claims.mismatch(&self.username, &self.audience, now) {
            return Err(Refusal::Invalid(why));
        }
        if let Some(why) = self.throttle.refused_recently(&key) {
            return Err(Refusal::Invalid(why));
        }
        let reviewed = {
            let _slot = self.throttle.permit(peer).await?;
            self.review(token, claims.expires).await
        };
        let identity = match reviewed {
            Err(Refusal::Invalid(why)) => {
                self.throttle.remember_refusal(key, &why);
                return Err(Refusal::Invalid(why));
            }
            other => other?,
        };
        self.remember(key, &identity, now);
        Ok(identity)
    }

    fn cached(&self, key: &[u8; 32], now: SystemTime) -> Option<Identity> {
        let cache = self.cache.lock().ok()?;
        let (identity, reviewed_until) = cache.get(key)?;
        let valid = *reviewed_until > now && identity.expires.is_none_or(|e| e > now);
        valid.then(|| identity.clone())
    }

    fn remember(&self, key: [u8; 32], identity: &Identity, now: SystemTime) {
        let Ok(mut cache) = self.cache.lock() else {
            return;
        };
        if cache.len() >= REVIEW_CACHE_LIMIT {
            cache.retain(|_, (_, until)| *until > now);
            if cache.len() >= REVIEW_CACHE_LIMIT {
                cache.clear();
            }
        }
        cache.insert(key, (identity.clone(), now + REVIEW_CACHE_TTL));
    }

    /// The API server's review of `token`, which expires at `expires` by its own claims.
    async fn review(&self, token: &str, expires: Option<SystemTime>) -> Result<Identity, Refusal> {
        let request = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..TokenReview::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &request)
            .await
            .map_err(|err| Refusal::Unavailable(format!("TokenReview failed: {err}")))?;
        let status = reviewed.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            let why = status
                .error
                .unwrap_or_else(|| "not authenticated".to_owned());
            return Err(Refusal::Invalid(why));
        }
        if !status
            .audiences
            .as_ref()
            .is_some_and(|audiences| audiences.contains(&self.audience))
        {
            return Err(Refusal::Invalid(format!(
                "token is not for audience {:?}",
                self.audience
            )));
        }
        let user = status.user.unwrap_or_default();
        if user.username.as_deref() != Some(self.username.as_str()) {
            return Err(Refusal::Invalid(format!(
                "token belongs to {:?}, not {:?}",
                user.username.unwrap_or_default(),
                self.username
            )));
        }
        let node = user
            .extra
            .as_ref()
            .and_then(|extra| extra.get(NODE_NAME_EXTRA))
            .and_then(|values| values.first())
            .ok_or_else(|| Refusal::Invalid("token is not bound to a Pod on a node".to_owned()))?;
        Ok(Identity {
            node: Some(node.clone()),
            expires,
        })
    }
}

mod claims;
mod throttle;

#[cfg(test)]
mod tests;
