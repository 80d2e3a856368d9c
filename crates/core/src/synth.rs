//! Synthetic batches for tests, `check` and `bench`: random Q/K/V, scattered
//! physical blocks, and the host-side index structures of both layouts.
//!
//! A small built-in generator (SplitMix64) keeps this crate free of `rand`
//! and makes every batch reproducible from its seed.

use crate::{dtype, map_to_kernel_blocks, DecodeProblem, KvLayout};

/// SplitMix64: tiny, fast, and good enough to fill tensors and shuffle blocks.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    pub fn next_signed(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// Where each sequence's KV slots are, on the host.
#[derive(Clone, Debug, PartialEq)]
pub enum HostIndex {
    BlockTable { table: Vec<i32>, max_blocks_per_seq: usize },
    TokenIndices { indptr: Vec<i32>, indices: Vec<i32> },
}

/// One decode call's inputs on the host, as little-endian bytes.
#[derive(Clone, Debug)]
pub struct HostBatch {
    pub problem: DecodeProblem,
    pub q: Vec<u8>,
    pub k_cache: Vec<u8>,
    pub v_cache: Vec<u8>,
    pub seq_lens: Vec<i32>,
    pub index: HostIndex,
    pub num_slots: usize,
}

impl HostBatch {
    /// The pool [`HostBatch::random`] lays out for `problem`: its allocator
    /// blocks (or pages), the sequences' own plus a quarter more spare and
    /// one more, and the slots in each.
    pub fn pool_blocks(problem: &DecodeProblem) -> (usize, usize) {
        let block_slots = match problem.layout {
            KvLayout::BlockTable { allocator_block_size, .. } => allocator_block_size,
            KvLayout::TokenIndices { page_size } => page_size,
        };
        let used: usize = problem.seq_lens.iter().map(|&s| (s as usize).div_ceil(block_slots)).sum();
        (used + used / 4 + 1, block_slots)
    }

    /// Random data in [-1, 1); physical blocks (or pages) shuffled over a pool
    /// with spare blocks, so that no sequence's KV is contiguous by accident.
    pub fn random(problem: &DecodeProblem, seed: u64) -> HostBatch {
        let mut rng = SplitMix64::new(seed);
        let shape = problem.shape;
        let seq_lens: Vec<i32> = problem.seq_lens.iter().map(|&s| s as i32).collect();
        let (pool, block_slots) = Self::pool_blocks(problem);
        let index = match problem.layout {
            KvLayout::BlockTable { kernel_block_size, allocator_block_size } => {
                let blocks_per_seq: Vec<usize> =
                    problem.seq_lens.iter().map(|&s| (s as usize).div_ceil(allocator_block_size)).collect();
                let stride = blocks_per_seq.iter().copied().max().unwrap_or(0).max(1);
                let mut ids: Vec<i32> = (0..pool as i32).collect();
                rng.shuffle(&mut ids);
                let mut next = ids.into_iter();
                let mut table = vec![-1i32; problem.num_seqs() * stride];
                for (seq, &n) in blocks_per_seq.iter().enumerate() {
                    for j in 0..n {
                        table[seq * stride + j] = next.next().expect("pool has spare blocks");
                    }
                }
                let (table, max_blocks_per_seq) =
                    map_to_kernel_blocks(&table, stride, allocator_block_size, kernel_block_size)
                        .expect("the problem's layout was validated");
                HostIndex::BlockTable { table, max_blocks_per_seq }
            }
            KvLayout::TokenIndices { page_size } => {
                let pages_per_seq: Vec<usize> =
                    problem.seq_lens.iter().map(|&s| (s as usize).div_ceil(page_size)).collect();
                let mut pages: Vec<usize> = (0..pool).collect();
                rng.shuffle(&mut pages);
                let mut next = pages.into_iter();
                let mut indptr = vec![0i32];
                let mut indices = Vec::new();
                for (&s, &n) in problem.seq_lens.iter().zip(&pages_per_seq) {
                    let seq_pages: Vec<usize> = (0..n).map(|_| next.next().expect("spare pages")).collect();
                    for t in 0..s as usize {
                        indices.push((seq_pages[t / page_size] * page_size + t % page_size) as i32);
                    }
                    indptr.push(indices.len() as i32);
                }
                HostIndex::TokenIndices { indptr, indices }
            }
        };
        let num_slots = pool * block_slots;
        let mut fill = |len: usize, dtype| {
            let values: Vec<f32> = (0..len).map(|_| rng.next_signed()).collect();
            dtype::encode(dtype, &values)
        };
        let q_len = problem.num_seqs() * shape.num_q_heads * shape.head_dim;
        let kv_len = num_slots * shape.num_kv_heads * shape.head_dim;
        let q = fill(q_len, problem.dtypes.q);
        let k_cache = fill(kv_len, problem.dtypes.kv);
        let v_cache = fill(kv_len, problem.dtypes.kv);
        HostBatch { problem: problem.clone(), q, k_cache, v_cache, seq_lens, index, num_slots }
    }

    /// Sets every K and V slot that holds no token of any sequence to NaN.
    /// An engine's free or stale slots may hold anything, and a kernel that
    /// copies whole tiles also copies the slots past a sequence's end: if any
    /// of them reaches the output (as 0 * NaN in P V), the output is NaN.
    pub fn poison_unused_slots(&mut self) {
        let mut used = vec![false; self.num_slots];
        for (seq, &len) in self.seq_lens.iter().enumerate() {
            for t in 0..len.max(0) as usize {
                if let Some(slot) = self.slot(seq, t) {
                    used[slot] = true;
                }
            }
        }
        let shape = self.problem.shape;
        let nan_row = dtype::encode(self.problem.dtypes.kv, &vec![f32::NAN; shape.num_kv_heads * shape.head_dim]);
        for (slot, _) in used.iter().enumerate().filter(|(_, &used)| !used) {
            let at = slot * nan_row.len()..(slot + 1) * nan_row.len();
            self.k_cache[at.clone()].copy_from_slice(&nan_row);
            self.v_cache[at].copy_from_slice(&nan_row);
        }
    }

    /// The same data and index at other lengths, as a captured graph replayed
    /// after new lengths were uploaded sees the batch (a block-table row
    /// addresses only the tokens its blocks hold).
    pub fn at_lengths(&self, lens: &[u32]) -> HostBatch {
        let mut batch = self.clone();
        batch.problem.seq_lens = lens.to_vec();
        batch.seq_lens = lens.iter().map(|&len| len as i32).collect();
        batch
    }

    /// Overwrites `edits` entries, each picked at random among the lengths,
    /// the block table, kv_indptr and kv_indices, with garbage: signs,
    /// extremes, the edges of the pool, neighbours of what was there, or
    /// anything. Returns `(what, index, old, new)` per edit, for messages. A
    /// backend must refuse such a batch, or (a GPU, which cannot read its
    /// indices on the host) write NaN for the sequences it spoils, or decode
    /// what the entries now say, as [`HostBatch::slot`] reads them.
    pub fn scribble(&mut self, rng: &mut SplitMix64, edits: usize) -> Vec<(&'static str, usize, i32, i32)> {
        let kernel_block_size = match self.problem.layout {
            KvLayout::BlockTable { kernel_block_size, .. } => kernel_block_size,
            KvLayout::TokenIndices { page_size } => page_size,
        };
        let num_blocks = (self.num_slots / kernel_block_size.max(1)) as i32;
        let mut done = Vec::new();
        for _ in 0..edits {
            let (what, entries): (&'static str, &mut Vec<i32>) = match (&mut self.index, rng.below(3)) {
                (_, 0) => ("seq_lens", &mut self.seq_lens),
                (HostIndex::BlockTable { table, .. }, _) => ("block_table", table),
                (HostIndex::TokenIndices { indptr, .. }, 1) => ("kv_indptr", indptr),
                (HostIndex::TokenIndices { indices, .. }, _) => ("kv_indices", indices),
            };
            if entries.is_empty() {
                continue;
            }
            let at = rng.below(entries.len());
            let old = entries[at];
            let new = match rng.below(10) {
                0 => -1,
                1 => i32::MIN,
                2 => i32::MAX,
                3 => 0,
                4 => old.wrapping_add(1),
                5 => old.wrapping_sub(1),
                6 => self.num_slots as i32,
                7 => num_blocks,
                8 => num_blocks - 1,
                _ => rng.next_u64() as i32,
            };
            entries[at] = new;
            done.push((what, at, old, new));
        }
        done
    }

    /// The slot of token `t` of sequence `seq`, or `None` where the index
    /// (edited by a test, or lengths that outgrew their blocks) points
    /// outside itself or the pool: the kernels' guard cases.
    pub fn slot(&self, seq: usize, t: usize) -> Option<usize> {
        let slot = match (&self.index, self.problem.layout) {
            (HostIndex::BlockTable { table, max_blocks_per_seq }, KvLayout::BlockTable { kernel_block_size, .. }) => {
                if t / kernel_block_size >= *max_blocks_per_seq {
                    return None;
                }
                let block = usize::try_from(*table.get(seq * max_blocks_per_seq + t / kernel_block_size)?).ok()?;
                block * kernel_block_size + t % kernel_block_size
            }
            (HostIndex::TokenIndices { indptr, indices }, _) => {
                let start = usize::try_from(*indptr.get(seq)?).ok()?;
                usize::try_from(*indices.get(start + t)?).ok()?
            }
            // HostBatch::random pairs a block table with a block-table layout only.
            (HostIndex::BlockTable { .. }, _) => return None,
        };
        (slot < self.num_slots).then_some(slot)
    }
}

/// `i32` values as little-endian bytes (block tables, lengths, indices).
pub fn i32_bytes(values: &[i32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `||out - reference|| / ||reference||`; infinite when any output is not finite.
/// A zero reference compares absolutely.
pub fn relative_error(out: &[f32], reference: &[f64]) -> f64 {
    assert_eq!(out.len(), reference.len(), "relative_error needs equal lengths");
    let mut diff = 0.0f64;
    let mut norm = 0.0f64;
    for (&o, &r) in out.iter().zip(reference) {
        if !o.is_finite() {
            return f64::INFINITY;
        }
        diff += (o as f64 - r).powi(2);
        norm += r * r;
    }
    if norm == 0.0 {
        diff.sqrt()
    } else {
        (diff / norm).sqrt()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AttentionShape, DType, DTypes};

    fn problem(layout: KvLayout, lens: Vec<u32>) -> DecodeProblem {
        DecodeProblem::new(AttentionShape::new(4, 2, 64).unwrap(), DTypes::uniform(DType::Bf16), layout, lens).unwrap()
    }

    /// The list of entries `scribble` names `what`.
    fn entries<'a>(batch: &'a mut HostBatch, what: &str) -> &'a mut Vec<i32> {
        match (&mut batch.index, what) {
            (_, "seq_lens") => &mut batch.seq_lens,
            (HostIndex::BlockTable { table, .. }, "block_table") => table,
            (HostIndex::TokenIndices { indptr, .. }, "kv_indptr") => indptr,
            (HostIndex::TokenIndices { indices, .. }, "kv_indices") => indices,
            (index, _) => panic!("an edit of {what} in {index:?}"),
        }
    }

    #[test]
    fn scribble_changes_exactly_the_entries_it_reports() {
        for (seed, layout) in [KvLayout::block_table(16), KvLayout::token_indices(4)].into_iter().enumerate() {
            let clean = HostBatch::random(&problem(layout, vec![0, 40, 300]), 3);
            let mut rng = SplitMix64::new(seed as u64);
            for _ in 0..50 {
                let mut batch = clean.clone();
                let edits = batch.scribble(&mut rng, 3);
                assert_eq!(edits.len(), 3);
                let mut expected = clean.clone();
                for &(what, at, old, new) in &edits {
                    let list = entries(&mut expected, what);
                    assert_eq!(list[at], old, "{layout}: {what}[{at}]");
                    list[at] = new;
                }
                assert_eq!(batch.seq_lens, expected.seq_lens);
                assert_eq!(format!("{:?}", batch.index), format!("{:?}", expected.index));
            }
        }
    }

    #[test]
    fn every_token_gets_a_distinct_slot() {
        for layout in [
            KvLayout::block_table(16),
            KvLayout::BlockTable { kernel_block_size: 16, allocator_block_size: 64 },
            KvLayout::token_indices(1),
            KvLayout::token_indices(8),
        ] {
            let batch = HostBatch::random(&problem(layout, vec![0, 1, 17, 100]), 7);
            let mut seen = std::collections::HashSet::new();
            for (seq, &s) in batch.seq_lens.iter().enumerate() {
                for t in 0..s as usize {
                    let slot = batch.slot(seq, t).expect("a random batch's slots are valid");
                    assert!(slot < batch.num_slots, "{layout}: slot {slot}");
                    assert!(seen.insert(slot), "{layout}: slot {slot} used twice");
                }
            }
            assert_eq!(seen.len(), 118);
        }
    }

    #[test]
    fn a_batch_at_other_lengths_keeps_its_data_and_index() {
        let batch = HostBatch::random(&problem(KvLayout::block_table(16), vec![100, 40]), 3);
        let shorter = batch.at_lengths(&[17, 0]);
        assert_eq!(
            (shorter.problem.seq_lens.as_slice(), shorter.seq_lens.as_slice()),
            ([17, 0].as_slice(), [17, 0].as_slice())
        );
        assert_eq!((&shorter.q, &shorter.k_cache, &shorter.index), (&batch.q, &batch.k_cache, &batch.index));
        assert_eq!(shorter.slot(0, 16), batch.slot(0, 16));
    }

    #[test]
    fn poisoned_batches_keep_every_token_and_nothing_else() {
        let problem = DecodeProblem::new(
            AttentionShape::new(4, 2, 64).unwrap(),
            DTypes::uniform(DType::Bf16),
            KvLayout::block_table(16),
            vec![17, 0, 40],
        )
        .unwrap();
        let clean = HostBatch::random(&problem, 9);
        let mut poisoned = clean.clone();
        poisoned.poison_unused_slots();
        let row = 2 * 64 * 2;
        let mut used = 0;
        for slot in 0..clean.num_slots {
            let at = slot * row..(slot + 1) * row;
            let holds_token =
                (0..3).any(|seq| (0..problem.seq_lens[seq] as usize).any(|t| clean.slot(seq, t) == Some(slot)));
            if holds_token {
                used += 1;
                assert_eq!(poisoned.k_cache[at.clone()], clean.k_cache[at.clone()], "slot {slot}");
                assert_eq!(poisoned.v_cache[at.clone()], clean.v_cache[at], "slot {slot}");
            } else {
                for (pool, cache) in [("K", &poisoned.k_cache), ("V", &poisoned.v_cache)] {
                    let values = dtype::decode(DType::Bf16, &cache[at.clone()]);
                    assert!(values.iter().all(|x| x.is_nan()), "{pool} slot {slot} should be NaN");
                }
            }
        }
        assert_eq!(used, 57);
        assert!(clean.num_slots > used, "the pool has spare slots to poison");
    }

    #[test]
    fn relative_error_flags_nan() {
        assert_eq!(relative_error(&[1.0, f32::NAN], &[1.0, 2.0]), f64::INFINITY);
        assert!(relative_error(&[1.0, 2.0], &[1.0, 2.0]) == 0.0);
    }
}
