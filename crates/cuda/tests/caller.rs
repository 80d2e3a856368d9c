//! Memory and streams the caller owns: an "engine" made of cudarc calls (its
//! own handle on the device's primary context, its own stream, its own
//! allocations, some of the buffers at offsets inside larger ones, as tensor
//! views are) calls decode on its stream, inside its own graph capture, and
//! gets the reference's output; bad pointers, misaligned views and streams
//! of another context are refused with errors that name them. Every test says
//! plainly when it skips because this machine has no CUDA device.

mod common;

use std::sync::Arc;

use common::{download_f32, host_merge, nan_bytes, DeviceBatch};
use cudarc::driver::sys::{self, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use decode_attn_core::synth::{i32_bytes, relative_error, HostBatch, HostIndex};
use decode_attn_core::{
    dtype, AttentionShape, DType, DTypes, DecodeArgs, DecodeAttention, DecodeProblem, DeviceBuffer, Error,
    KvIndexBuffers, KvLayout, Policy,
};
use decode_attn_cpu::reference::decode_reference;
use decode_attn_cuda::{CallerStream, CudaBackend, CudaBuffer};
use serial_test::serial;

/// The backend and the engine's context and stream, or `None` (said plainly)
/// where there is no CUDA device.
fn open() -> Option<(CudaBackend, Arc<CudaContext>, Arc<CudaStream>)> {
    if let Err(err) = decode_attn_cuda::device_count() {
        eprintln!("SKIPPED: no CUDA device on this machine ({err})");
        return None;
    }
    let backend = CudaBackend::new(0).expect("a CUDA device is present but the backend failed to open");
    let engine = CudaContext::new(0).expect("the engine's context");
    let stream = engine.new_stream().expect("the engine's stream");
    Some((backend, engine, stream))
}

/// One engine allocation holding `bytes` at `offset` (zeros around them).
struct EngineBuffer {
    slice: CudaSlice<u8>,
    offset: usize,
    len: usize,
}

impl EngineBuffer {
    fn new(stream: &Arc<CudaStream>, bytes: &[u8], offset: usize) -> EngineBuffer {
        let mut host = vec![0u8; offset + bytes.len() + 64];
        host[offset..offset + bytes.len()].copy_from_slice(bytes);
        EngineBuffer { slice: stream.clone_htod(&host).unwrap(), offset, len: bytes.len() }
    }

    fn address(&self, stream: &Arc<CudaStream>) -> u64 {
        self.slice.device_ptr(stream).0 + self.offset as u64
    }

    fn write(&mut self, stream: &Arc<CudaStream>, bytes: &[u8]) {
        assert_eq!(bytes.len(), self.len);
        let mut host = stream.clone_dtoh(&self.slice).unwrap();
        host[self.offset..self.offset + self.len].copy_from_slice(bytes);
        stream.memcpy_htod(&host, &mut self.slice).unwrap();
    }

    fn read(&self, stream: &Arc<CudaStream>) -> Vec<u8> {
        let host = stream.clone_dtoh(&self.slice).unwrap();
        stream.synchronize().unwrap();
        host[self.offset..self.offset + self.len].to_vec()
    }

    /// The view as a backend buffer.
    fn borrow(&self, backend: &CudaBackend, stream: &Arc<CudaStream>) -> CudaBuffer {
        // SAFETY: the allocation lives in `self`, which every test keeps
        // alive past its last use of the buffer and of graphs captured with it.
        unsafe { backend.borrow_device_memory(self.address(stream), self.len) }.unwrap()
    }
}

/// A batch in the engine's memory, Q, lengths and output at offsets inside
/// larger allocations (16 and 4 bytes: what the kernels need).
struct EngineBatch {
    q: EngineBuffer,
    k: EngineBuffer,
    v: EngineBuffer,
    seq_lens: EngineBuffer,
    table: EngineBuffer,
    max_blocks_per_seq: usize,
    workspace: EngineBuffer,
    out: EngineBuffer,
}

impl EngineBatch {
    fn new(stream: &Arc<CudaStream>, batch: &HostBatch, workspace_bytes: u64) -> EngineBatch {
        let HostIndex::BlockTable { table, max_blocks_per_seq } = &batch.index else {
            panic!("these tests use a block table");
        };
        EngineBatch {
            q: EngineBuffer::new(stream, &batch.q, 256 + 16),
            k: EngineBuffer::new(stream, &batch.k_cache, 0),
            v: EngineBuffer::new(stream, &batch.v_cache, 0),
            seq_lens: EngineBuffer::new(stream, &i32_bytes(&batch.seq_lens), 4),
            table: EngineBuffer::new(stream, &i32_bytes(table), 0),
            max_blocks_per_seq: *max_blocks_per_seq,
            workspace: EngineBuffer::new(stream, &vec![0xffu8; workspace_bytes as usize], 0),
            out: EngineBuffer::new(stream, &nan_bytes(batch.problem.dtypes.out, batch.problem.out_bytes()), 512),
        }
    }

    fn borrow(&self, backend: &CudaBackend, stream: &Arc<CudaStream>) -> BorrowedBatch {
        BorrowedBatch {
            q: self.q.borrow(backend, stream),
            k: self.k.borrow(backend, stream),
            v: self.v.borrow(backend, stream),
            seq_lens: self.seq_lens.borrow(backend, stream),
            table: self.table.borrow(backend, stream),
            max_blocks_per_seq: self.max_blocks_per_seq,
            workspace: self.workspace.borrow(backend, stream),
            out: self.out.borrow(backend, stream),
        }
    }
}

struct BorrowedBatch {
    q: CudaBuffer,
    k: CudaBuffer,
    v: CudaBuffer,
    seq_lens: CudaBuffer,
    table: CudaBuffer,
    max_blocks_per_seq: usize,
    workspace: CudaBuffer,
    out: CudaBuffer,
}

impl BorrowedBatch {
    fn args(&mut self) -> DecodeArgs<'_, CudaBuffer> {
        DecodeArgs {
            q: &self.q,
            k_cache: &self.k,
            v_cache: &self.v,
            seq_lens: &self.seq_lens,
            kv_index: KvIndexBuffers::BlockTable { table: &self.table, max_blocks_per_seq: self.max_blocks_per_seq },
            workspace: &mut self.workspace,
            out: &mut self.out,
            lse: None,
            softmax_scale: None,
        }
    }
}

fn llama_8b(lens: Vec<u32>) -> DecodeProblem {
    DecodeProblem::new(
        AttentionShape::new(32, 8, 128).unwrap(),
        DTypes::uniform(DType::Bf16),
        KvLayout::block_table(16),
        lens,
    )
    .unwrap()
}

fn engine_stream(backend: &CudaBackend, stream: &Arc<CudaStream>) -> CallerStream {
    // SAFETY: `stream` is the engine's live stream, kept alive by the test
    // past every use.
    unsafe { backend.caller_stream(stream.cu_stream()) }.expect("the engine's stream is of the primary context")
}

fn nodes_of(graph: &cudarc::driver::CudaGraph) -> usize {
    let mut count = 0usize;
    // SAFETY: with a null array the driver only writes the node count.
    unsafe { sys::cuGraphGetNodes(graph.cu_graph(), std::ptr::null_mut(), &mut count) }.result().unwrap();
    count
}

/// The first call of a fresh backend is made while the engine captures its
/// stream in the strictest mode (no unsafe API call from any thread); the
/// captured graph holds the decode kernel and its reducer, runs where the
/// engine launches it, and reads new lengths at each replay. Then a plain
/// call on the engine's stream.
#[test]
#[serial]
fn decode_on_the_engines_stream_is_captured_in_its_graph_and_matches_the_reference() {
    let Some((backend, _engine, stream)) = open() else { return };
    let capture_lens = vec![3000, 17, 1500];
    let problem = llama_8b(capture_lens.clone());
    let plan = backend.plan(&problem, Policy::Auto).unwrap();
    assert!(plan.use_split, "the test wants the decode kernel and the reducer: {plan}");
    let batch = HostBatch::random(&problem, 41);
    let mut engine = EngineBatch::new(&stream, &batch, plan.workspace_bytes);
    let mut borrowed = engine.borrow(&backend, &stream);
    assert!(borrowed.q.is_borrowed() && borrowed.q.device_address() % 16 == 0);
    let on = engine_stream(&backend, &stream);

    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL).unwrap();
    let decoded = backend.decode_on(&on, &plan, borrowed.args());
    let graph = stream.end_capture(CUgraphInstantiate_flags(0)).unwrap();
    decoded.unwrap();
    let graph = graph.expect("the engine's capture recorded the decode launches");
    assert_eq!(nodes_of(&graph), 2, "the decode kernel and the reducer, and nothing else");
    // Nothing ran yet: the output is still the poison.
    assert!(dtype::decode(DType::Bf16, &engine.out.read(&stream)).iter().all(|x| x.is_nan()));

    graph.launch().unwrap();
    let first = dtype::decode(DType::Bf16, &engine.out.read(&stream));
    let reference = decode_reference(&batch, problem.shape.default_scale());
    let err = relative_error(&first, &reference);
    assert!(err < 1e-2, "first replay: relerr {err}");

    // The engine writes new lengths and poisons the output; the same graph
    // decodes the new batch.
    let replay_lens = [900i32, 0, 1500];
    engine.seq_lens.write(&stream, &i32_bytes(&replay_lens));
    engine.out.write(&stream, &nan_bytes(DType::Bf16, problem.out_bytes()));
    graph.launch().unwrap();
    let second = dtype::decode(DType::Bf16, &engine.out.read(&stream));
    let shorter = batch.at_lengths(&replay_lens.map(|len| len as u32));
    let err = relative_error(&second, &decode_reference(&shorter, problem.shape.default_scale()));
    assert!(err < 1e-2, "replay with new lengths: relerr {err}");
    assert!(second[32 * 128..2 * 32 * 128].iter().all(|&x| x == 0.0), "a length-0 sequence decodes to zeros");

    // A plain call on the engine's stream, ordered after the engine's writes
    // there by the stream alone.
    engine.seq_lens.write(&stream, &i32_bytes(&batch.seq_lens));
    engine.out.write(&stream, &nan_bytes(DType::Bf16, problem.out_bytes()));
    backend.decode_on(&on, &plan, borrowed.args()).unwrap();
    let plain = dtype::decode(DType::Bf16, &engine.out.read(&stream));
    let err = relative_error(&plain, &reference);
    assert!(err < 1e-2, "plain call on the engine's stream: relerr {err}");
}

/// A view one element off the kernels' 16-byte alignment is refused by name
/// before anything is launched: the output keeps what the caller put there.
#[test]
#[serial]
fn a_misaligned_view_is_refused_before_any_launch_and_the_output_is_untouched() {
    let Some((backend, _engine, stream)) = open() else { return };
    let problem = llama_8b(vec![700, 40]);
    let plan = backend.plan(&problem, Policy::Auto).unwrap();
    let batch = HostBatch::random(&problem, 43);
    let engine = EngineBatch::new(&stream, &batch, plan.workspace_bytes);
    let mut borrowed = engine.borrow(&backend, &stream);
    let on = engine_stream(&backend, &stream);
    // Q two bytes (one bf16) into its view: still inside the allocation.
    let shifted = engine.q.address(&stream) + 2;
    // SAFETY: `engine` keeps the allocation alive past the test's last use.
    borrowed.q = unsafe { backend.borrow_device_memory(shifted, problem.q_bytes()) }.unwrap();
    let err = backend.decode_on(&on, &plan, borrowed.args()).unwrap_err();
    assert_eq!(err, Error::Misaligned { name: "q", address: shifted, alignment: 16 });
    stream.synchronize().unwrap();
    assert_eq!(engine.out.read(&stream), nan_bytes(DType::Bf16, problem.out_bytes()), "the output was written");
    // The same through the backend's own stream.
    let err = backend.decode(&plan, borrowed.args()).unwrap_err();
    assert!(matches!(err, Error::Misaligned { name: "q", .. }), "{err:?}");
    // A block table one byte off its 4.
    borrowed.q = engine.q.borrow(&backend, &stream);
    let table = engine.table.address(&stream) + 1;
    // SAFETY: as above.
    borrowed.table = unsafe { backend.borrow_device_memory(table, engine.table.len) }.unwrap();
    let err = backend.decode_on(&on, &plan, borrowed.args()).unwrap_err();
    assert!(matches!(err, Error::Misaligned { name: "block_table", alignment: 4, .. }), "{err:?}");
    assert_eq!(engine.out.read(&stream), nan_bytes(DType::Bf16, problem.out_bytes()), "the output was written");
}

/// What is not device memory of this device, or runs past its allocation,
/// is refused when it is wrapped, with the address in the message.
#[test]
#[serial]
fn memory_that_is_not_one_device_allocation_is_refused_with_its_address() {
    let Some((backend, _engine, stream)) = open() else { return };
    let engine = EngineBuffer::new(&stream, &[7u8; 1024], 0);
    let start = engine.address(&stream);
    let allocation = engine.slice.len(); // 1024 + 64
    let borrow = |address: u64, len: usize| {
        // SAFETY: the allocation outlives every buffer made here, and the
        // refused ones are never made.
        unsafe { backend.borrow_device_memory(address, len) }
    };
    // Inside, and exactly to the end: accepted, and read back through the backend.
    let inside = borrow(start + 512, allocation - 512).unwrap();
    assert_eq!(inside.len_bytes(), allocation - 512);
    let mut back = vec![0u8; allocation - 512];
    backend.download(&inside, &mut back).unwrap();
    assert_eq!(&back[..512], &[7u8; 512][..]);
    assert!(borrow(start, 0).unwrap().len_bytes() == 0);

    let past = borrow(start + 512, allocation - 511).unwrap_err();
    let Error::ForeignMemory { address, len_bytes, ref why, .. } = past else { panic!("{past:?}") };
    assert_eq!((address, len_bytes), (start + 512, allocation - 511));
    assert!(why.contains("1 bytes past its end"), "{past}");
    assert!(past.to_string().contains(&format!("{:#x}", start + 512)), "{past}");

    let host = vec![0u8; 4096];
    let err = borrow(host.as_ptr() as u64, host.len()).unwrap_err();
    assert!(matches!(&err, Error::ForeignMemory { why, .. } if why.contains("not device memory")), "{err}");
    let err = borrow(0, 16).unwrap_err();
    assert!(matches!(&err, Error::ForeignMemory { why, .. } if why.contains("null")), "{err}");

    // Pinned host memory is known to the driver, as host memory.
    let mut pinned: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: allocates 4096 bytes of page-locked host memory into `pinned`.
    unsafe { sys::cuMemAllocHost_v2(&mut pinned, 4096) }.result().unwrap();
    let err = borrow(pinned as u64, 4096).unwrap_err();
    // SAFETY: `pinned` came from cuMemAllocHost and nothing uses it any more.
    unsafe { sys::cuMemFreeHost(pinned) }.result().unwrap();
    assert!(matches!(&err, Error::ForeignMemory { why, .. } if why.contains("host memory")), "{err}");
}

/// A stream of a context other than the device's primary one is refused; the
/// engine's stream (primary context) and the null stream are accepted.
#[test]
#[serial]
fn a_stream_of_another_context_is_refused() {
    let Some((backend, _engine, stream)) = open() else { return };
    engine_stream(&backend, &stream);
    // SAFETY: the null stream always exists.
    unsafe { backend.caller_stream(std::ptr::null_mut()) }.expect("the null stream");

    let mut device = 0;
    let mut other: sys::CUcontext = std::ptr::null_mut();
    let mut foreign: sys::CUstream = std::ptr::null_mut();
    // SAFETY: creates a second context on device 0 (made current) and a
    // stream in it; both are destroyed below, after their last use.
    unsafe {
        sys::cuDeviceGet(&mut device, 0).result().unwrap();
        sys::cuCtxCreate_v2(&mut other, 0, device).result().unwrap();
        sys::cuStreamCreate(&mut foreign, 0).result().unwrap();
    }
    // SAFETY: `foreign` is live until destroyed below.
    let err = unsafe { backend.caller_stream(foreign) }.unwrap_err();
    // SAFETY: the stream and the context are not used after this.
    unsafe {
        sys::cuStreamDestroy_v2(foreign).result().unwrap();
        sys::cuCtxDestroy_v2(other).result().unwrap();
    }
    let Error::ForeignStream { stream: handle, ref why, .. } = err else { panic!("{err:?}") };
    assert_eq!(handle, foreign as u64);
    assert!(why.contains("belongs to CUDA context"), "{err}");
    // The backend still works on its own stream afterwards.
    let problem = llama_8b(vec![64]);
    let plan = backend.plan(&problem, Policy::Auto).unwrap();
    let batch = HostBatch::random(&problem, 47);
    let outputs = decode_on_own_buffers(&backend, &plan, &batch);
    let err = relative_error(&outputs, &decode_reference(&batch, problem.shape.default_scale()));
    assert!(err < 1e-2, "after the refusal: relerr {err}");
}

/// Upload, decode on the backend's own buffers and stream, download.
fn decode_on_own_buffers(backend: &CudaBackend, plan: &decode_attn_core::Plan, batch: &HostBatch) -> Vec<f32> {
    let mut device = DeviceBatch::new(backend, batch, plan.workspace_bytes);
    backend.decode(plan, device.args(true)).unwrap();
    download_f32(backend, &device.out, DType::Bf16)
}

/// The merge op on the engine's stream over the engine's memory, its states
/// at 2-byte offsets (bf16 views: the merge reads an element at a time, so
/// that is enough), against the host merge; a log-sum-exp view off its 4
/// bytes is refused by name.
#[test]
#[serial]
fn merge_on_the_engines_stream_over_its_views_matches_the_host_merge() {
    let Some((backend, _engine, stream)) = open() else { return };
    let (tokens, heads, dim) = (3, 4, 64);
    let n = tokens * heads * dim;
    let mut rng = decode_attn_core::synth::SplitMix64::new(53);
    let prefix: Vec<f32> = (0..n).map(|_| rng.next_signed()).collect();
    let suffix: Vec<f32> = (0..n).map(|_| rng.next_signed()).collect();
    let prefix_lse: Vec<f32> = (0..tokens * heads).map(|_| 3.0 * rng.next_signed()).collect();
    let suffix_lse: Vec<f32> = (0..tokens * heads).map(|_| 3.0 * rng.next_signed()).collect();
    let lse_bytes = |v: &[f32]| dtype::encode(DType::F32, v);
    let engine = [
        EngineBuffer::new(&stream, &dtype::encode(DType::Bf16, &prefix), 2),
        EngineBuffer::new(&stream, &lse_bytes(&prefix_lse), 4),
        EngineBuffer::new(&stream, &dtype::encode(DType::Bf16, &suffix), 6),
        EngineBuffer::new(&stream, &lse_bytes(&suffix_lse), 0),
        EngineBuffer::new(&stream, &nan_bytes(DType::Bf16, n * 2), 10),
    ];
    let [prefix_dev, prefix_lse_dev, suffix_dev, suffix_lse_dev, mut out] =
        engine.each_ref().map(|buffer| buffer.borrow(&backend, &stream));
    let on = engine_stream(&backend, &stream);
    let args = |out: &mut CudaBuffer, prefix_lse: &CudaBuffer| -> decode_attn_core::Result<()> {
        backend.merge_attn_states_on(
            &on,
            decode_attn_core::MergeArgs {
                num_tokens: tokens,
                num_heads: heads,
                head_dim: dim,
                dtype: DType::Bf16,
                prefix: &prefix_dev,
                prefix_lse,
                suffix: &suffix_dev,
                suffix_lse: &suffix_lse_dev,
                out,
                out_lse: None,
            },
        )
    };
    let shifted = engine[1].address(&stream) + 2;
    // SAFETY: `engine` keeps the allocation alive past the last use.
    let misaligned = unsafe { backend.borrow_device_memory(shifted, tokens * heads * 4) }.unwrap();
    let err = args(&mut out, &misaligned).unwrap_err();
    assert_eq!(err, Error::Misaligned { name: "prefix_lse", address: shifted, alignment: 4 });
    assert_eq!(engine[4].read(&stream), nan_bytes(DType::Bf16, n * 2), "the output was written");

    args(&mut out, &prefix_lse_dev).unwrap();
    let got = dtype::decode(DType::Bf16, &engine[4].read(&stream));
    let (want, _) = host_merge(DType::Bf16, dim, &prefix, &prefix_lse, &suffix, &suffix_lse);
    let want: Vec<f64> = want.iter().map(|&x| x as f64).collect();
    let err = relative_error(&got, &want);
    assert!(err < 1e-2, "relerr {err}");
}
