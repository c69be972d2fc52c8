//! Generates the gRPC code from proto/ with protox, a protobuf compiler written in Rust, so a
//! fresh machine needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/gpu_attest/v1/miner.proto", "proto/gpu_attest/v1/validator.proto"];
    for path in ["proto/gpu_attest/v1/common.proto"].iter().chain(&protos) {
        println!("cargo:rerun-if-changed={path}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
