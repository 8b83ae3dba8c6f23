//! Compiles the minimal etcd v3 API subset under `proto/etcd/` (KV and
//! Lease, clients only, tonic's codec) with `protox`, so building needs no
//! system `protoc`. It lives here rather than in `ricochet-proto` so that
//! the crates that speak only Ricochet's own API (the client) do not
//! compile it.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/etcd/kv.proto", "proto/etcd/rpc.proto"];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        .compile_fds(protox::compile(files, ["proto"])?)?;
    Ok(())
}
