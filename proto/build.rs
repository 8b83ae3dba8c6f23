//! Compiles `proto/ricochet/v1/*.proto` with `protox` (a pure-Rust protobuf
//! compiler), so building needs no system `protoc`.
//!
//! Two passes over the same descriptors: the messages and the servers, whose
//! codec is `ricochet_proto::codec::RequestCodec` (an undecodable request is
//! INVALID_ARGUMENT); then the clients alone, into `OUT_DIR/client`, with
//! tonic's codec and the messages of the first pass. The file descriptor set
//! is written to `OUT_DIR/ricochet_descriptor.bin` (`FILE_DESCRIPTOR_SET`).
//!
//! A fourth pass compiles `proto/ricochet/replication/v1/` (the Raft
//! RPCs between brokers, server and client) into `OUT_DIR/replication`,
//! also kept out of `FILE_DESCRIPTOR_SET`.
//!
//! A third pass compiles the minimal etcd v3 API subset under
//! `proto/etcd/` (clients only, tonic's codec) into `OUT_DIR/etcd`; it is
//! kept out of `FILE_DESCRIPTOR_SET`, which lists Ricochet's own services.

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
    let etcd_files = ["proto/etcd/kv.proto", "proto/etcd/rpc.proto"];
    for f in &etcd_files {
        println!("cargo:rerun-if-changed={f}");
    }
    let etcd_dir = out_dir.join("etcd");
    std::fs::create_dir_all(&etcd_dir)?;
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .out_dir(etcd_dir)
        .compile_fds(protox::compile(etcd_files, ["proto"])?)?;
    // Raft between brokers (issue 22): server and client in one module,
    // kept out of `FILE_DESCRIPTOR_SET` (a broker-to-broker service).
    let replication_files = ["proto/ricochet/replication/v1/replication.proto"];
    for f in &replication_files {
        println!("cargo:rerun-if-changed={f}");
    }
    let replication_dir = out_dir.join("replication");
    std::fs::create_dir_all(&replication_dir)?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .out_dir(replication_dir)
        .compile_fds(protox::compile(replication_files, ["proto"])?)?;
    Ok(())
}
