//! Generates the gRPC code from proto/ with protox, a protobuf compiler written in Rust, so a
//! fresh machine needs no system `protoc`.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = [
        "proto/gpu_attest/v1/miner.proto",
        "proto/gpu_attest/v1/validator.proto",
        "proto/gpu_attest/v1/transcript.proto",
    ];
    for path in ["proto/gpu_attest/v1/common.proto"].iter().chain(&protos) {
        println!("cargo:rerun-if-changed={path}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    // The descriptors, encoded, for gRPC server reflection (generic clients such as grpcurl).
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out_dir.join("gpu_attest_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
