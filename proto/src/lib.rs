//! Generated types and gRPC services of the splitproxy protocol (`proto/splitproxy/v1alpha1`).

/// Version `v1alpha1` of the protocol.
pub mod v1alpha1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("splitproxy.v1alpha1");
}

/// The encoded `FileDescriptorSet` of every protocol file, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptor.bin"));
