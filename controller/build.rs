//! Declares the node view service's server by hand, so that its responses are the controller's
//! own `wire::SyncResponse`, whose resources are encoded once per cluster state and shared by
//! every node's messages, instead of the generated message that each node would encode again.
//! The bytes on the wire are those of `splitproxy.v1alpha1.SyncResponse`.

use tonic_prost_build::manual::{Builder, Method, Service};

fn main() {
    // Only this script decides what is generated; without this, any file of the crate reruns it.
    println!("cargo:rerun-if-changed=build.rs");
    let sync = Method::builder()
        .name("sync")
        .route_name("Sync")
        .input_type("splitproxy_proto::v1alpha1::SyncRequest")
        .output_type("crate::wire::SyncResponse")
        .codec_path("tonic_prost::ProstCodec")
        .client_streaming()
        .server_streaming()
        .build();
    let service = Service::builder()
        .name("NodeViewService")
        .package("splitproxy.v1alpha1")
        .method(sync)
        .build();
    Builder::new().build_client(false).compile(&[service]);
}
