//! The tensor maps the TMA kernels (`kernels/cuda/gemm_tma.cu`, `gemm_pingpong.cu`) load their
//! tiles through: what each describes ([`OperandMap`], plain numbers the host tests hand to the
//! kernels' emulation too), and its encoding by the driver (`cuTensorMapEncodeTiled`) into the
//! 128 opaque bytes a kernel takes as a parameter.
//!
//! A batch of `count` n x n int8 matrices is one 3-d tensor: k (innermost, contiguous), rows,
//! matrices. A box is 128 bytes of k by the kernel's tile rows (128 or 64 of X, 256 of Bt) of one
//! matrix, in the 128-byte swizzle wgmma's descriptors read. Rows and k past n lie outside the
//! tensor, and TMA writes zeros for them: no box reads into the next matrix.

pub use super::raw::tensor_map::TensorMap;
use super::raw::tensor_map::encode_tiled_u8;
use cudarc::driver::DriverError;

/// Bytes of k one box covers: the kernel's TMA_BK, and the most the 128-byte swizzle allows.
pub const BOX_K: u32 = 128;

/// One operand's tensor map, as numbers: the layout of the tensor in global memory and the box
/// one load moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OperandMap {
    /// Elements (bytes) per dimension: k, rows, matrices.
    pub dims: [u64; 3],
    /// Bytes between consecutive rows, and between consecutive matrices.
    pub strides: [u64; 2],
    /// The box: bytes of k, rows, matrices.
    pub box_dims: [u32; 3],
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum TensorMapError {
    /// What the driver requires of a tiled tensor map, checked before asking it so the error
    /// says which rule.
    #[error("a tensor map for n = {n}, {count} matrices, {rows}-row boxes is not possible: {why}")]
    Unsupported {
        n: usize,
        count: usize,
        rows: u32,
        why: &'static str,
    },
    #[error("the tensor map's base address {0:#x} is not 16-byte aligned")]
    Misaligned(u64),
    #[error("cuTensorMapEncodeTiled refused the tensor map: {0}")]
    Driver(String),
}

impl OperandMap {
    /// The map of `count` n x n matrices read in boxes of `rows` rows by [`BOX_K`] bytes of k.
    /// Refuses what `cuTensorMapEncodeTiled` would (PTX ISA and CUDA driver API, "Tensor Map"):
    /// strides a multiple of 16 below 2^40, box sides of 1 to 256 elements, the innermost at
    /// most the swizzle's 128 bytes, at most 2^32 elements a dimension.
    pub fn new(n: usize, count: usize, rows: u32) -> Result<OperandMap, TensorMapError> {
        let refuse = |why| Err(TensorMapError::Unsupported { n, count, rows, why });
        if n == 0 || count == 0 {
            return refuse("the tensor is empty");
        }
        let (n64, count64) = (n as u64, count as u64);
        if !n64.is_multiple_of(16) {
            return refuse("rows must be a multiple of 16 bytes apart");
        }
        if n64 > 1 << 32 || count64 > 1 << 32 {
            return refuse("a dimension holds more than 2^32 elements");
        }
        let matrix_stride = n64 * n64;
        if matrix_stride >= 1 << 40 {
            return refuse("a matrix is 2^40 bytes or more");
        }
        if !(1..=256).contains(&rows) {
            return refuse("a box side must be 1 to 256 elements");
        }
        Ok(OperandMap {
            dims: [n64, n64, count64],
            strides: [n64, matrix_stride],
            box_dims: [BOX_K, rows, 1],
        })
    }

    /// The box's bytes: what one load counts against its barrier, zeros past the tensor included.
    pub fn box_bytes(&self) -> u32 {
        self.box_dims.iter().product()
    }

    /// The map in the form the host emulation's harness reads (`d0,d1,d2,s1,s2,b0,b1,b2`).
    pub fn to_arg(&self) -> String {
        let [d0, d1, d2] = self.dims;
        let [s1, s2] = self.strides;
        let [b0, b1, b2] = self.box_dims;
        format!("{d0},{d1},{d2},{s1},{s2},{b0},{b1},{b2}")
    }

    /// Encodes the map of the tensor at device address `base`.
    pub fn encode(&self, base: u64) -> Result<TensorMap, TensorMapError> {
        if !base.is_multiple_of(16) {
            return Err(TensorMapError::Misaligned(base));
        }
        encode_tiled_u8(base, &self.dims, &self.strides, &self.box_dims)
            .map_err(|e: DriverError| TensorMapError::Driver(super::detect::driver_error_text(&e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_one_tensor_of_k_rows_and_matrices() {
        let x = OperandMap::new(2048, 3, 128).unwrap();
        assert_eq!(x.dims, [2048, 2048, 3]);
        assert_eq!(x.strides, [2048, 2048 * 2048]);
        assert_eq!(x.box_dims, [128, 128, 1]);
        assert_eq!(x.box_bytes(), 16384);
        let bt = OperandMap::new(64, 1, 256).unwrap();
        // A box larger than the tensor is allowed: TMA fills what lies outside with zeros.
        assert_eq!(bt.box_bytes(), 32768);
        assert_eq!(bt.to_arg(), "64,64,1,64,4096,128,256,1");
    }

    /// A kernel announces one stage's bytes ((rows + columns) x TMA_BK, tma_gemm.cuh) to each
    /// `full` barrier and then loads one X box and Bt boxes (one, or one from each block of its
    /// cluster, multicast): if the two differed, the phase would never complete. The stages
    /// (four of the cooperative kernel's, five of the ping-pong ones') fill its dynamic shared
    /// memory but for the alignment KiB and the barriers' bytes.
    #[test]
    fn the_boxes_are_exactly_the_stage_the_kernel_waits_for() {
        use crate::GpuKernel;
        for (kernel, stages, barriers) in [
            (GpuKernel::Tma, 4, 0),
            (GpuKernel::Pingpong, 5, 128),
            (GpuKernel::Multicast, 5, 128),
        ] {
            let (rows, columns) = kernel.block_tile();
            let (x_rows, bt_rows) = kernel.box_rows();
            let stage = (kernel.dynamic_shared_bytes() - 1024 - barriers) / stages;
            for n in [64, 192, 2048] {
                let x = OperandMap::new(n, 2, x_rows).unwrap();
                let bt = OperandMap::new(n, 2, bt_rows).unwrap();
                let landed = x.box_bytes() + bt.box_bytes() * kernel.cluster_blocks();
                assert_eq!(landed, stage, "{kernel}, n = {n}");
                assert_eq!((rows + columns) * BOX_K, stage, "{kernel}, n = {n}");
            }
        }
    }

    #[test]
    fn maps_the_driver_would_refuse_are_refused_with_the_rule() {
        for (n, count, rows, rule) in [
            (0, 1, 128, "empty"),
            (64, 0, 128, "empty"),
            (72, 1, 128, "multiple of 16"),
            (64, 1, 0, "box side"),
            (64, 1, 257, "box side"),
            (1 << 20, 1, 128, "2^40"),
        ] {
            let err = OperandMap::new(n, count, rows).unwrap_err();
            assert!(err.to_string().contains(rule), "{n} {count} {rows}: {err}");
        }
    }

    #[test]
    fn a_misaligned_base_is_refused_before_the_driver_is_asked() {
        let map = OperandMap::new(64, 1, 128).unwrap();
        assert_eq!(map.encode(8).unwrap_err(), TensorMapError::Misaligned(8));
    }

    /// The kernel's parameter is 128 bytes; the driver copies exactly what the type holds.
    #[test]
    fn the_encoded_map_is_the_kernels_128_bytes() {
        assert_eq!(std::mem::size_of::<TensorMap>(), 128);
        assert!(std::mem::align_of::<TensorMap>() >= 64);
    }
}
