//! Memory and streams that the caller owns: an engine's device allocations
//! (a tensor of its framework, a pool it manages) used as [`CudaBuffer`]s
//! without a copy, and its stream, on which decode enqueues its launches so
//! that they run in the engine's order and join the engine's own CUDA-graph
//! capture.
//!
//! Both are checked with the driver when they are wrapped, so that a pointer
//! that is not device memory of this backend's device, a range that runs past
//! its allocation, or a stream of another context is an error that names the
//! value, not a fault on the GPU. What the driver cannot check (that the
//! memory and the stream outlive their use) is the caller's promise, which is
//! why the two wrapping functions are `unsafe`.

use std::ffi::c_void;

use cudarc::driver::sys::{self, CUmemorytype, CUpointer_attribute, CUresult};
use decode_attn_core::{DecodeArgs, Error, MergeArgs, Plan, Result};

use crate::{driver_error, CudaBackend, CudaBuffer, Memory, BACKEND};

/// A stream the caller owns, checked to belong to a [`CudaBackend`]'s
/// context ([`CudaBackend::caller_stream`]). Work enqueued on it with
/// [`CudaBackend::decode_on`] runs in the caller's stream order and, while
/// the caller captures that stream, becomes nodes of the caller's graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallerStream {
    raw: sys::CUstream,
}

// SAFETY: a CUstream is a handle the driver accepts from any thread of the
// process; `CallerStream` only passes it to the driver.
unsafe impl Send for CallerStream {}
// SAFETY: as above; the handle is never dereferenced on the host.
unsafe impl Sync for CallerStream {}

impl CallerStream {
    /// The driver's handle.
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }
}

impl CudaBackend {
    /// `len_bytes` of the caller's device memory at `address`, as a buffer
    /// this backend reads and writes in place (no copy). Dropping the buffer
    /// frees nothing.
    ///
    /// Checked with the driver: the memory must be device (or managed)
    /// memory on this backend's device, and the whole range must lie in one
    /// allocation, so the kernels never read past it. A length of 0 gives an
    /// empty buffer whatever `address` is. Alignment is checked where the
    /// buffer is used ([`Error::Misaligned`]): the decode kernels need 16
    /// bytes for element arrays and 4 for `i32` arrays; a view at an offset
    /// of an allocation may have less.
    ///
    /// # Safety
    /// The allocation must stay allocated, and not be reused for other data,
    /// for as long as the buffer is used, including by any replay of a
    /// graph that captured a call with it: the driver can check the
    /// allocation now but not that it outlives its use.
    pub unsafe fn borrow_device_memory(&self, address: u64, len_bytes: usize) -> Result<CudaBuffer> {
        if len_bytes == 0 {
            return Ok(CudaBuffer { memory: Memory::Empty });
        }
        let refuse = |why: String| Error::ForeignMemory { backend: BACKEND, address, len_bytes, why };
        if address == 0 {
            return Err(refuse("the address is null".into()));
        }
        self.ctx.bind_to_thread().map_err(driver_error)?;
        let allocation =
            Allocation::of(address).map_err(|err| refuse(format!("the driver cannot describe it ({err:?})")))?;
        let Allocation { memory_type, ordinal, start, size } = allocation;
        if memory_type == 0 {
            return Err(refuse("the CUDA driver knows no allocation at this address: not device memory".into()));
        }
        if memory_type == CUmemorytype::CU_MEMORYTYPE_HOST as u32 {
            return Err(refuse("it is host memory (pinned or mapped), not device memory".into()));
        }
        if memory_type != CUmemorytype::CU_MEMORYTYPE_DEVICE as u32
            && memory_type != CUmemorytype::CU_MEMORYTYPE_UNIFIED as u32
        {
            return Err(refuse(format!("the driver reports memory type {memory_type}, not device memory")));
        }
        if ordinal != self.ctx.ordinal() as i32 {
            return Err(refuse(format!("it is on device {ordinal}; this backend is on device {}", self.ctx.ordinal())));
        }
        let end = start.saturating_add(size as u64);
        let fits = address.checked_add(len_bytes as u64).is_some_and(|last| address >= start && last <= end);
        if !fits {
            return Err(refuse(format!(
                "the allocation that holds it spans {start:#x}..{end:#x} ({size} bytes); the range runs {} bytes past its end",
                (address as u128 + len_bytes as u128).saturating_sub(end as u128)
            )));
        }
        Ok(CudaBuffer { memory: Memory::Borrowed { address, len_bytes } })
    }

    /// The caller's `stream`, checked to belong to this backend's context
    /// (the device's primary context, the one the CUDA runtime and so most
    /// frameworks use). The null stream is accepted; graph capture is not
    /// possible on it (the driver refuses).
    ///
    /// # Safety
    /// `stream` must be a stream handle that has not been destroyed, and must
    /// stay so while work enqueued on it with [`decode_on`](Self::decode_on)
    /// can run: the driver cannot tell a destroyed handle from a live one.
    pub unsafe fn caller_stream(&self, stream: sys::CUstream) -> Result<CallerStream> {
        let refuse = |why: String| Error::ForeignStream { backend: BACKEND, stream: stream as u64, why };
        self.ctx.bind_to_thread().map_err(driver_error)?;
        let mut context: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `stream` is live (the caller's contract) and `context` is a
        // valid place for the driver to write one handle.
        unsafe { sys::cuStreamGetCtx(stream, &mut context) }
            .result()
            .map_err(|err| refuse(format!("the driver cannot tell its context ({err})")))?;
        let ours = self.ctx.cu_ctx();
        if context != ours {
            return Err(refuse(format!(
                "it belongs to CUDA context {context:p}, not this backend's ({ours:p}, the primary context of device {})",
                self.ctx.ordinal()
            )));
        }
        Ok(CallerStream { raw: stream })
    }

    /// [`DecodeAttention::decode`](decode_attn_core::DecodeAttention::decode)
    /// enqueued on the caller's `stream` instead of the backend's own: the
    /// same checks, then the same one or two launches, after whatever the
    /// caller enqueued there before. Nothing is enqueued on the backend's
    /// stream, so work there (uploads through the backend) is not ordered
    /// with this call: synchronize it first. Within the caller's graph
    /// capture, the launches are captured; the graph reads what the buffers
    /// hold at each replay.
    pub fn decode_on(&self, stream: &CallerStream, plan: &Plan, args: DecodeArgs<'_, CudaBuffer>) -> Result<()> {
        self.enqueue_decode(stream.raw, plan, args)
    }

    /// [`DecodeAttention::merge_attn_states`](decode_attn_core::DecodeAttention::merge_attn_states)
    /// on the caller's `stream`, as [`decode_on`](Self::decode_on).
    pub fn merge_attn_states_on(&self, stream: &CallerStream, args: MergeArgs<'_, CudaBuffer>) -> Result<()> {
        self.enqueue_merge(stream.raw, args)
    }
}

/// What the driver knows of the allocation that holds an address.
struct Allocation {
    /// A `CUmemorytype`, or 0 where the driver knows no allocation there.
    memory_type: u32,
    ordinal: i32,
    start: u64,
    size: usize,
}

impl Allocation {
    /// One `cuPointerGetAttributes` call: unlike `cuPointerGetAttribute`, it
    /// answers an address the driver does not know with zeros rather than an
    /// error, so a refused host pointer leaves no API error behind (for the
    /// engine's error hooks, or compute-sanitizer).
    fn of(address: u64) -> std::result::Result<Allocation, sys::CUresult> {
        let mut allocation = Allocation { memory_type: 0, ordinal: -1, start: 0, size: 0 };
        let mut attributes = [
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        ];
        let mut data = [
            &mut allocation.memory_type as *mut u32 as *mut c_void,
            &mut allocation.ordinal as *mut i32 as *mut c_void,
            &mut allocation.start as *mut u64 as *mut c_void,
            &mut allocation.size as *mut usize as *mut c_void,
        ];
        // SAFETY: `data[i]` points to a live place of the C type the driver
        // writes for `attributes[i]` (unsigned int, int, CUdeviceptr,
        // size_t); both arrays hold the 4 entries the count says; the driver
        // only reads its own tables for `address`.
        let status = unsafe {
            sys::cuPointerGetAttributes(attributes.len() as u32, attributes.as_mut_ptr(), data.as_mut_ptr(), address)
        };
        match status {
            CUresult::CUDA_SUCCESS => Ok(allocation),
            err => Err(err),
        }
    }
}
