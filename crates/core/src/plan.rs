//! The planner: pure host code that decides how one decode call is cut up.
//!
//! Every backend executes a plan the same way. The grid is
//! `(num_seqs, num_kv_heads, num_splits)`: one CTA (or CPU task) per sequence,
//! KV head and split, serving the whole query-head group of that KV head (GQA
//! packing, so each KV byte is read once); a group wider than one CTA serves
//! ([`DeviceProps::max_query_heads_per_cta`]) takes several CTAs per KV head. A sequence of `s` tokens has
//! `tiles = ceil(s / 16)` tiles, and the [`SplitRule`] gives it
//!
//! ```text
//! splits          = short_splits  if 0 < short_splits < num_splits and tiles < short_below_tiles
//!                   num_splits    otherwise
//! tiles_per_split = max(min_tiles_per_split, ceil(tiles / splits))
//! active_splits   = ceil(tiles / tiles_per_split)        (0 when s = 0)
//! ```
//!
//! Split `j` covers tokens `[j * tiles_per_split * 16, (j + 1) * tiles_per_split * 16)`;
//! CTAs with `j >= active_splits` exit at once. The rule reads only the
//! sequence's own length, which the kernels read from device memory, so a
//! captured CUDA graph replays correctly when lengths change: the grid is
//! fixed, the counts are computed on the device, and the reducer reads exactly
//! the partial rows that the producers of that replay wrote.
//!
//! Policies choose `num_splits` and `min_tiles_per_split`; only `auto` sets
//! `short_splits`, for the shorter lengths a plan of equal lengths may be
//! replayed at:
//! `vllm`, `sglang`, `fixed:N`, `deterministic:TILE` and `auto` (ours).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::{AttentionShape, DecodeProblem, DeviceProps, Error, Result, MAX_SEQ_LEN, TILE_TOKENS};

/// The largest split count any policy may ask for.
pub const MAX_SPLITS: u32 = 1024;

/// Tiles of the longest sequence ([`MAX_SEQ_LEN`] tokens).
pub const MAX_SEQ_TILES: u32 = MAX_SEQ_LEN.div_ceil(TILE_TOKENS);

/// The most sequences a batch rule's kernel counts in each CTA (the CUDA
/// packed launches: decode_params.h, DECODE_PACK_MAX_SEQS).
pub const BATCH_MAX_SEQS: usize = 2048;

/// Partial rows per query head a batch rule reserves for the whole batch:
/// `num_splits` is `BATCH_ROWS_PER_HEAD / num_seqs` (at least the plan's own
/// count), so that one long sequence among short ones can be cut as finely
/// as the batch's mean length asks. 2048 rows of `head_dim + 2` floats:
/// 34 MB of workspace for Llama-3-8B's 32 query heads at d = 128, whatever
/// the batch size.
pub const BATCH_ROWS_PER_HEAD: u32 = 2048;

/// The most (sequence, split) pairs a batch rule may make at any lengths,
/// `num_seqs * (batch_splits + 1)`: the CUDA launch gives each its own CTA
/// along one grid dimension (65535 at most).
pub const BATCH_MAX_PAIRS: u64 = 65535;

/// `auto` gives each warp of a CTA its own split (where the kernel can,
/// [`DeviceProps::splits_per_cta`]) only while a query head's partial rows
/// stay this few: past it the reduce, one CTA per query head, reads more
/// rows than the warps' merge inside the CTA costs.
pub const WARP_SPLIT_MAX_ROWS: u32 = 64;

/// ... and only where each warp's split has at least this many tiles, and
/// the grid is one CTA per multiprocessor or fewer. On the H200 (A/B over
/// the peers' grid, docs/PERFORMANCE.md version 21) a split per warp was
/// 0.1-4.1% faster on such grids, but 3.8-6.3% slower where warps had one
/// or two tiles (the reduce reads four times the rows for little saved) and
/// 0.4-2.3% slower on grids of two CTAs per multiprocessor (not understood).
pub const WARP_SPLIT_MIN_TILES: u32 = 4;

fn cdiv(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// How many splits, chosen how.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum Policy {
    /// Ours: per sequence, from the SM count, the unsplit grid, each length and
    /// a cost model of partial-state traffic against idle multiprocessors. A
    /// ragged batch is cut by a split length (chunks of the longest
    /// sequence's n-th), so short sequences stay whole and long ones spread.
    #[default]
    Auto,
    /// vLLM 0.33 `unified_attention`: 16 segments of 16-token tiles iff every
    /// sequence is a one-token decode, `num_seqs <= 128 / num_kv_heads` and
    /// batch invariance is off.
    Vllm { batch_invariant: bool },
    /// SGLang 0.5.23's on-device heuristic (`get_num_kv_splits`), capped at `max_kv_splits`.
    Sglang { max_kv_splits: u32 },
    /// Exactly this many splits for every sequence long enough to have them.
    Fixed { splits: u32 },
    /// Splits of `tile_tokens` tokens: a sequence's result is a function of its
    /// own data alone, whoever else is in the batch.
    Deterministic { tile_tokens: u32 },
}

impl FromStr for Policy {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let (name, arg) = match text.split_once(':') {
            Some((name, arg)) => (name, Some(arg)),
            None => (text, None),
        };
        let number = |why: &'static str| -> Result<u32> {
            let arg = arg.ok_or(Error::InvalidPolicy { policy: text.to_string(), why })?;
            arg.parse::<u32>().map_err(|_| Error::InvalidPolicy { policy: text.to_string(), why })
        };
        let policy = match name {
            "auto" if arg.is_none() => Policy::Auto,
            "vllm" => match arg {
                None => Policy::Vllm { batch_invariant: false },
                Some("batch-invariant") => Policy::Vllm { batch_invariant: true },
                Some(_) => {
                    return Err(Error::InvalidPolicy {
                        policy: text.into(),
                        why: "the only vllm option is vllm:batch-invariant",
                    })
                }
            },
            "sglang" => Policy::Sglang {
                max_kv_splits: if arg.is_some() { number("sglang:N needs a split cap N >= 1")? } else { 8 },
            },
            "fixed" => Policy::Fixed { splits: number("fixed:N needs a split count N >= 1")? },
            "deterministic" => Policy::Deterministic { tile_tokens: number("deterministic:TILE needs a token count")? },
            _ => return Err(Error::UnknownPolicy(text.to_string())),
        };
        policy.validate(text)?;
        Ok(policy)
    }
}

impl Policy {
    fn validate(&self, text: &str) -> Result<()> {
        let bad = |why| Err(Error::InvalidPolicy { policy: text.to_string(), why });
        match *self {
            Policy::Sglang { max_kv_splits } if max_kv_splits == 0 || max_kv_splits > MAX_SPLITS => {
                bad("the split cap must be between 1 and 1024")
            }
            Policy::Fixed { splits } if splits == 0 || splits > MAX_SPLITS => {
                bad("the split count must be between 1 and 1024")
            }
            Policy::Deterministic { tile_tokens }
                if tile_tokens == 0 || tile_tokens % TILE_TOKENS != 0 || tile_tokens / TILE_TOKENS > MAX_SEQ_TILES =>
            {
                bad("the split length must be a positive multiple of 16 tokens, at most 2^31")
            }
            _ => Ok(()),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Policy::Auto => f.write_str("auto"),
            Policy::Vllm { batch_invariant: false } => f.write_str("vllm"),
            Policy::Vllm { batch_invariant: true } => f.write_str("vllm:batch-invariant"),
            Policy::Sglang { max_kv_splits } => write!(f, "sglang:{max_kv_splits}"),
            Policy::Fixed { splits } => write!(f, "fixed:{splits}"),
            Policy::Deterministic { tile_tokens } => write!(f, "deterministic:{tile_tokens}"),
        }
    }
}

/// The split rule every backend evaluates (the GPU on the device, from the
/// lengths it reads, so a captured graph replays correctly at other lengths).
///
/// Per sequence (`batch_splits == 0`): a sequence of `tiles` tiles is cut
/// into `splits_for(tiles)` splits of at least `min_tiles_per_split` tiles.
/// By the batch (`batch_splits > 0`): every sequence is cut at the split
/// length the per-sequence rule, with `batch_splits` in place of
/// `num_splits`, gives the batch's mean length (tiles summed over the
/// batch, divided by its sequences, rounded up), and into no more than
/// `num_splits` splits. At equal lengths the two cut alike; replayed with a
/// ragged batch, the batch rule cuts a long sequence among short ones into
/// many splits where the per-sequence rule would leave it to a few CTAs
/// (`SplitRule::for_batch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitRule {
    /// The grid's split dimension: no sequence gets more. (Partial rows per
    /// query head and sequence, so the workspace's stride.)
    pub num_splits: u32,
    /// No split gets fewer tiles than this (except a sequence's last).
    pub min_tiles_per_split: u32,
    /// A sequence of fewer than `short_below_tiles` tiles is cut into this
    /// many splits instead of `num_splits` (0: every sequence into
    /// `num_splits`). `auto` sets it where a plan of equal lengths, replayed
    /// at shorter ones (a captured graph), serves those better with fewer.
    #[serde(default)]
    pub short_splits: u32,
    #[serde(default)]
    pub short_below_tiles: u32,
    /// 0: the per-sequence rule. Otherwise the rule cuts by the batch's mean
    /// length, into this many splits where `num_splits` would be used.
    #[serde(default)]
    pub batch_splits: u32,
}

impl SplitRule {
    /// `num_splits` splits of at least `min_tiles_per_split` tiles for every length.
    pub const fn new(num_splits: u32, min_tiles_per_split: u32) -> SplitRule {
        SplitRule { num_splits, min_tiles_per_split, short_splits: 0, short_below_tiles: 0, batch_splits: 0 }
    }

    /// Refuses a rule that no planner makes (a plan is plain data, and may
    /// come edited from JSON): no splits or more than [`MAX_SPLITS`], or a
    /// tile count past the longest sequence's, where the arithmetic of a
    /// split's tokens would leave 32 bits.
    pub fn check(&self) -> Result<()> {
        let (splits, tiles) = (MAX_SPLITS as u64, MAX_SEQ_TILES as u64);
        Error::check_range("the split rule's num_splits", self.num_splits as u64, 1, splits)?;
        Error::check_range("the split rule's min_tiles_per_split", self.min_tiles_per_split as u64, 0, tiles)?;
        Error::check_range("the split rule's short_splits", self.short_splits as u64, 0, splits)?;
        Error::check_range("the split rule's short_below_tiles", self.short_below_tiles as u64, 0, tiles)?;
        Error::check_range("the split rule's batch_splits", self.batch_splits as u64, 0, splits)
    }

    /// Whether the rule cuts by the batch (`batch_splits > 0`): evaluate it
    /// through [`SplitRule::for_batch`].
    pub const fn is_batch(&self) -> bool {
        self.batch_splits > 0
    }

    /// The per-sequence rule this rule is for the batch of `seq_lens`: itself
    /// for a per-sequence rule; for a batch rule, `num_splits` splits of at
    /// least the split length of the batch's mean length. The kernels compute
    /// the same from the lengths they read (a bad sequence's length counts as
    /// 0 tiles there; here every length is taken as given).
    pub fn for_batch(&self, seq_lens: &[u32]) -> SplitRule {
        if !self.is_batch() {
            return *self;
        }
        let tiles: u64 = seq_lens.iter().map(|&len| cdiv(len as u64, TILE_TOKENS as u64)).sum();
        let mean_tiles = if seq_lens.is_empty() { 0 } else { cdiv(tiles, seq_lens.len() as u64) };
        SplitRule::new(self.num_splits, self.mean_tiles_per_split(mean_tiles as u32))
    }

    /// The most (sequence, split) pairs a batch rule makes for `num_seqs`
    /// sequences at any lengths, `num_seqs * (batch_splits + 1)`: each
    /// sequence's count rounds its share of the batch's tiles up by less
    /// than one, and the split length is at least the mean's over
    /// `batch_splits` splits (the CUDA launch gives each its own CTA).
    pub fn batch_pair_bound(&self, num_seqs: usize) -> u64 {
        num_seqs as u64 * (self.batch_splits as u64 + 1)
    }

    /// The split length a batch rule gives a batch of `mean_tiles` tiles on
    /// average: the per-sequence rule's, with `batch_splits` splits.
    pub fn mean_tiles_per_split(&self, mean_tiles: u32) -> u32 {
        let per_seq = SplitRule { num_splits: self.batch_splits.max(1), batch_splits: 0, ..*self };
        per_seq.tiles_per_split(mean_tiles)
    }

    /// The splits a sequence of `tiles` tiles is cut into (before the floor
    /// of `min_tiles_per_split` merges some), by the per-sequence rule (for
    /// a batch rule, as if the sequence were its whole batch).
    pub fn splits_for(&self, tiles: u32) -> u32 {
        let num_splits = if self.is_batch() { self.batch_splits } else { self.num_splits.max(1) };
        if self.short_splits > 0 && self.short_splits < num_splits && tiles < self.short_below_tiles {
            self.short_splits
        } else {
            num_splits
        }
    }

    fn tiles_per_split(&self, tiles: u32) -> u32 {
        let splits = self.splits_for(tiles);
        self.min_tiles_per_split.max(1).max(cdiv(tiles as u64, splits as u64) as u32)
    }

    /// How a sequence of `seq_len` tokens is cut. A batch rule cuts it as if
    /// it were its whole batch: resolve it with [`SplitRule::for_batch`] first
    /// to cut a sequence of a batch.
    pub fn split(&self, seq_len: u32) -> SeqSplit {
        let tiles = cdiv(seq_len as u64, TILE_TOKENS as u64) as u32;
        let rule =
            if self.is_batch() { SplitRule::new(self.num_splits, self.mean_tiles_per_split(tiles)) } else { *self };
        let tiles_per_split = rule.tiles_per_split(tiles);
        let active_splits = cdiv(tiles as u64, tiles_per_split as u64) as u32;
        SeqSplit { seq_len, tiles, tiles_per_split, active_splits }
    }
}

/// How one sequence is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeqSplit {
    pub seq_len: u32,
    pub tiles: u32,
    pub tiles_per_split: u32,
    pub active_splits: u32,
}

impl SeqSplit {
    /// Token range `[start, end)` of split `j` (empty for surplus splits).
    pub fn token_range(&self, split: u32) -> (u32, u32) {
        // In 64 bits: a split's end may lie past u32 where the sequence does not.
        let per = self.tiles_per_split as u64 * TILE_TOKENS as u64;
        let start = (split as u64 * per).min(self.seq_len as u64) as u32;
        let end = ((split as u64 + 1) * per).min(self.seq_len as u64) as u32;
        (start, end)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KernelKind {
    /// One CTA per (sequence, KV head) writes the output directly.
    Unsplit,
    /// Split-K: partial outputs with their max and sum, then a reduce.
    Split,
}

/// What the chosen policy computed, in its own terms, so that `plan` can show
/// the peer's arithmetic beside ours.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "policy", rename_all = "snake_case")]
pub enum PolicyDetail {
    Vllm {
        block_m: u32,
        block_q: u32,
        num_q_blocks: u32,
        num_segments: u32,
        /// vLLM's own launch grid: `(q blocks, kv heads, segments)` or `(q blocks, kv heads)`.
        vllm_grid: Vec<u32>,
        split: bool,
    },
    Sglang {
        max_kv_splits: u32,
        ext_device_core_count: u32,
        token_grid: u32,
        kv_chunk_size_1: u32,
        kv_chunk_size_2: u32,
        num_kv_splits: Vec<u32>,
    },
    Fixed {
        splits: u32,
    },
    Deterministic {
        tile_tokens: u32,
    },
    Auto {
        /// Estimated microseconds of the chosen split count and of the unsplit grid.
        estimated_us: f64,
        estimated_unsplit_us: f64,
    },
}

/// Everything a backend needs to launch, and everything a person needs to see why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub problem: DecodeProblem,
    pub policy: Policy,
    pub num_sms: u32,
    pub kernel: KernelKind,
    pub use_split: bool,
    pub rule: SplitRule,
    /// `(num_seqs, num_kv_heads * head groups, ceil(num_splits /
    /// splits_per_cta))`; head groups: [`DeviceProps::head_groups`].
    pub grid: [u32; 3],
    /// Splits one CTA takes, one per warp (1: the CTA's warps share one
    /// split and merge their partial states before storing one row).
    #[serde(default = "crate::backend::one")]
    pub splits_per_cta: u32,
    /// CTAs launched: the product of `grid`.
    pub blocks: u64,
    /// Splits of the longest sequence, the most any sequence gets: partial
    /// rows per query head (the grid's split dimension times `splits_per_cta`).
    pub num_splits: u32,
    /// For the longest sequence.
    pub tiles_per_split: u32,
    /// For the longest sequence.
    pub active_splits: u32,
    /// CTAs of the unsplit grid: `num_seqs * num_kv_heads * head groups` (G_2D).
    pub unsplit_blocks: u64,
    /// S* = ceil(num_sms / G_2D): the split count that first fills the machine.
    pub first_wave_splits: u32,
    pub per_seq: Vec<SeqSplit>,
    /// Scratch reserved per (token, query head): `num_splits * (head_dim + 2) * 4`.
    pub partial_bytes_per_token_head: u64,
    /// Scratch of the whole batch: `num_seqs * num_q_heads * partial_bytes_per_token_head`.
    pub partial_bytes: u64,
    /// Partial state actually written and read back by this batch (active splits only).
    pub partial_traffic_bytes: u64,
    /// Bytes of workspace the caller must pass to `decode` (0 when unsplit).
    pub workspace_bytes: u64,
    /// K and V bytes read: `2 * sum(s) * num_kv_heads * head_dim * b`.
    pub kv_bytes: u64,
    pub detail: PolicyDetail,
    pub reason: String,
}

impl Plan {
    /// The (sequence, split) pairs with tokens to read: every sequence's
    /// active splits. Of the grid's `num_seqs * num_splits`, the rest are
    /// empty CTAs a plain launch still starts (one long sequence among short
    /// ones leaves most of them empty; a backend may launch only these).
    pub fn active_pairs(&self) -> u64 {
        self.per_seq.iter().map(|s| s.active_splits as u64).sum()
    }

    /// For a split plan that leaves some of its grid's (sequence, split)
    /// pairs empty, how many are active of how many; `None` where every pair
    /// is active (or none is).
    pub fn sparse_pairs(&self) -> Option<SparsePairs> {
        let num_seqs = self.problem.num_seqs() as u64;
        let grid_pairs = num_seqs * self.num_splits as u64;
        let active = self.active_pairs();
        let sparse = self.num_splits > 1 && self.per_seq.len() as u64 == num_seqs && active > 0 && active < grid_pairs;
        sparse.then_some(SparsePairs { active, num_seqs, num_splits: self.num_splits })
    }
}

/// [`Plan::sparse_pairs`]: `active` of the `num_seqs x num_splits` pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SparsePairs {
    pub active: u64,
    pub num_seqs: u64,
    pub num_splits: u32,
}

impl SparsePairs {
    /// Empty CTAs a plain grid starts per active pair (what the CUDA
    /// backend's packing rule compares).
    pub fn empty_per_active(&self) -> f64 {
        (self.num_seqs * self.num_splits as u64 - self.active) as f64 / self.active as f64
    }
}

/// Plans `problem` under `policy` for a device with `device`'s properties.
pub fn plan(problem: &DecodeProblem, policy: Policy, device: &DeviceProps) -> Result<Plan> {
    problem.validate()?;
    policy.validate(&policy.to_string())?;
    device.validate()?;
    let shape = problem.shape;
    let num_seqs = problem.num_seqs() as u64;
    let cta_heads = cta_heads(&shape, device);
    let unsplit_blocks = num_seqs * cta_heads;
    let first_wave_splits = cdiv(device.num_sms as u64, unsplit_blocks.max(1)) as u32;
    let max_seq_len = problem.max_seq_len();
    let max_tiles = cdiv(max_seq_len as u64, TILE_TOKENS as u64) as u32;

    let (rule, detail, mut reason) = match policy {
        Policy::Vllm { batch_invariant } => vllm(problem, batch_invariant),
        Policy::Sglang { max_kv_splits } => sglang(problem, max_kv_splits, device.num_sms),
        Policy::Fixed { splits } => (
            SplitRule::new(splits, 1),
            PolicyDetail::Fixed { splits },
            format!("fixed: {splits} splits of ceil(tiles / {splits}) tiles for every sequence"),
        ),
        Policy::Deterministic { tile_tokens } => {
            let per = tile_tokens / TILE_TOKENS;
            let splits = cdiv(max_tiles as u64, per as u64).clamp(1, MAX_SPLITS as u64) as u32;
            (
                SplitRule::new(splits, per),
                PolicyDetail::Deterministic { tile_tokens },
                format!(
                    "deterministic: splits of {tile_tokens} tokens, so each sequence is cut by its own length \
                     alone; the longest ({max_seq_len} tokens) needs {splits}"
                ),
            )
        }
        Policy::Auto => auto(problem, device),
    };
    let rule = SplitRule { num_splits: rule.num_splits.clamp(1, MAX_SPLITS), ..rule };
    // One split per warp: the same CTAs over the same tiles, each warp's
    // share its own split, so no merge of the warps inside the CTA.
    let splits_per_cta = device.splits_per_cta.max(1);
    let one_per_sm = num_seqs * cta_heads * rule.num_splits as u64 <= device.num_sms as u64;
    let warp_splits = policy == Policy::Auto
        && splits_per_cta > 1
        && rule.num_splits > 1
        && rule.min_tiles_per_split <= 1
        && rule.num_splits * splits_per_cta <= WARP_SPLIT_MAX_ROWS
        && one_per_sm
        && rule.split(max_seq_len).tiles_per_split >= WARP_SPLIT_MIN_TILES * splits_per_cta;
    let (mut rule, splits_per_cta) = if warp_splits {
        (SplitRule { num_splits: rule.num_splits * splits_per_cta, ..rule }, splits_per_cta)
    } else {
        (rule, 1)
    };
    // Equal lengths: how an engine plans the graph it captures for a batch size.
    let equal_lengths = problem.seq_lens.iter().all(|&len| len == max_seq_len);
    if policy == Policy::Auto && rule.num_splits > 1 && equal_lengths {
        // The rule is per CTA here, but where each warp takes a split, no CTA
        // writes a lone split's output itself: the reducer merges them all.
        let reduce_wait_us = device.reduce_wait_us.filter(|_| splits_per_cta == 1);
        let replay_device = DeviceProps { reduce_wait_us, ..device.clone() };
        let cta_rule = replay_rule(problem, &replay_device, SplitRule::new(rule.num_splits / splits_per_cta, 1));
        // Per warp where each warp takes a split: as many times the splits,
        // splits a quarter as long; never a floor above the planned lengths'
        // own split, so they are cut as before.
        let longest_per_split = rule.split(max_seq_len).tiles_per_split;
        rule.min_tiles_per_split = (cta_rule.min_tiles_per_split / splits_per_cta).clamp(1, longest_per_split);
        if cta_rule.short_splits > 0 {
            rule.short_splits = cta_rule.short_splits * splits_per_cta;
            rule.short_below_tiles = cta_rule.short_below_tiles;
            reason.push_str(&format!(
                "; a replay's sequences of fewer than {} tiles get {} splits",
                rule.short_below_tiles, rule.short_splits
            ));
        }
        if rule.min_tiles_per_split > 1 {
            reason.push_str(&format!(
                "; splits of at least {} tiles where a replay's sequences are shorter than planned",
                rule.min_tiles_per_split
            ));
        }
    }

    // Equal lengths are also what a ragged replay of that graph is cut
    // from: the per-sequence rule leaves a long sequence among short ones to
    // the CTAs the planned length gave it (unsplit at B = 64 for 8B: one CTA
    // per KV head streaming all of it). A batch rule cuts every sequence at
    // the split length of the batch's mean instead, which at the planned
    // lengths is the same cut.
    let by_batch = policy == Policy::Auto
        && equal_lengths
        && device.cuts_by_batch
        && splits_per_cta == 1
        && (2..=BATCH_MAX_SEQS).contains(&problem.num_seqs());
    if by_batch {
        let cap = (BATCH_ROWS_PER_HEAD / num_seqs as u32).clamp(rule.num_splits, MAX_SPLITS);
        let batch = SplitRule { batch_splits: rule.num_splits, num_splits: cap, ..rule };
        if cap > 1 && batch.batch_pair_bound(problem.num_seqs()) <= BATCH_MAX_PAIRS {
            rule = batch;
            reason.push_str(&format!(
                "; cut by the batch: a replay's sequences are all cut at the split length of its mean length, \
                 into at most {cap} splits each"
            ));
        }
    }

    let batch_rule = rule.for_batch(&problem.seq_lens);
    let per_seq: Vec<SeqSplit> = problem.seq_lens.iter().map(|&s| batch_rule.split(s)).collect();
    let longest = batch_rule.split(max_seq_len);
    let use_split = rule.num_splits > 1;
    let record = (shape.head_dim as u64 + 2) * 4;
    let partial_bytes_per_token_head = rule.num_splits as u64 * record;
    let partial_bytes = num_seqs * shape.num_q_heads as u64 * partial_bytes_per_token_head;
    let partial_traffic_bytes = if use_split {
        let merged = per_seq.iter().filter(|p| device.merges(p.active_splits, splits_per_cta));
        2 * merged.map(|p| p.active_splits as u64).sum::<u64>() * shape.num_q_heads as u64 * record
    } else {
        0
    };
    // A batch rule's grid: a CTA for every pair the rule can make at any
    // lengths, batch_splits + 1 per sequence (the CUDA launch packs them).
    let grid_splits = if rule.is_batch() { rule.batch_splits + 1 } else { rule.num_splits };
    let grid = [num_seqs as u32, cta_heads as u32, grid_splits.div_ceil(splits_per_cta)];
    Ok(Plan {
        problem: problem.clone(),
        policy,
        num_sms: device.num_sms,
        kernel: if use_split { KernelKind::Split } else { KernelKind::Unsplit },
        use_split,
        rule,
        grid,
        splits_per_cta,
        blocks: grid.iter().map(|&g| g as u64).product(),
        num_splits: rule.num_splits,
        tiles_per_split: longest.tiles_per_split,
        active_splits: longest.active_splits,
        unsplit_blocks,
        first_wave_splits,
        per_seq,
        partial_bytes_per_token_head,
        partial_bytes,
        partial_traffic_bytes,
        workspace_bytes: if use_split { partial_bytes } else { 0 },
        kv_bytes: problem.kv_bytes(),
        detail,
        reason,
    })
}

fn vllm(problem: &DecodeProblem, batch_invariant: bool) -> (SplitRule, PolicyDetail, String) {
    const NUM_SEGMENTS: u32 = 16;
    let group = problem.shape.group_size() as u32;
    let num_seqs = problem.num_seqs() as u32;
    let num_kv_heads = problem.shape.num_kv_heads as u32;
    let block_m = if group <= 16 { 16 } else { group.next_power_of_two() };
    let block_q = block_m / group;
    // One query token per sequence: q blocks = tokens / BLOCK_Q + num_seqs.
    let num_q_blocks = num_seqs / block_q + num_seqs;
    let seq_threshold = 128 / num_kv_heads;
    let split = !batch_invariant && num_seqs <= seq_threshold;
    let reason = if split {
        format!(
            "vllm: split into {NUM_SEGMENTS} segments because num_seqs {num_seqs} <= 128 / num_kv_heads = \
             {seq_threshold}; each segment takes ceil(s / ({NUM_SEGMENTS} * 16)) tiles of 16"
        )
    } else if batch_invariant {
        "vllm: no split because batch invariance is on".to_string()
    } else {
        format!("vllm: no split because num_seqs {num_seqs} > 128 / num_kv_heads = {seq_threshold}")
    };
    let vllm_grid =
        if split { vec![num_q_blocks, num_kv_heads, NUM_SEGMENTS] } else { vec![num_q_blocks, num_kv_heads] };
    (
        SplitRule::new(if split { NUM_SEGMENTS } else { 1 }, 1),
        PolicyDetail::Vllm { block_m, block_q, num_q_blocks, num_segments: NUM_SEGMENTS, vllm_grid, split },
        reason,
    )
}

/// SGLang's `get_num_kv_splits`, evaluated on the host.
fn sglang(problem: &DecodeProblem, max_kv_splits: u32, num_sms: u32) -> (SplitRule, PolicyDetail, String) {
    let lens: Vec<u64> = problem.seq_lens.iter().map(|&s| s as u64).collect();
    let max_len = lens.iter().copied().max().unwrap_or(0).max(1);
    let mut min_len = lens.iter().copied().min().unwrap_or(0).max(1);
    if max_len * 8 < min_len * 10 {
        min_len = max_len;
    }
    let max_kv_splits_1 = cdiv(max_len, min_len).min(max_kv_splits as u64);
    let kv_chunk_size_1 = cdiv(max_len, max_kv_splits_1);
    let ext_seq_len = max_len as f32 / 64.0;
    let ext_device_core_count = (num_sms as f32 * ext_seq_len.log2().max(1.0)) as u64;
    let group = problem.shape.group_size() as u64;
    let num_seqs = problem.num_seqs() as u64;
    let num_heads = problem.shape.num_q_heads as u64;
    let token_grid = if group == 1 { num_seqs * num_heads } else { num_seqs * cdiv(num_heads, group.min(16)) };
    let max_kv_splits_2 = cdiv(ext_device_core_count, token_grid.max(1)).min(max_kv_splits as u64);
    let kv_chunk_size_2 = cdiv(max_len, max_kv_splits_2);
    let num_kv_splits: Vec<u32> =
        lens.iter().map(|&s| cdiv(s, kv_chunk_size_1).max(cdiv(s, kv_chunk_size_2)) as u32).collect();
    let chunk = kv_chunk_size_1.min(kv_chunk_size_2);
    let most = num_kv_splits.iter().copied().max().unwrap_or(1).max(1);
    let reason = format!(
        "sglang: ext core count {ext_device_core_count} = {num_sms} SMs * max(log2({max_len} / 64), 1); token grid \
         {token_grid}; splits = min(ceil({ext_device_core_count} / {token_grid}), {max_kv_splits}) for the longest \
         sequence, chunks of {chunk} tokens"
    );
    (
        SplitRule::new(most, cdiv(chunk, TILE_TOKENS as u64) as u32),
        PolicyDetail::Sglang {
            max_kv_splits,
            ext_device_core_count: ext_device_core_count as u32,
            token_grid: token_grid as u32,
            kv_chunk_size_1: kv_chunk_size_1 as u32,
            kv_chunk_size_2: kv_chunk_size_2 as u32,
            num_kv_splits,
        },
        reason,
    )
}

// The cost model behind `auto`: estimated microseconds of one decode call.
//
// The call is bound by bytes: KV plus the partial state written and read
// back, at the device's streaming bandwidth. It is also bound by its longest
// CTA: one CTA streams at about the share of bandwidth of one resident CTA
// slot (`ctas_per_sm` per multiprocessor), so a grid that leaves slots idle
// finishes when its fattest CTA does, in steps of `tiles_per_cta_step`
// tiles; a grid of several waves runs its last, partly filled one at the
// occupancy that wave has. A split pays one more dependent launch (the
// reduce). Two CTAs on one multiprocessor, and each wave after the first,
// cost a fixed time.
//
// The constants below were fitted to a sweep of split counts over the
// peers' grid on the H200 (bf16, d = 128, version 12 kernels; every pick of
// the fitted model within 2.6% of the sweep's best, against up to 23% for
// the previous constants): docs/measurements/2026-12-02-s5-split-sweep.log.
// How far one CTA alone on a multiprocessor gets is the device's
// `lone_cta_share` (per kernel: `GPU_LONE_CTA_SHARE`,
// `GPU_STREAM_LONE_CTA_SHARE`).

/// Two CTAs sharing a multiprocessor do not finish together: on the H200 the
/// earlier-launched one's last tile landed up to 20% sooner, and the rest of
/// the later one's split ran with half the multiprocessor's copies in
/// flight (kernels/cuda/probe/timeline.cu). Where one CTA per multiprocessor
/// already covers the grid, that tail outweighs the second CTA's bandwidth:
/// Llama-3-8B, B = 16, s = 1024 took 20.9 us unsplit (128 CTAs) against
/// 22.6 us with 2 splits.
const SHARED_SM_TAIL_US: f64 = 0.75;

/// Each wave after the first: a CTA that starts when another ends waits for
/// its first tiles while its slot streams nothing.
const WAVE_US: f64 = 1.0;

/// CTAs per (sequence, split): one per KV head, or several where its group
/// is wider than one CTA serves.
fn cta_heads(shape: &AttentionShape, device: &DeviceProps) -> u64 {
    shape.num_kv_heads as u64 * device.head_groups(shape.group_size())
}

/// Whether the batch's lengths differ enough that its CTAs differ in size:
/// more than a tenth of its tiles are in sequences shorter than 3/4 of the
/// longest. `auto` then cuts it in chunks and `estimate_us` charges the
/// fattest CTAs' tail instead of counting waves of equal CTAs. (A few short
/// sequences beside many long ones leave the batch planned as equal.)
fn is_ragged(problem: &DecodeProblem) -> bool {
    let tiles = |s: u32| s.div_ceil(TILE_TOKENS) as u64;
    let longest = tiles(problem.max_seq_len());
    let total: u64 = problem.seq_lens.iter().map(|&s| tiles(s)).sum();
    let in_short: u64 = problem.seq_lens.iter().map(|&s| tiles(s)).filter(|&t| 4 * t < 3 * longest).sum();
    10 * in_short > total
}

/// Estimated microseconds of one decode call under `rule` (the model above).
fn estimate_us(problem: &DecodeProblem, device: &DeviceProps, rule: SplitRule) -> f64 {
    let shape = problem.shape;
    let bytes_per_token_per_head = 2.0 * (shape.head_dim * problem.dtypes.kv.size_bytes()) as f64;
    let bandwidth = device.mem_bandwidth_gbps * 1e3; // bytes per microsecond
    let mut ctas = 0u64;
    let mut fattest_tiles = 0u32;
    let mut partial_records = 0u64;
    let mut most_active = 0u32;
    let step = device.tiles_per_cta_step.max(1);
    let cta_heads = cta_heads(&shape, device);
    for &s in &problem.seq_lens {
        let split = rule.split(s);
        ctas += split.active_splits as u64 * cta_heads;
        fattest_tiles = fattest_tiles.max(split.tiles_per_split.min(split.tiles).div_ceil(step) * step);
        // A lone split written by its CTA has no partial rows, and no merge
        // (`DeviceProps::reduce_wait_us`).
        if rule.num_splits > 1 && device.merges(split.active_splits, 1) {
            most_active = most_active.max(split.active_splits);
            partial_records += split.active_splits as u64 * shape.num_q_heads as u64;
        }
    }
    let ctas = ctas.max(1);
    let num_sms = device.num_sms.max(1) as u64;
    let ctas_per_sm = device.ctas_per_sm.max(1) as u64;
    let resident = num_sms * ctas_per_sm;
    let waves = cdiv(ctas, resident) as f64;
    // A multiprocessor's share of the bandwidth goes to the CTAs it actually
    // holds; n CTAs where more fit reach 1 - (1 - lone_cta_share)^n of it.
    let lone_share = device.lone_cta_share.clamp(0.01, 1.0);
    let per_sm_of = |wave_ctas: u64| cdiv(wave_ctas, num_sms).min(ctas_per_sm);
    let cta_bandwidth_of = |per_sm: u64| {
        let sm_fill = if per_sm == ctas_per_sm { 1.0 } else { 1.0 - (1.0 - lone_share).powi(per_sm as i32) };
        bandwidth * sm_fill / (num_sms as f64 * per_sm as f64)
    };
    let per_sm = per_sm_of(ctas);
    let shared_sm_us = if per_sm > 1 { SHARED_SM_TAIL_US } else { 0.0 };
    let partial_bytes = 2.0 * partial_records as f64 * (shape.head_dim as f64 + 2.0) * 4.0;
    let stream_us = (problem.kv_bytes() as f64 + partial_bytes) / bandwidth;
    // Every (sequence, split) of the grid launches; the empty ones (a short
    // sequence's surplus splits) hold a slot briefly.
    let launched = problem.seq_lens.len() as u64 * cta_heads * rule.num_splits.max(1) as u64;
    let empty_us = launched.saturating_sub(ctas) as f64 * device.empty_cta_us / resident as f64;
    // Full waves at full occupancy, then the last, partly filled one at its
    // own: its CTAs have their multiprocessors to fewer of themselves.
    let cta_bytes = (fattest_tiles * TILE_TOKENS) as f64 * bytes_per_token_per_head;
    let last_wave = ctas - (waves as u64 - 1) * resident;
    let cta_us = if is_ragged(problem) {
        // CTAs of different sizes pack. Within one wave of one plane they
        // all start at once, and the fattest streams alone once its
        // neighbour is done. Otherwise the bytes bound the call, plus the
        // tail of the fattest CTAs, which finish after the rest when they
        // start late: less of it the more waves there are to hide it in.
        // (Fitted on ragged batches of Llama-3-8B and 70B at TP=8 on the
        // H200: docs/measurements/2026-12-02-s8-ragged-call1.txt.)
        if rule.num_splits == 1 && ctas <= resident {
            cta_bytes / cta_bandwidth_of(1)
        } else {
            let fattest_us = cta_bytes / cta_bandwidth_of(ctas_per_sm);
            stream_us + fattest_us / (2.0 * (ctas as f64 / resident as f64).max(1.0))
        }
    } else {
        (waves - 1.0) * cta_bytes / cta_bandwidth_of(ctas_per_sm) + cta_bytes / cta_bandwidth_of(per_sm_of(last_wave))
    };
    // The reduce: a dependent launch, then each reducer CTA reads one partial
    // row per active split of its sequence (the longest one sets the pace);
    // where every sequence's lone split was written by its CTA, only the
    // reducer's wait for the decode grid.
    let row_bytes = (shape.head_dim as f64 + 2.0) * 4.0;
    let reduce_us = match device.reduce_wait_us {
        _ if rule.num_splits <= 1 => 0.0,
        Some(wait_us) if most_active <= 1 => wait_us,
        _ => device.launch_overhead_us + most_active as f64 * row_bytes / (device.reduce_cta_gbps.max(1e-3) * 1e3),
    };
    stream_us.max(cta_us) + reduce_us + shared_sm_us + empty_us + WAVE_US * (waves - 1.0)
}

/// The shortest replay length [`replay_rule`] weighs: below it a call is
/// its fixed cost whatever the cut (70B at TP=8, B=1, 1024 tokens: 4.7 µs
/// for 0.5 MiB), and a floor fitted there would cost the lengths that read.
const REPLAY_MIN_LEN: u32 = 1024;

/// The cut of shorter sequences that serves best the lengths a plan of equal
/// lengths may be replayed at (`rule` is per CTA: one split each): an engine
/// captures one CUDA graph per batch size, planned for its longest
/// sequences, and replays it at every length, the kernels cutting each
/// sequence by the same rule from the lengths they read. Left alone, a short
/// sequence is cut into as many splits as the longest, of a tile or two each
/// (Llama-3-8B, B=1, planned for 65536 tokens and run at 1024: 32 splits of 2
/// tiles, 6.68 µs against 5.82 planned for 1024; s24, H200), where a plan for
/// its own length would make fewer CTAs per sequence, or none split at all.
///
/// Two levers, neither of which touches the planned lengths: a floor on tiles
/// per split (powers of two up to the planned lengths' own split size), and
/// a smaller split count for sequences shorter than a threshold (at most the
/// planned lengths' tiles). A candidate is estimated by the cost model at a
/// half, a quarter, ... of the planned length, down to `REPLAY_MIN_LEN`
/// tokens, against `auto`'s own plan for that length; the smallest
/// geometric mean of those ratios wins unless leaving the rule alone beats it
/// by 1%: every candidate only takes splits away, so it is held to `auto`'s
/// own bar, where more splits must win by 1% (s25; until then a candidate
/// had to win by 1%, which left Llama-3-70B at TP=8, B=4, planned for 65536
/// tokens, 2% slower at 256 and 1024 tokens on the H200). (The mean, not the
/// worst ratio: a length that nothing helps would otherwise decide alone.)
/// The levers are searched one at a time (a floor,
/// then a count under it, then the smallest floor under that count): on the
/// shapes measured in s24 this picks what the search of every combination
/// picked, in a third of its time (a Llama-3-8B plan at B=1 and 65536 tokens
/// takes about 70 µs on the development CPU against 11 µs without this step;
/// engines plan a graph once per batch size).
fn replay_rule(problem: &DecodeProblem, device: &DeviceProps, rule: SplitRule) -> SplitRule {
    let max_len = problem.max_seq_len();
    let tiles = |len: u32| len.div_ceil(TILE_TOKENS);
    let planned_per_split = rule.split(max_len).tiles_per_split;
    let shorter: Vec<(DecodeProblem, f64)> = std::iter::successors(Some(max_len / 2), |&len| Some(len / 2))
        .take_while(|&len| len >= REPLAY_MIN_LEN)
        .filter_map(|len| {
            let replay = DecodeProblem { seq_lens: vec![len; problem.num_seqs()], ..problem.clone() };
            let best = estimate_us(&replay, device, auto(&replay, device).0);
            (best > 0.0).then_some((replay, best))
        })
        .collect();
    if shorter.is_empty() {
        return rule;
    }
    let mean_ratio = |candidate: SplitRule| {
        let log_sum: f64 =
            shorter.iter().map(|(replay, best)| (estimate_us(replay, device, candidate) / best).ln()).sum();
        (log_sum / shorter.len() as f64).exp()
    };
    let powers_below =
        |limit: u32| std::iter::successors(Some(1u32), |&x| x.checked_mul(2)).take_while(move |&x| x < limit);
    // Thresholds: each evaluated length and the planned one (every shorter
    // sequence); all at most the planned lengths' tiles.
    let thresholds: Vec<u32> =
        shorter.iter().map(|(replay, _)| tiles(replay.max_seq_len())).chain([tiles(max_len)]).collect();
    // One lever at a time, then the floor again under the chosen count: a
    // few dozen estimates per length rather than every combination (which
    // took a B=256 plan 2 ms).
    let unchanged = mean_ratio(rule);
    let pick = |best: (SplitRule, f64), candidates: Vec<SplitRule>| {
        candidates.into_iter().map(|candidate| (candidate, mean_ratio(candidate))).fold(best, |best, next| {
            if next.1 < best.1 {
                next
            } else {
                best
            }
        })
    };
    let floors = |base: SplitRule| -> Vec<SplitRule> {
        powers_below(planned_per_split + 1)
            .map(|min_tiles_per_split| SplitRule { min_tiles_per_split, ..base })
            .collect()
    };
    let mut best = pick((rule, unchanged), floors(rule));
    let counts: Vec<SplitRule> = powers_below(rule.num_splits)
        .flat_map(|short_splits| {
            thresholds.iter().map(move |&short_below_tiles| SplitRule { short_splits, short_below_tiles, ..best.0 })
        })
        .collect();
    best = pick(best, counts);
    // The smallest floor that does as well under the chosen count.
    let unfloored = SplitRule { min_tiles_per_split: 1, ..best.0 };
    let (best, ratio) = pick((unfloored, mean_ratio(unfloored)), floors(unfloored));
    // Fewer splits unless more win by 1%, as in `auto`.
    if ratio < unchanged * 1.01 {
        best
    } else {
        rule
    }
}

fn auto(problem: &DecodeProblem, device: &DeviceProps) -> (SplitRule, PolicyDetail, String) {
    let max_tiles = cdiv(problem.max_seq_len() as u64, TILE_TOKENS as u64) as u32;
    let unsplit = SplitRule::new(1, 1);
    let unsplit_us = estimate_us(problem, device, unsplit);
    let mut best = (unsplit, unsplit_us);
    // Candidates up to a few waves past the split count that first fills the
    // machine, counting the batch as sequences as long as its longest that
    // hold the same tiles (for equal lengths: S*); the estimate is cheap.
    let total_tiles: u64 = problem.seq_lens.iter().map(|&s| cdiv(s as u64, TILE_TOKENS as u64)).sum();
    let equivalent_seqs = cdiv(total_tiles, max_tiles.max(1) as u64).max(1);
    let fill_splits = cdiv(device.num_sms as u64, equivalent_seqs * cta_heads(&problem.shape, device)) as u32;
    let cap = max_tiles.min(MAX_SPLITS).min(fill_splits.saturating_mul(4 * device.ctas_per_sm.max(1)));
    let ragged = is_ragged(problem);
    for num_splits in 2..=cap {
        // n splits of every sequence; a ragged batch is cut in chunks of the
        // longest sequence's n-th instead, so that a short sequence keeps to
        // fewer splits (or one) while the long ones spread over the machine.
        // (n splits of a short sequence would be small CTAs launched
        // between the long ones' splits, which then start late.)
        let rule = if ragged {
            let chunk = max_tiles.div_ceil(num_splits);
            SplitRule::new(max_tiles.div_ceil(chunk), chunk)
        } else {
            SplitRule::new(num_splits, 1)
        };
        let us = estimate_us(problem, device, rule);
        // Only a clear win (1%) justifies more partial state.
        if us < best.1 * 0.99 {
            best = (rule, us);
        }
    }
    let (rule, us) = best;
    let reason = if rule.num_splits == 1 {
        format!(
            "auto: no split; the unsplit grid of {} CTAs ({} per multiprocessor) already keeps {} multiprocessors \
             streaming (estimated {unsplit_us:.1} us)",
            problem.num_seqs() as u64 * cta_heads(&problem.shape, device),
            device.ctas_per_sm,
            device.num_sms
        )
    } else {
        let cut = if rule.min_tiles_per_split > 1 {
            format!(
                "splits of at least {} tiles, so the {max_tiles}-tile longest sequence gets {} and shorter ones fewer",
                rule.min_tiles_per_split, rule.num_splits
            )
        } else {
            format!("up to {} splits per sequence", rule.num_splits)
        };
        format!(
            "auto: {cut} ({fill_splits} splits first fill {} multiprocessors); estimated {us:.1} us against \
             {unsplit_us:.1} us unsplit, partial state included",
            device.num_sms
        )
    };
    (rule, PolicyDetail::Auto { estimated_us: us, estimated_unsplit_us: unsplit_us }, reason)
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.problem;
        writeln!(f, "problem     {p}")?;
        writeln!(f, "policy      {} on {} multiprocessors", self.policy, self.num_sms)?;
        writeln!(f, "kernel      {:?}", self.kernel)?;
        writeln!(
            f,
            "grid        ({}, {}, {}) = {} CTAs; unsplit grid G_2D = {} CTAs; S* = ceil({} / {}) = {}",
            self.grid[0],
            self.grid[1],
            self.grid[2],
            self.blocks,
            self.unsplit_blocks,
            self.num_sms,
            self.unsplit_blocks,
            self.first_wave_splits
        )?;
        if self.splits_per_cta > 1 {
            writeln!(
                f,
                "            {} splits per CTA, one per warp: each warp stores its own partial row",
                self.splits_per_cta
            )?;
        }
        let longest = p.max_seq_len();
        writeln!(
            f,
            "longest     s = {longest}: {} tiles of 16, {} tiles per split, {} active splits of {}",
            longest.div_ceil(TILE_TOKENS),
            self.tiles_per_split,
            self.active_splits,
            self.num_splits
        )?;
        if let Some(pairs) = self.sparse_pairs() {
            writeln!(
                f,
                "active      {} of the {} x {} (sequence, split) pairs; {:.1} empty per active one",
                pairs.active,
                pairs.num_seqs,
                pairs.num_splits,
                pairs.empty_per_active()
            )?;
        }
        if let Some(last) = self.active_splits.checked_sub(1) {
            let split = self.rule.split(longest);
            let (a, b) = split.token_range(0);
            let (c, d) = split.token_range(last);
            writeln!(f, "            split 0 covers keys {a}-{}, split {last} keys {c}-{}", b - 1, d - 1)?;
        }
        writeln!(
            f,
            "partial     {} splits * (d {} + 2) * 4 B = {} B per (token, head); {} B for {} heads of {} sequences",
            self.num_splits,
            p.shape.head_dim,
            self.partial_bytes_per_token_head,
            self.partial_bytes,
            p.shape.num_q_heads,
            p.num_seqs()
        )?;
        // `kv_bytes` saturates (see `DecodeProblem::kv_bytes`): say so rather
        // than print u64::MAX as if it were the product.
        let kv_bytes = match self.kv_bytes {
            u64::MAX => format!("more than {} B", u64::MAX),
            bytes => format!("{bytes} B"),
        };
        writeln!(
            f,
            "kv          2 * {} tokens * {} kv heads * d {} * {} B = {kv_bytes}",
            p.seq_lens.iter().map(|&s| s as u64).sum::<u64>(),
            p.shape.num_kv_heads,
            p.shape.head_dim,
            p.dtypes.kv.size_bytes(),
        )?;
        match &self.detail {
            PolicyDetail::Vllm { block_m, block_q, num_q_blocks, vllm_grid, .. } => writeln!(
                f,
                "vllm        BLOCK_M {block_m}, BLOCK_Q {block_q}, q blocks {num_q_blocks}, vLLM's grid {vllm_grid:?}"
            )?,
            PolicyDetail::Sglang { ext_device_core_count, token_grid, kv_chunk_size_1, kv_chunk_size_2, .. } => {
                writeln!(
                    f,
                    "sglang      ext core count {ext_device_core_count}, token grid {token_grid}, chunk sizes \
                     {kv_chunk_size_1} / {kv_chunk_size_2}"
                )?
            }
            _ => {}
        }
        write!(f, "reason      {}", self.reason)
    }
}

#[cfg(test)]
mod tests;
