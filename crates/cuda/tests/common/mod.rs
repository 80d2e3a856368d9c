//! Helpers the GPU test binaries share: device copies of a host batch, the
//! NaN poison, downloads and the host merge.

// Each test binary uses its own part of this module.
#![allow(dead_code)]

use decode_attn_core::synth::{i32_bytes, HostBatch, HostIndex};
use decode_attn_core::{dtype, DType, DecodeArgs, DecodeAttention, DeviceBuffer, KvIndexBuffers};
use decode_attn_cuda::{CudaBackend, CudaBuffer};

/// Device copies of a host batch.
pub struct DeviceBatch {
    pub q: CudaBuffer,
    pub k: CudaBuffer,
    pub v: CudaBuffer,
    pub seq_lens: CudaBuffer,
    pub index: (CudaBuffer, CudaBuffer, usize),
    pub workspace: CudaBuffer,
    pub out: CudaBuffer,
}

pub fn upload(backend: &CudaBackend, bytes: &[u8]) -> CudaBuffer {
    let mut buffer = backend.alloc(bytes.len()).unwrap();
    backend.upload(&mut buffer, bytes).unwrap();
    buffer
}

impl DeviceBatch {
    pub fn new(backend: &CudaBackend, batch: &HostBatch, workspace_bytes: u64) -> Self {
        let index = match &batch.index {
            HostIndex::BlockTable { table, max_blocks_per_seq } => {
                (upload(backend, &i32_bytes(table)), backend.alloc(0).unwrap(), *max_blocks_per_seq)
            }
            HostIndex::TokenIndices { indptr, indices } => {
                (upload(backend, &i32_bytes(indptr)), upload(backend, &i32_bytes(indices)), 0)
            }
        };
        let out_bytes = batch.problem.out_bytes();
        DeviceBatch {
            q: upload(backend, &batch.q),
            k: upload(backend, &batch.k_cache),
            v: upload(backend, &batch.v_cache),
            seq_lens: upload(backend, &i32_bytes(&batch.seq_lens)),
            index,
            workspace: backend.alloc(workspace_bytes as usize).unwrap(),
            out: upload(backend, &nan_bytes(batch.problem.dtypes.out, out_bytes)),
        }
    }

    pub fn args(&mut self, block_table: bool) -> DecodeArgs<'_, CudaBuffer> {
        let kv_index = if block_table {
            KvIndexBuffers::BlockTable { table: &self.index.0, max_blocks_per_seq: self.index.2 }
        } else {
            KvIndexBuffers::TokenIndices { indptr: &self.index.0, indices: &self.index.1 }
        };
        DecodeArgs {
            q: &self.q,
            k_cache: &self.k,
            v_cache: &self.v,
            seq_lens: &self.seq_lens,
            kv_index,
            workspace: &mut self.workspace,
            out: &mut self.out,
            lse: None,
            softmax_scale: None,
        }
    }
}

pub fn nan_bytes(dtype: DType, bytes: usize) -> Vec<u8> {
    dtype::encode(dtype, &vec![f32::NAN; bytes / dtype.size_bytes()])
}

pub fn download_f32(backend: &CudaBackend, buffer: &CudaBuffer, dtype: DType) -> Vec<f32> {
    let mut bytes = vec![0u8; buffer.len_bytes()];
    backend.download(buffer, &mut bytes).unwrap();
    dtype::decode(dtype, &bytes)
}

/// The host merge of two states (`[rows, dim]` in `dtype`, rounded as the
/// device reads them) by their natural-log LSEs: the merged rows and LSEs.
pub fn host_merge(
    dtype: DType,
    dim: usize,
    prefix: &[f32],
    prefix_lse: &[f32],
    suffix: &[f32],
    suffix_lse: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let p_in = dtype::decode(dtype, &dtype::encode(dtype, prefix));
    let s_in = dtype::decode(dtype, &dtype::encode(dtype, suffix));
    let mut want = vec![0f32; prefix.len()];
    let mut want_lse = vec![0f32; prefix_lse.len()];
    for row in 0..prefix_lse.len() {
        let r = row * dim..(row + 1) * dim;
        want_lse[row] = decode_attn_core::merge::merge_state(
            &mut want[r.clone()],
            &p_in[r.clone()],
            prefix_lse[row],
            &s_in[r],
            suffix_lse[row],
        );
    }
    (want, want_lse)
}
