//! Safe, owning types over [`Runtime`]: device memory, a stream, events and
//! a loaded module, each released on drop. Every one holds the [`Context`]
//! (runtime + device ordinal) it was made on, so the runtime stays loaded
//! while anything of it is alive, and makes that device current before it
//! touches it (HIP's current device is per thread).

use std::ffi::c_void;
use std::sync::Arc;

use decode_attn_core::Result;

use crate::runtime::Runtime;
use crate::sys;

/// One device of one loaded runtime.
#[derive(Debug)]
pub struct Context {
    pub runtime: Runtime,
    pub ordinal: usize,
}

impl Context {
    /// Makes this device current on the calling thread.
    pub fn activate(&self) -> Result<()> {
        self.runtime.set_device(self.ordinal)
    }
}

/// `bytes` of device memory, freed on drop.
#[derive(Debug)]
pub struct DeviceMemory {
    ptr: u64,
    len: usize,
    ctx: Arc<Context>,
}

impl DeviceMemory {
    /// Allocates `len > 0` bytes and zeroes them on `stream` (ordered before
    /// any later work on it).
    pub fn zeroed(ctx: &Arc<Context>, len: usize, stream: &Stream) -> Result<DeviceMemory> {
        ctx.activate()?;
        let ptr = ctx.runtime.malloc(len)?;
        let memory = DeviceMemory { ptr: ptr as u64, len, ctx: ctx.clone() };
        // SAFETY: `memory` owns `len` bytes at `ptr` until it is dropped, which
        // (through hipFree's implicit synchronisation) is after the memset.
        unsafe { ctx.runtime.memset_async(ptr, 0, len, stream.raw()) }?;
        Ok(memory)
    }

    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // Errors cannot be returned from drop; a failed free leaks, never panics.
        if self.ctx.activate().is_ok() {
            // SAFETY: `ptr` came from hipMalloc and is freed once, here;
            // hipFree waits for work still using it.
            let _ = unsafe { self.ctx.runtime.free(self.ptr as *mut c_void) };
        }
    }
}

/// A stream, destroyed on drop.
#[derive(Debug)]
pub struct Stream {
    raw: sys::Stream,
    ctx: Arc<Context>,
}

// SAFETY: a hipStream_t is an opaque handle that the HIP runtime lets any
// thread use; this type never dereferences it.
unsafe impl Send for Stream {}
// SAFETY: as above; every use goes through the runtime's thread-safe API.
unsafe impl Sync for Stream {}

impl Stream {
    pub fn new(ctx: &Arc<Context>) -> Result<Stream> {
        ctx.activate()?;
        Ok(Stream { raw: ctx.runtime.stream_create()?, ctx: ctx.clone() })
    }

    pub fn raw(&self) -> sys::Stream {
        self.raw
    }

    /// Waits for all work on the stream.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.activate()?;
        // SAFETY: the stream is live for as long as `self`.
        unsafe { self.ctx.runtime.stream_synchronize(self.raw) }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.ctx.activate().is_ok() {
            // SAFETY: created by hipStreamCreate, destroyed once, here.
            let _ = unsafe { self.ctx.runtime.stream_destroy(self.raw) };
        }
    }
}

/// An event, destroyed on drop.
pub struct Event {
    raw: sys::Event,
    ctx: Arc<Context>,
}

impl Event {
    pub fn new(ctx: &Arc<Context>) -> Result<Event> {
        ctx.activate()?;
        Ok(Event { raw: ctx.runtime.event_create()?, ctx: ctx.clone() })
    }

    pub fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: both handles are live for as long as their owners.
        unsafe { self.ctx.runtime.event_record(self.raw, stream.raw()) }
    }

    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the event is live for as long as `self`.
        unsafe { self.ctx.runtime.event_synchronize(self.raw) }
    }

    /// Milliseconds from `self` to `end`, both recorded and complete.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        // SAFETY: both events are live for as long as their owners.
        unsafe { self.ctx.runtime.event_elapsed_ms(self.raw, end.raw) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by hipEventCreate, destroyed once, here.
        let _ = unsafe { self.ctx.runtime.event_destroy(self.raw) };
    }
}

/// A loaded code object, unloaded on drop.
#[derive(Debug)]
pub struct Module {
    raw: sys::Module,
    ctx: Arc<Context>,
}

// SAFETY: a hipModule_t is an opaque handle usable from any thread; never dereferenced here.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

impl Module {
    /// Loads a code object on the context's device.
    pub fn load(ctx: &Arc<Context>, image: &[u8]) -> Result<Module> {
        ctx.activate()?;
        Ok(Module { raw: ctx.runtime.module_load_data(image)?, ctx: ctx.clone() })
    }

    /// A kernel of this module; valid while the module is.
    pub fn function(&self, name: &str) -> Result<Function> {
        // SAFETY: the module is live for as long as `self`.
        let raw = unsafe { self.ctx.runtime.module_get_function(self.raw, name) }?;
        Ok(Function { raw })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if self.ctx.activate().is_ok() {
            // SAFETY: loaded by hipModuleLoadData, unloaded once, here; the
            // backend drops its functions before its module.
            let _ = unsafe { self.ctx.runtime.module_unload(self.raw) };
        }
    }
}

/// A kernel handle. It does not own anything: the [`Module`] it came from
/// must outlive every use (the backend keeps both and drops functions first).
#[derive(Clone, Copy, Debug)]
pub struct Function {
    raw: sys::Function,
}

// SAFETY: a hipFunction_t is an opaque handle usable from any thread; never dereferenced here.
unsafe impl Send for Function {}
// SAFETY: as above.
unsafe impl Sync for Function {}

impl Function {
    pub fn raw(&self) -> sys::Function {
        self.raw
    }
}
