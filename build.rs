//! Compiles `proto/gyre/v1/*.proto` with protox (pure Rust: no system protoc)
//! and generates the prost messages and tonic client/server code, plus the
//! encoded file descriptor set that server reflection serves. The generated
//! code uses `proto/codec.rs`'s codec.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/gyre/v1/generate.proto",
        "proto/gyre/v1/embeddings.proto",
        "proto/gyre/v1/responses.proto",
        "proto/gyre/v1/admin.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    let fds = protox::compile(protos, ["proto"])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("gyre_v1_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    // Every method decodes with gyre's codec: malformed messages are
    // INVALID_ARGUMENT rather than tonic-prost's INTERNAL (see proto/codec.rs).
    tonic_prost_build::configure()
        .codec_path("crate::codec::GyreCodec")
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
