//! Generated types and gRPC services of the splitproxy protocol (`proto/splitproxy/v1alpha1`).

pub mod names;

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

/// The trailer with which a controller that found an agent's summary different from the node's
/// view asks for every digest (protocol rule 11).
pub const SEND_DIGESTS: &str = "splitproxy-send-digests";

/// Whether a controller ended a stream asking for every digest in place of a summary.
#[must_use]
pub fn wants_digests(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::FailedPrecondition && status.metadata().contains_key(SEND_DIGESTS)
}

impl v1alpha1::HeldSummary {
    /// Counts one Service with `digest`.
    pub fn add_service(&mut self, digest: u64) {
        self.service_count += 1;
        self.service_digest_sum = self.service_digest_sum.wrapping_add(digest);
    }

    /// Counts one endpoint set with `digest`.
    pub fn add_endpoints(&mut self, digest: u64) {
        self.endpoints_count += 1;
        self.endpoints_digest_sum = self.endpoints_digest_sum.wrapping_add(digest);
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
