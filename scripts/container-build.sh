#!/usr/bin/env bash
# Builds the two images of deploy/container/Containerfile from the Debian package, so that the
# image and the package are one artefact:
#
#   gpu-attest-validator:VERSION    gpu-attest-miner:VERSION (with NVRTC for NVIDIA GPUs)
#
#   scripts/container-build.sh [DEB]    # default: the newest target/debian/gpu-attest_*.deb
#
# CONTAINER_ENGINE=docker (default: podman where it is installed, else docker). The base image
# is debian:bookworm-slim, pulled as usual; NVRTC (CUDA 13.0's, redistributable) comes from the
# Python package registry, or from the kernel check's download when it is there.
set -euo pipefail
cd "$(dirname "$0")/.."

engine=${CONTAINER_ENGINE:-$(command -v podman >/dev/null && echo podman || echo docker)}
command -v "$engine" >/dev/null || { echo "container-build: $engine not found (set CONTAINER_ENGINE to podman or docker)" >&2; exit 1; }
deb=${1:-$(ls -t target/debian/gpu-attest_*.deb 2>/dev/null | head -1)}
[ -f "$deb" ] || { echo "container-build: no package: build one with scripts/package-deb.sh, or name it" >&2; exit 2; }
# gpu-attest_VERSION-REVISION_ARCH.deb, as scripts/package-deb.sh names it.
version=$(basename "$deb" | sed -n 's/^gpu-attest_\([^_-]*\)-[^_]*_[^_]*\.deb$/\1/p')
[ -n "$version" ] || { echo "container-build: $deb is not named gpu-attest_VERSION-REVISION_ARCH.deb" >&2; exit 2; }

context=target/container/context
rm -rf "$context"
mkdir -p "$context/nvrtc"
cp deploy/container/Containerfile deploy/container/entrypoint.sh deploy/container/*.toml "$context/"
cp "$deb" "$context/gpu-attest.deb"

# NVRTC 13.0: the library and its builtins, nothing else of the toolkit.
cuda_lib=$(echo target/cuda-tools/lib/python3*/site-packages/nvidia/cu13/lib)
if [ ! -e "$cuda_lib/libnvrtc.so.13" ]; then
    wheels=target/container/nvrtc-wheel
    if ! ls "$wheels"/nvidia_cuda_nvrtc-13.0.*.whl >/dev/null 2>&1; then
        echo "== downloading NVRTC 13.0 from the Python package registry" >&2
        python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
            --platform manylinux2014_x86_64 --python-version 3.11 -d "$wheels" "nvidia-cuda-nvrtc==13.0.*"
    fi
    cuda_lib=target/container/nvrtc-lib
    rm -rf "$cuda_lib"
    python3 - "$cuda_lib" "$wheels"/nvidia_cuda_nvrtc-13.0.*.whl <<'EOF'
import os, sys, zipfile
out, wheel = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if os.path.basename(name) in ("libnvrtc.so.13", "libnvrtc-builtins.so.13.0"):
            with open(os.path.join(out, os.path.basename(name)), "wb") as f:
                f.write(z.read(name))
EOF
fi
for lib in libnvrtc.so.13 libnvrtc-builtins.so.13.0; do
    [ -e "$cuda_lib/$lib" ] || { echo "container-build: $lib missing under $cuda_lib" >&2; exit 1; }
    cp "$cuda_lib/$lib" "$context/nvrtc/"
done

# The docker format keeps HEALTHCHECK, which the OCI format has no place for.
format=()
[ "$engine" = podman ] && format=(--format docker)
for target in validator miner; do
    echo "== building gpu-attest-$target:$version ($engine)" >&2
    "$engine" build "${format[@]}" ${CONTAINER_BUILD_FLAGS:-} --target "$target" \
        --tag "gpu-attest-$target:$version" --file "$context/Containerfile" "$context" >&2
done
echo "gpu-attest-validator:$version gpu-attest-miner:$version"
