//! What a ServiceAccount token says of itself, read without verifying it: enough to refuse,
//! before asking the API server, a token that cannot be an agent's (not a JWT, for another
//! audience or account, expired). Only the API server's review lets a token in.

use std::time::{Duration, SystemTime};

/// The claims of a JWT that the agents' tokens are checked on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// `sub`: `system:serviceaccount:<namespace>:<name>` for a ServiceAccount token.
    pub subject: String,
    /// `aud`, a string or a list.
    pub audiences: Vec<String>,
    /// `exp`.
    pub expires: Option<SystemTime>,
}

impl Claims {
    /// The claims of `token`; `None` when it is not a JWT with a JSON payload.
    #[must_use]
    pub fn read(token: &str) -> Option<Self> {
        let mut parts = token.split('.');
        let (Some(_header), Some(payload), Some(_signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let bytes = data_encoding::BASE64URL_NOPAD
            .decode(payload.trim_end_matches('=').as_bytes())
            .ok()?;
        let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
        let audiences = match claims.get("aud") {
            Some(serde_json::Value::String(one)) => vec![one.clone()],
            Some(serde_json::Value::Array(many)) => many
                .iter()
                .filter_map(|a| a.as_str().map(str::to_owned))
                .collect(),
            _ => Vec::new(),
        };
        let expires = (claims.get("exp").and_then(serde_json::Value::as_u64))
            .and_then(|exp| SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(exp)));
        Some(Self {
            subject: claims.get("sub")?.as_str()?.to_owned(),
            audiences,
            expires,
        })
    }

    /// Why a token with these claims cannot be one of `username`'s for `audience` at `now`;
    /// `None` when it may be, for the API server to say.
    #[must_use]
    pub fn mismatch(&self, username: &str, audience: &str, now: SystemTime) -> Option<String> {
        if self.subject != username {
            return Some(format!("token is not {username:?}'s"));
        }
        if !self.audiences.iter().any(|a| a == audience) {
            return Some(format!("token is not for audience {audience:?}"));
        }
        if self.expires.is_none_or(|expires| expires <= now) {
            return Some("token expired or without an expiry".to_owned());
        }
        None
    }
}

#[cfg(test)]
mod tests;
