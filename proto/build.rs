//! Compiles `proto/ricochet/v1/*.proto` with `protox` (a pure-Rust protobuf
//! compiler), so building needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/ricochet/v1/messages.proto",
        "proto/ricochet/v1/broker.proto",
        "proto/ricochet/v1/admin.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
