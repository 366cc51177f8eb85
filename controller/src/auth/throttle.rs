//! How much of the API server one peer's credentials may take: every review the controller asks
//! for runs under the controller's own API Priority and Fairness level, beside its watches, so
//! reviews are limited in flight, in rate overall and in rate per peer address, and a credential
//! the API server refused is refused again without asking for a while, as `k8s.io/apiserver`'s
//! delegating authenticator caches failures too.

use super::Refusal;
use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};
use tokio::sync::{Semaphore, SemaphorePermit};

/// Reviews in flight at once.
const MAX_IN_FLIGHT: usize = 8;
/// How long a review waits for a slot before the stream is refused as unavailable (the agent
/// retries with its back-off).
const SLOT_WAIT: Duration = Duration::from_secs(5);
/// Reviews per second overall, and the burst above it: a controller replica's restart sends
/// every agent of a 5,000-node cluster to the other replicas within seconds.
const OVERALL: Rate = Rate {
    per_second: 200.0,
    burst: 1000.0,
};
/// Reviews per second from one address, and the burst: an agent needs one per stream whose
/// token is not cached.
const PER_ADDRESS: Rate = Rate {
    per_second: 1.0,
    burst: 5.0,
};
/// How long a refused credential is refused without a review.
const REFUSED_FOR: Duration = Duration::from_secs(10);
/// Refused credentials and addresses remembered at most; the oldest entries are dropped first.
const REMEMBERED: usize = 20_000;

/// A token bucket's rate.
#[derive(Debug, Clone, Copy)]
struct Rate {
    per_second: f64,
    burst: f64,
}

/// A token bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(rate: Rate, now: Instant) -> Self {
        Self {
            tokens: rate.burst,
            at: now,
        }
    }

    /// Takes a token if one is there at `now`.
    fn take(&mut self, rate: Rate, now: Instant) -> bool {
        let refill = now.saturating_duration_since(self.at).as_secs_f64() * rate.per_second;
        self.tokens = (self.tokens + refill).min(rate.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The limits on reviews.
#[derive(Debug)]
pub struct Throttle {
    in_flight: Semaphore,
    overall: Mutex<Bucket>,
    per_address: Mutex<HashMap<IpAddr, Bucket>>,
    refused: Mutex<HashMap<[u8; 32], (Instant, String)>>,
}

impl Default for Throttle {
    fn default() -> Self {
        let now = Instant::now();
        Self {
            in_flight: Semaphore::new(MAX_IN_FLIGHT),
            overall: Mutex::new(Bucket::full(OVERALL, now)),
            per_address: Mutex::default(),
            refused: Mutex::default(),
        }
    }
}

impl Throttle {
    /// Why the credential with fingerprint `key` was refused, if it was within
    /// [`REFUSED_FOR`].
    pub fn refused_recently(&self, key: &[u8; 32]) -> Option<String> {
        let refused = lock(&self.refused);
        let (at, why) = refused.get(key)?;
        (at.elapsed() < REFUSED_FOR).then(|| why.clone())
    }

    /// Remembers that the API server refused the credential with fingerprint `key`.
    pub fn remember_refusal(&self, key: [u8; 32], why: &str) {
        let mut refused = lock(&self.refused);
        if refused.len() >= REMEMBERED {
            refused.retain(|_, (at, _)| at.elapsed() < REFUSED_FOR);
            if refused.len() >= REMEMBERED {
                refused.clear();
            }
        }
        refused.insert(key, (Instant::now(), why.to_owned()));
    }

    /// Leave to ask the API server for one review for a peer at `address`: a slot among those in
    /// flight, held until dropped.
    ///
    /// # Errors
    ///
    /// [`Refusal::Unavailable`] when the address or the controller asked for too many reviews
    /// lately, or no slot frees up in time.
    pub async fn permit(&self, address: Option<IpAddr>) -> Result<SemaphorePermit<'_>, Refusal> {
        let now = Instant::now();
        if let Some(address) = address {
            let mut buckets = lock(&self.per_address);
            if buckets.len() >= REMEMBERED && !buckets.contains_key(&address) {
                // Buckets full again after a while are the same as new ones.
                let idle = Duration::from_secs_f64(PER_ADDRESS.burst / PER_ADDRESS.per_second);
                buckets.retain(|_, bucket| now.saturating_duration_since(bucket.at) < idle);
                if buckets.len() >= REMEMBERED {
                    buckets.clear();
                }
            }
            let bucket = buckets
                .entry(address)
                .or_insert_with(|| Bucket::full(PER_ADDRESS, now));
            if !bucket.take(PER_ADDRESS, now) {
                return Err(Refusal::Unavailable(
                    "too many credentials from this address to review; retry later".to_owned(),
                ));
            }
        }
        if !lock(&self.overall).take(OVERALL, now) {
            return Err(Refusal::Unavailable(
                "too many credentials to review; retry later".to_owned(),
            ));
        }
        match tokio::time::timeout(SLOT_WAIT, self.in_flight.acquire()).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(Refusal::Unavailable(
                "the API server is slow to review credentials; retry later".to_owned(),
            )),
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every write leaves the maps consistent.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
