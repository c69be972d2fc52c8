//! `miner bench`'s cuBLASLt baseline: an int8 GEMM through cuBLASLt's raw calls, behind a
//! type that owns its handles and frees them on drop. cuBLASLt is loaded at run time, like the
//! driver: [`library_present`] first.

use cudarc::cublaslt::{result as lt, sys as lt_sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

/// Whether libcublasLt can be loaded. cudarc panics on the first cuBLASLt call when it cannot,
/// so this is asked before any.
pub(crate) fn library_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names; nothing it loads is
    // called here.
    unsafe { lt_sys::is_culib_present() }
}

/// A batched int8 GEMM through cuBLASLt computing Y = X * B (row-major) as the column-major
/// product Y^T = B^T X^T: `bt` (B^T row-major) read as column-major is B, taken transposed;
/// `x` (row-major) read as column-major is X^T, taken as is. "TN" is the int8 layout cuBLASLt
/// supports without reordering.
pub(crate) struct LtInt8Gemm {
    handle: lt_sys::cublasLtHandle_t,
    desc: lt_sys::cublasLtMatmulDesc_t,
    a: lt_sys::cublasLtMatrixLayout_t,
    b: lt_sys::cublasLtMatrixLayout_t,
    c: lt_sys::cublasLtMatrixLayout_t,
    algo: lt_sys::cublasLtMatmulAlgo_t,
    /// Elements of each operand and of the product: `batch` n x n matrices.
    elements: usize,
}

impl LtInt8Gemm {
    /// The GEMM of `batch` n x n matrices, with the algorithm cuBLASLt's heuristic picks.
    pub(crate) fn new(n: usize, batch: usize) -> Result<Self, String> {
        use lt_sys::cudaDataType::{CUDA_R_8I, CUDA_R_32I};
        let fail = |what: &str, e: lt::CublasError| format!("cuBLASLt {what}: {e:?}");
        let handle = lt::create_handle().map_err(|e| fail("create", e))?;
        let desc = lt::create_matmul_desc(lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32I, CUDA_R_32I)
            .map_err(|e| fail("matmul desc", e))?;
        // cublasOperation_t is an int32 in the attribute; CUBLAS_OP_T is 1.
        let op_t: i32 = 1;
        // SAFETY: desc is live (just created); the attribute takes an int32, and the pointer is to
        // `op_t`, live for the call and of the size passed.
        unsafe {
            lt::set_matmul_desc_attribute(
                desc,
                lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                (&op_t as *const i32).cast(),
                std::mem::size_of_val(&op_t),
            )
        }
        .map_err(|e| fail("transa", e))?;
        let (rows, ld) = (n as u64, n as i64);
        let layout = |ty| -> Result<_, String> {
            let l = lt::create_matrix_layout(ty, rows, rows, ld).map_err(|e| fail("layout", e))?;
            let count = batch as i32;
            let stride = (n * n) as i64;
            // SAFETY: l is live (just created); the attributes take an int32 and an int64, and the
            // pointers are to `count` and `stride`, live for the calls and of the sizes passed.
            unsafe {
                lt::set_matrix_layout_attribute(
                    l,
                    lt_sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                    (&count as *const i32).cast(),
                    4,
                )
                .and_then(|_| {
                    lt::set_matrix_layout_attribute(
                        l,
                        lt_sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                        (&stride as *const i64).cast(),
                        8,
                    )
                })
            }
            .map_err(|e| fail("batch layout", e))?;
            Ok(l)
        };
        let (a, b, c) = (layout(CUDA_R_8I)?, layout(CUDA_R_8I)?, layout(CUDA_R_32I)?);
        let pref = lt::create_matmul_pref().map_err(|e| fail("preference", e))?;
        // SAFETY: all descriptors are live; no workspace is offered (max bytes default 0).
        let heuristic = unsafe { lt::get_matmul_algo_heuristic(handle, desc, a, b, c, c, pref) };
        // SAFETY: pref is live and no longer needed.
        unsafe { lt::destroy_matmul_pref(pref) }.ok();
        let heuristic = heuristic.map_err(|e| fail("has no int8 algorithm for this shape", e))?;
        Ok(LtInt8Gemm {
            handle,
            desc,
            a,
            b,
            c,
            algo: heuristic.algo,
            elements: batch * n * n,
        })
    }

    /// Queues `y = x * B` on `stream` (this device's), `bt` being B^T; every buffer holds the
    /// `batch` n x n matrices the GEMM was made for.
    pub(crate) fn run(
        &self,
        stream: &CudaStream,
        bt: &CudaSlice<i8>,
        x: &CudaSlice<i8>,
        y: &mut CudaSlice<i32>,
    ) -> Result<(), String> {
        assert!(
            bt.len() >= self.elements && x.len() >= self.elements && y.len() >= self.elements,
            "cuBLASLt's operands hold the matrices its layouts describe"
        );
        let (alpha, beta) = (1i32, 0i32);
        let (a_ptr, _ra) = bt.device_ptr(stream);
        let (b_ptr, _rb) = x.device_ptr(stream);
        let (y_ptr, _ry) = y.device_ptr_mut(stream);
        // SAFETY: the handle, descriptor, layouts and algorithm are this value's, live until it
        // drops; alpha and beta are live host ints (the default host pointer mode), read during
        // the call; the three pointers are live device buffers (their guards held until the
        // work is queued) of at least the sizes the layouts describe, as asserted above; no
        // workspace is offered; the stream is this device's.
        unsafe {
            lt::matmul(
                self.handle,
                self.desc,
                (&alpha as *const i32).cast(),
                (&beta as *const i32).cast(),
                a_ptr as *const _,
                self.a,
                b_ptr as *const _,
                self.b,
                y_ptr as *const _,
                self.c,
                y_ptr as *mut _,
                self.c,
                &self.algo,
                std::ptr::null_mut(),
                0,
                stream.cu_stream() as lt_sys::cudaStream_t,
            )
        }
        .map_err(|e| format!("cuBLASLt matmul: {e:?}"))
    }
}

impl Drop for LtInt8Gemm {
    fn drop(&mut self) {
        // SAFETY: each handle was created in `new`, is this value's alone, and is destroyed once,
        // here.
        unsafe {
            lt::destroy_matrix_layout(self.a).ok();
            lt::destroy_matrix_layout(self.b).ok();
            lt::destroy_matrix_layout(self.c).ok();
            lt::destroy_matmul_desc(self.desc).ok();
            lt::destroy_handle(self.handle).ok();
        }
    }
}
