//! Compiles the `.proto` files with protox (no system protoc) and keeps the descriptor set for
//! gRPC reflection.

use prost::Message;
use std::{env, fs, path::PathBuf};

const FILES: &[&str] = &[
    "splitproxy/v1alpha1/view.proto",
    "splitproxy/v1alpha1/inspection.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for file in FILES {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(FILES, ["."])?;
    let out = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out.join("descriptor.bin"), descriptors.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
