//! Compiles `proto/ricochet/v1/*.proto` with `protox` (a pure-Rust protobuf
//! compiler), so building needs no system `protoc`.
//!
//! Two passes over the same descriptors: the messages and the servers, whose
//! codec is `ricochet_proto::codec::RequestCodec` (an undecodable request is
//! INVALID_ARGUMENT); then the clients alone, into `OUT_DIR/client`, with
//! tonic's codec and the messages of the first pass. The file descriptor set
//! is written to `OUT_DIR/ricochet_descriptor.bin` (`FILE_DESCRIPTOR_SET`).
//!
//! Only Ricochet's public API is compiled here, so every crate that speaks
//! it (the client above all) compiles nothing else: the etcd v3 subset is
//! compiled by `ricochet-cluster` (`cluster/build.rs`) and the Raft RPCs
//! between brokers by `ricochet-replication` (`replication/build.rs`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/ricochet/v1/messages.proto",
        "proto/ricochet/v1/broker.proto",
        "proto/ricochet/v1/admin.proto",
        "proto/ricochet/v1/partitions.proto",
        "proto/ricochet/v1/auth.proto",
        "proto/ricochet/v1/retention.proto",
        "proto/ricochet/v1/cluster.proto",
        "proto/ricochet/v1/tiered.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    // The descriptors themselves, so tests can enumerate every RPC.
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("ricochet_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(false)
        .codec_path("crate::codec::RequestCodec")
        .compile_fds(fds.clone())?;
    let client_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("client");
    std::fs::create_dir_all(&client_dir)?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .extern_path(".ricochet.v1", "crate::v1")
        .out_dir(client_dir)
        .compile_fds(fds)?;
    Ok(())
}
