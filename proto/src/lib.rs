//! Generated types and gRPC services of the splitproxy protocol (`proto/splitproxy/v1alpha1`).

pub mod names;
pub mod pieces;
pub mod topology;

/// A namespaced resource's key, `(namespace, name)`, as the controller and the agent key their
/// views (the wire's `ObjectKey`; the dataplane's model has its own `ServiceKey`).
pub type Key = (String, String);

/// Version `v1alpha1` of the protocol.
pub mod v1alpha1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("splitproxy.v1alpha1");
}

/// The digest of one resource as `ResourceDigest.sha256_prefix` defines it: the first 8 bytes,
/// big-endian, of the SHA-256 of its protobuf encoding. Encodings are deterministic (protocol rule
/// 8), so an agent and any controller replica compute the same digest for the same content.
#[must_use]
pub fn digest(resource: &impl prost::Message) -> u64 {
    digest_of_encoding(&resource.encode_to_vec())
}

/// [`digest`] of a resource already encoded, for clients that keep the bytes as received.
#[must_use]
pub fn digest_of_encoding(encoded: &[u8]) -> u64 {
    use sha2::{Digest, Sha256};
    let hash = Sha256::digest(encoded);
    let mut prefix = [0u8; 8];
    prefix.copy_from_slice(&hash[..8]);
    u64::from_be_bytes(prefix)
}

/// The gRPC metadata in which a controller that refuses a stream says how many milliseconds to wait
/// before subscribing again (protocol rule 10).
pub const RETRY_AFTER_MS: &str = "splitproxy-retry-after-ms";

/// How long a controller that refused a stream asked to be left alone: an `UNAVAILABLE` status
/// carrying [`RETRY_AFTER_MS`]. Any other status, or a value that is not a number, says nothing.
#[must_use]
pub fn retry_after(status: &tonic::Status) -> Option<std::time::Duration> {
    if status.code() != tonic::Code::Unavailable {
        return None;
    }
    let millis = status.metadata().get(RETRY_AFTER_MS)?.to_str().ok()?;
    Some(std::time::Duration::from_millis(millis.parse().ok()?))
}

/// The response header with which a controller says it reads a `HeldSummary` (protocol rule 11).
pub const READS_SUMMARY: &str = "splitproxy-reads-summary";

/// How many buckets agents sum their digests in (protocol rule 11): 32 KiB of sums, and each
/// resource changed while an agent was away costs its resume about 1/4096 of its view.
pub const SUMMARY_BUCKETS: usize = 4096;

/// The most buckets a summary may have (protocol rule 11): 512 KiB of sums.
pub const MAX_SUMMARY_BUCKETS: usize = 1 << 16;

/// The bucket of the resource keyed (`namespace`, `name`) among `buckets` (a power of two):
/// FNV-1a, 32 bits, over `namespace`, `/` and `name` (protocol rule 11).
#[must_use]
pub fn bucket_of(namespace: &str, name: &str, buckets: usize) -> usize {
    const OFFSET: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    let bytes = namespace.bytes().chain(*b"/").chain(name.bytes());
    let hash = bytes.fold(OFFSET, |hash, byte| {
        (hash ^ u32::from(byte)).wrapping_mul(PRIME)
    });
    hash as usize & (buckets - 1)
}

/// A set of summary buckets (protocol rule 11), to test resources' keys against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketSet(Vec<bool>);

impl BucketSet {
    /// No buckets, out of `buckets` (a power of two up to [`MAX_SUMMARY_BUCKETS`]); `None` for
    /// any other number.
    #[must_use]
    pub fn empty(buckets: usize) -> Option<Self> {
        (buckets.is_power_of_two() && buckets <= MAX_SUMMARY_BUCKETS)
            .then(|| Self(vec![false; buckets]))
    }

    /// Adds `bucket`; one past the count is ignored.
    pub fn insert(&mut self, bucket: u32) {
        if let Some(flag) = self.0.get_mut(bucket as usize) {
            *flag = true;
        }
    }

    /// Whether the resource keyed (`namespace`, `name`) is in one of the buckets.
    #[must_use]
    pub fn contains(&self, namespace: &str, name: &str) -> bool {
        self.holds(bucket_of(namespace, name, self.0.len()))
    }

    /// Whether `bucket` is in the set, for a caller that has its keys' buckets already.
    #[must_use]
    pub fn holds(&self, bucket: usize) -> bool {
        self.0.get(bucket).copied().unwrap_or(false)
    }

    /// How many buckets the set is out of.
    #[must_use]
    pub fn bucket_count(&self) -> usize {
        self.0.len()
    }
}

impl v1alpha1::ReplacedBuckets {
    /// The buckets replaced, as a set; `None` when `bucket_count` is not a power of two up to
    /// [`MAX_SUMMARY_BUCKETS`].
    #[must_use]
    pub fn to_set(&self) -> Option<BucketSet> {
        let mut set = BucketSet::empty(usize::try_from(self.bucket_count).ok()?)?;
        for &bucket in &self.buckets {
            set.insert(bucket);
        }
        Some(set)
    }
}

impl v1alpha1::HeldSummary {
    /// An empty summary over `buckets` buckets (a power of two).
    #[must_use]
    pub fn with_buckets(buckets: usize) -> Self {
        Self {
            bucket_sums: vec![0; buckets],
        }
    }

    /// Adds the resource keyed (`namespace`, `name`) with `digest` to its bucket's sum.
    pub fn add(&mut self, namespace: &str, name: &str, digest: u64) {
        let bucket = bucket_of(namespace, name, self.bucket_sums.len());
        if let Some(sum) = self.bucket_sums.get_mut(bucket) {
            *sum = sum.wrapping_add(digest);
        }
    }
}

/// The encoded `FileDescriptorSet` of every protocol file, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptor.bin"));

/// gRPC reflection for every protocol file and `grpc.health.v1`, in both reflection versions, so
/// old and new grpcurl releases can list and call the services.
///
/// # Errors
///
/// Fails only if the embedded descriptor sets do not decode.
pub fn reflection_services() -> Result<
    (
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    ),
    tonic_reflection::server::Error,
> {
    let builder = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_fnv_1a_of_the_namespaced_name() {
        // FNV-1a 32 of "foo/bar" and "default/kubernetes", computed apart from this code.
        assert_eq!(bucket_of("foo", "bar", 1 << 32), 0xc7a7_1bed);
        assert_eq!(bucket_of("default", "kubernetes", 1 << 32), 0x56ae_3fb7);
        assert_eq!(bucket_of("default", "kubernetes", 1024), 0x3b7);
    }
}
