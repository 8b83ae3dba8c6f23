//! Compiles the `Replication` service (`proto/ricochet/replication/v1/`:
//! the Raft RPCs between the brokers of a replicated partition's group),
//! server and client, with `protox` (no system `protoc`). It lives here
//! rather than in `ricochet-proto` so that the client crate, which speaks
//! only Ricochet's public API, does not compile it.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/ricochet/replication/v1/replication.proto"];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(protox::compile(files, ["proto"])?)?;
    Ok(())
}
