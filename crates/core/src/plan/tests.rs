//! The arithmetic the planner must reproduce, number by number.

use super::*;
use crate::{AttentionShape, DType, DTypes, KvLayout};
use proptest::test_runner::TestCaseError;

fn problem(heads: usize, kv_heads: usize, seq_lens: Vec<u32>) -> DecodeProblem {
    DecodeProblem::new(
        AttentionShape::new(heads, kv_heads, 128).unwrap(),
        DTypes::uniform(DType::Bf16),
        KvLayout::block_table(16),
        seq_lens,
    )
    .unwrap()
}

fn h200() -> DeviceProps {
    DeviceProps::gpu_like(132)
}

fn llama3_8b(batch: usize, seq_len: u32) -> DecodeProblem {
    problem(32, 8, vec![seq_len; batch])
}

#[test]
fn vllm_llama3_8b_batch_1() {
    let plan = plan(&llama3_8b(1, 2560), "vllm".parse().unwrap(), &h200()).unwrap();
    let PolicyDetail::Vllm { block_m, block_q, num_q_blocks, ref vllm_grid, split, .. } = plan.detail else {
        panic!("not a vllm detail: {:?}", plan.detail)
    };
    assert_eq!((block_m, block_q, num_q_blocks, split), (16, 4, 1, true));
    assert_eq!(vllm_grid, &[1, 8, 16]);
    assert_eq!(plan.grid, [1, 8, 16]);
    assert_eq!(plan.blocks, 128);
    assert!(plan.use_split);
    assert_eq!(plan.tiles_per_split, 10);
    assert_eq!(plan.active_splits, 16);
    let split = plan.per_seq[0];
    assert_eq!(split.token_range(0), (0, 160));
    assert_eq!(split.token_range(15), (2400, 2560));
    assert_eq!(plan.partial_bytes_per_token_head, 8_320);
    assert_eq!(plan.partial_bytes, 266_240);
    assert_eq!(plan.kv_bytes, 10_485_760);
    assert!(plan.reason.contains("16"), "{}", plan.reason);
}

#[test]
fn vllm_llama3_8b_batch_32_does_not_split() {
    let plan = plan(&llama3_8b(32, 2560), "vllm".parse().unwrap(), &h200()).unwrap();
    let PolicyDetail::Vllm { ref vllm_grid, split, .. } = plan.detail else { panic!() };
    assert!(!split);
    assert_eq!(vllm_grid, &[40, 8]);
    assert!(!plan.use_split);
    assert_eq!(plan.kernel, KernelKind::Unsplit);
    assert_eq!(plan.grid, [32, 8, 1]);
    assert_eq!(plan.workspace_bytes, 0);
}

#[test]
fn vllm_batch_invariance_turns_the_split_off() {
    let plan = plan(&llama3_8b(1, 2560), "vllm:batch-invariant".parse().unwrap(), &h200()).unwrap();
    assert!(!plan.use_split);
}

#[test]
fn vllm_short_sequence_leaves_half_the_segments_idle() {
    let plan = plan(&llama3_8b(1, 128), "vllm".parse().unwrap(), &h200()).unwrap();
    assert_eq!(plan.num_splits, 16);
    assert_eq!(plan.tiles_per_split, 1);
    assert_eq!(plan.active_splits, 8);
}

#[test]
fn vllm_llama3_70b_tp8_gives_16_ctas() {
    let plan = plan(&problem(8, 1, vec![2560]), "vllm".parse().unwrap(), &h200()).unwrap();
    assert_eq!(plan.unsplit_blocks, 1);
    assert_eq!(plan.first_wave_splits, 132);
    assert_eq!(plan.blocks, 16);
}

#[test]
fn sglang_llama3_8b_batch_1() {
    let plan = plan(&llama3_8b(1, 2560), "sglang".parse().unwrap(), &h200()).unwrap();
    let PolicyDetail::Sglang { ext_device_core_count, token_grid, ref num_kv_splits, max_kv_splits, .. } = plan.detail
    else {
        panic!()
    };
    assert_eq!(max_kv_splits, 8);
    assert_eq!(ext_device_core_count, 702);
    assert_eq!(token_grid, 8);
    assert_eq!(num_kv_splits, &[8]);
    assert_eq!(plan.active_splits, 8);
    assert_eq!(plan.num_splits, 8);
}

#[test]
fn sglang_counts_per_sequence() {
    // A short sequence in a batch with a long one gets fewer splits.
    let plan = plan(&problem(32, 8, vec![2560, 1000]), "sglang".parse().unwrap(), &h200()).unwrap();
    let PolicyDetail::Sglang { ref num_kv_splits, .. } = plan.detail else { panic!() };
    let ours: Vec<u32> = plan.per_seq.iter().map(|s| s.active_splits).collect();
    assert_eq!(&ours, num_kv_splits);
}

#[test]
fn first_wave_splits() {
    assert_eq!(plan(&llama3_8b(1, 2560), Policy::Auto, &h200()).unwrap().first_wave_splits, 17);
    let p70 = plan(&problem(8, 1, vec![2560]), Policy::Auto, &h200()).unwrap();
    assert_eq!(p70.unsplit_blocks, 1);
    assert_eq!(p70.first_wave_splits, 132);
}

#[test]
fn fixed_and_deterministic() {
    let fixed = plan(&llama3_8b(2, 1000), "fixed:5".parse().unwrap(), &h200()).unwrap();
    assert_eq!(fixed.grid, [2, 8, 5]);
    assert_eq!(fixed.tiles_per_split, 13); // ceil(63 / 5)
    assert_eq!(fixed.active_splits, 5);

    // Deterministic: a sequence is cut by its own length, whatever the batch.
    let policy: Policy = "deterministic:256".parse().unwrap();
    let alone = plan(&llama3_8b(1, 1000), policy, &h200()).unwrap();
    let crowded = plan(&problem(32, 8, vec![1000, 9000, 17]), policy, &h200()).unwrap();
    assert_eq!(alone.per_seq[0], crowded.per_seq[0]);
    assert_eq!(alone.per_seq[0].tiles_per_split, 16);
    assert_eq!(alone.per_seq[0].active_splits, 4);
    assert_eq!(crowded.num_splits, 36); // ceil(9000 / 256)
}

#[test]
fn auto_splits_small_batches_and_not_big_ones() {
    let small = plan(&llama3_8b(1, 16384), Policy::Auto, &h200()).unwrap();
    assert!(small.use_split, "{}", small.reason);
    // B=1 must keep at least 90% of the multiprocessors streaming.
    assert!(small.active_splits as u64 * 8 >= 119, "{small}");
    let tp8 = plan(&problem(8, 1, vec![65536]), Policy::Auto, &h200()).unwrap();
    assert!(tp8.active_splits >= 119, "{tp8}");
    let big = plan(&llama3_8b(256, 1024), Policy::Auto, &h200()).unwrap();
    assert!(!big.use_split, "{}", big.reason);
    // Partial state stays a small fraction of KV where it splits on long sequences.
    assert!((small.partial_traffic_bytes as f64) < 0.05 * small.kv_bytes as f64, "{small}");
}

#[test]
fn auto_weighs_the_reduce_against_a_second_cta_per_sm() {
    // 70B at TP=8, B=1: one KV head. Two CTAs per SM (256+ splits) stream no
    // faster than one (measured on the H200) and double the rows each reducer
    // CTA reads, so auto stays near one CTA per SM.
    let tp8 = plan(&problem(8, 1, vec![65536]), Policy::Auto, &h200()).unwrap();
    assert!((119..=140).contains(&tp8.num_splits), "{tp8}");
    // 8B, B=1, s=65536: 8 KV heads; two CTAs per SM (32 splits) streamed
    // 1.7% faster than one (16 splits), which outweighs their uneven finish.
    let llama = plan(&llama3_8b(1, 65536), Policy::Auto, &h200()).unwrap();
    assert!(llama.num_splits as u64 * 8 > 132, "{llama}");
    // The reduce's share of the estimate grows with the split count.
    let free_reduce = DeviceProps { reduce_cta_gbps: 1e12, ..h200() };
    let reduce_us = |splits: u32| {
        let rule = SplitRule::new(splits, 1);
        estimate_us(&tp8.problem, &h200(), rule) - estimate_us(&tp8.problem, &free_reduce, rule)
    };
    assert!(reduce_us(512) > 3.0 * reduce_us(128) && reduce_us(128) > 0.0, "{} {}", reduce_us(512), reduce_us(128));
}

#[test]
fn auto_keeps_one_cta_per_sm_where_that_covers_the_grid() {
    // 8B, B=16, s=1024: 128 unsplit CTAs fill one slot per SM; a second CTA
    // per SM (2 splits) cost a reduce and an uneven finish (22.6 against
    // 20.9 us on the H200).
    let unsplit = plan(&llama3_8b(16, 1024), Policy::Auto, &h200()).unwrap();
    assert!(!unsplit.use_split, "{unsplit}");
    // 70B at TP=8, B=4, s=65536: 33 splits (132 CTAs) beat 66 (264 CTAs),
    // 38.7 against 40.3 us.
    let tp8 = plan(&problem(8, 1, vec![65536; 4]), Policy::Auto, &h200()).unwrap();
    assert!(tp8.blocks <= 132, "{tp8}");
    // Splits are whole steps of the CTA's 4 warps.
    assert_eq!(tp8.tiles_per_split % 4, 0, "{tp8}");
    // Without that step, 9 tiles per split look cheaper than 12; with it, the same.
    let rule = |splits| SplitRule::new(splits, 1);
    let one_step = DeviceProps { tiles_per_cta_step: 1, ..h200() };
    let short = problem(8, 1, vec![16384]);
    assert!(estimate_us(&short, &one_step, rule(114)) < estimate_us(&short, &one_step, rule(86)));
    assert!(estimate_us(&short, &h200(), rule(114)) >= estimate_us(&short, &h200(), rule(86)));
}

#[test]
fn auto_fills_every_slot_for_a_kernel_bound_by_issue() {
    // The CUDA stream kernel (three CTAs per SM on the H200, a lone CTA at
    // about half of what three reach), 8B with 48-token blocks, B=16,
    // s=4096: 128 CTAs took 193 us, 256 took 126, 384 took 109.
    let stream =
        DeviceProps { ctas_per_sm: 3, lone_cta_share: crate::GPU_STREAM_LONE_CTA_SHARE, splits_per_cta: 1, ..h200() };
    let filled = plan(&llama3_8b(16, 4096), Policy::Auto, &stream).unwrap();
    assert_eq!(filled.rule.num_splits, 3, "{filled}");
    // The tensor-core kernel, which one CTA per SM keeps near the bandwidth: unsplit.
    let mma = plan(&llama3_8b(16, 4096), Policy::Auto, &h200()).unwrap();
    assert!(!mma.use_split, "{mma}");
    // n CTAs on an SM reach 1 - (1 - share)^n of it: a second CTA helps the
    // issue-bound kernel more than the memory-bound one.
    let rule = |splits| SplitRule::new(splits, 1);
    let long = llama3_8b(1, 65536);
    let gain = |device: &DeviceProps| estimate_us(&long, device, rule(16)) / estimate_us(&long, device, rule(33));
    let three_slots = DeviceProps { ctas_per_sm: 3, ..h200() };
    assert!(gain(&stream) > gain(&three_slots), "{} against {}", gain(&stream), gain(&three_slots));
}

#[test]
fn a_partly_filled_last_wave_runs_at_its_own_occupancy() {
    // Gemma-2-9B (d = 256, the stream kernel), B=64, s=1024: 512 unsplit
    // CTAs are one full wave of 396 and 116 CTAs alone on their SMs. Charged
    // as two full waves, 8 splits looked cheaper (200.3 us measured); with
    // the last wave at one CTA per SM, 2 splits win (177.9 us; unsplit 192.4).
    let stream =
        DeviceProps { ctas_per_sm: 3, lone_cta_share: crate::GPU_STREAM_LONE_CTA_SHARE, splits_per_cta: 1, ..h200() };
    let gemma = DecodeProblem::new(
        AttentionShape::new(16, 8, 256).unwrap(),
        DTypes::uniform(DType::Bf16),
        KvLayout::block_table(16),
        vec![1024; 64],
    )
    .unwrap();
    let picked = plan(&gemma, Policy::Auto, &stream).unwrap();
    assert_eq!(picked.rule.num_splits, 2, "{picked}");
    // One full wave plus 8 CTAs, each alone on its SM, costs less than two
    // full waves (264 slots on the tensor-core kernel's 2 per SM).
    let rule = |splits| SplitRule::new(splits, 1);
    let one_wave_and_some = llama3_8b(34, 4096); // 272 CTAs
    let two_waves = llama3_8b(66, 4096); // 528 CTAs
    let (some, two) = (estimate_us(&one_wave_and_some, &h200(), rule(1)), estimate_us(&two_waves, &h200(), rule(1)));
    assert!(some < 0.9 * two, "{some} against {two}");
}

#[test]
fn auto_is_per_sequence() {
    let plan = plan(&problem(32, 8, vec![65536, 64, 0]), Policy::Auto, &h200()).unwrap();
    assert!(plan.per_seq[0].active_splits > plan.per_seq[1].active_splits);
    assert_eq!(plan.per_seq[1].active_splits, 4); // 64 tokens: at most 4 tiles
    assert_eq!(plan.per_seq[2].active_splits, 0);
}

#[test]
fn policies_parse_and_reject_with_the_value() {
    for text in ["auto", "vllm", "vllm:batch-invariant", "sglang", "sglang:16", "fixed:3", "deterministic:512"] {
        assert_eq!(text.parse::<Policy>().unwrap().to_string(), if text == "sglang" { "sglang:8" } else { text });
    }
    for text in ["fixed:0", "fixed:x", "fixed", "deterministic:100", "nope", "auto:3"] {
        let err = text.parse::<Policy>().unwrap_err();
        assert!(err.to_string().contains(text), "{err}");
    }
}

#[test]
fn plan_serialises_the_promised_json_fields() {
    let plan = plan(&llama3_8b(1, 2560), "vllm".parse().unwrap(), &h200()).unwrap();
    let json = serde_json::to_value(&plan).unwrap();
    for key in [
        "use_split",
        "grid",
        "blocks",
        "num_splits",
        "tiles_per_split",
        "active_splits",
        "first_wave_splits",
        "partial_bytes_per_token_head",
        "partial_bytes",
        "kv_bytes",
        "reason",
    ] {
        assert!(json.get(key).is_some(), "missing {key}");
    }
    assert_eq!(json["partial_bytes"], 266_240);
}

#[test]
fn device_props_past_the_planners_arithmetic_are_refused() {
    // splits_per_cta 2^31 on 65536 SMs made `auto` return 0 splits (s51's fuzzing).
    let device = DeviceProps { num_sms: 65536, splits_per_cta: 1 << 31, ..h200() };
    let err = plan(&llama3_8b(1, 4096), Policy::Auto, &device).unwrap_err();
    assert_eq!(err, Error::OutOfRange { what: "the device's splits_per_cta", value: 1 << 31, min: 0, max: 1024 });
    for device in [
        DeviceProps { num_sms: (1 << 20) + 1, ..h200() },
        DeviceProps { ctas_per_sm: 1 << 20, ..h200() },
        DeviceProps { tiles_per_cta_step: u32::MAX, ..h200() },
    ] {
        assert!(matches!(plan(&llama3_8b(1, 4096), Policy::Auto, &device), Err(Error::OutOfRange { .. })));
    }
}

#[test]
fn split_rules_and_ranges_stay_in_range() {
    // deterministic:4294967280 gave splits whose token ranges wrapped in 32 bits.
    let err = plan(&llama3_8b(1, 16), Policy::Deterministic { tile_tokens: 4294967280 }, &h200()).unwrap_err();
    assert!(matches!(err, Error::InvalidPolicy { .. }), "{err}");
    assert!(plan(&llama3_8b(1, 16), Policy::Deterministic { tile_tokens: 1 << 31 }, &h200()).is_ok());
    // The longest sequence at the largest split: ranges in order, none wrapped.
    let split = SplitRule::new(7, 1).split(MAX_SEQ_LEN);
    let ranges: Vec<_> = (0..8).map(|j| split.token_range(j)).collect();
    assert_eq!(ranges[0].0, 0);
    assert_eq!(ranges[6].1, MAX_SEQ_LEN);
    assert!(ranges.windows(2).all(|w| w[0].1 == w[1].0 && w[0].0 <= w[0].1), "{ranges:?}");
    assert_eq!(ranges[7], (MAX_SEQ_LEN, MAX_SEQ_LEN), "a surplus split is empty");
    // An edited rule is refused by its check, with the field and value.
    let edited = SplitRule { min_tiles_per_split: 1 << 28, ..SplitRule::new(4, 1) };
    let err = edited.check().unwrap_err();
    assert!(err.to_string().contains("min_tiles_per_split") && err.to_string().contains("268435456"), "{err}");
    assert!(SplitRule { num_splits: 0, ..SplitRule::new(4, 1) }.check().is_err());
    assert!(SplitRule::new(MAX_SPLITS, MAX_SEQ_TILES).check().is_ok());
}

#[test]
fn zero_sms_is_an_error() {
    let mut device = h200();
    device.num_sms = 0;
    assert_eq!(plan(&llama3_8b(1, 16), Policy::Auto, &device).unwrap_err(), Error::InvalidDevice { num_sms: 0 });
}

proptest::proptest! {
    /// Whatever the policy, the splits of a sequence tile it exactly once.
    #[test]
    fn splits_cover_every_token_once(
        lens in proptest::collection::vec(0u32..70_000, 1..6),
        kv_heads in 1usize..9,
        policy in proptest::sample::select(vec!["auto", "vllm", "sglang", "fixed:7", "deterministic:64"]),
    ) {
        let p = problem(kv_heads * 3, kv_heads, lens.clone());
        let plan = plan(&p, policy.parse().unwrap(), &h200()).unwrap();
        for (split, &s) in plan.per_seq.iter().zip(&lens) {
            tiles_once_within(split, s, plan.num_splits)?;
        }
    }

    /// A captured graph keeps its plan's rule and grid while the lengths
    /// change: a ragged batch's rule (a split length) still cuts any other
    /// lengths into at most the grid's splits, each token once.
    #[test]
    fn a_plan_replayed_with_other_lengths_stays_inside_its_grid(
        planned in proptest::collection::vec(0u32..40_000, 2..8),
        replayed in proptest::collection::vec(0u32..140_000, 8),
    ) {
        let plan = plan(&problem(32, 8, planned.clone()), Policy::Auto, &h200()).unwrap();
        for &s in &replayed[..planned.len()] {
            tiles_once_within(&plan.rule.split(s), s, plan.num_splits)?;
        }
    }
}

/// `split` cuts a sequence of `seq_len` tokens into at most `num_splits`
/// consecutive, non-empty token ranges that cover it once; the ranges past
/// its active splits are empty.
fn tiles_once_within(split: &SeqSplit, seq_len: u32, num_splits: u32) -> Result<(), TestCaseError> {
    proptest::prop_assert!(split.active_splits <= num_splits);
    let mut next = 0;
    for j in 0..split.active_splits {
        let (a, b) = split.token_range(j);
        proptest::prop_assert_eq!(a, next);
        proptest::prop_assert!(b > a);
        next = b;
    }
    proptest::prop_assert_eq!(next, seq_len);
    let (a, b) = split.token_range(split.active_splits);
    proptest::prop_assert_eq!(a, b, "surplus splits are empty");
    Ok(())
}

#[test]
fn a_group_wider_than_one_cta_counts_each_of_its_ctas() {
    // StarCoder-15B: 48 query heads on one KV head; the tensor-core kernel
    // serves 16 per CTA, so each (sequence, split) takes 3 CTAs.
    let mqa = problem(48, 1, vec![16384]);
    let device = h200();
    assert_eq!(device.head_groups(48), 3);
    let wide = plan_of(mqa.clone(), &device);
    assert_eq!(wide.unsplit_blocks, 3);
    assert_eq!(wide.first_wave_splits, 44);
    assert_eq!(wide.grid[..2], [1, 3]);
    assert_eq!(wide.blocks, 3 * wide.num_splits as u64);
    // One wave of resident slots, not three: the splits a 16-head group
    // would get, times three CTAs each, would overfill the machine.
    let narrow = plan_of(problem(16, 1, vec![16384]), &device);
    assert!(wide.blocks <= 2 * 132, "{wide}");
    assert!(wide.num_splits < narrow.num_splits, "{} against {}", wide.num_splits, narrow.num_splits);
    // A kernel that serves a whole group per CTA plans one CTA per split.
    let whole = plan_of(mqa, &DeviceProps { max_query_heads_per_cta: 0, ..h200() });
    assert_eq!((whole.grid[1], whole.unsplit_blocks), (1, 1));
}

fn plan_of(problem: DecodeProblem, device: &DeviceProps) -> Plan {
    plan(&problem, Policy::Auto, device).unwrap()
}

#[test]
fn head_dim_256_without_a_device_plans_what_the_h200_sweep_found_fastest() {
    // Gemma-2-9B (16/8, d = 256): the tensor-core kernel at one CTA per SM.
    // Fastest split counts of docs/measurements/2026-12-02-s7-gemma2-d256-split-sweep.log.
    let gemma = |batch: usize, seq_len: u32| {
        DecodeProblem::new(
            AttentionShape::new(16, 8, 256).unwrap(),
            DTypes::uniform(DType::Bf16),
            KvLayout::block_table(16),
            vec![seq_len; batch],
        )
        .unwrap()
    };
    for (batch, seq_len, fastest) in [(1, 4096, 16), (1, 16384, 16), (4, 4096, 4), (16, 1024, 1), (64, 1024, 1)] {
        let p = gemma(batch, seq_len);
        let device = DeviceProps::gpu_like_for(132, &p);
        assert_eq!(device.ctas_per_sm, 1);
        let plan = plan(&p, Policy::Auto, &device).unwrap();
        // The sweep counted CTAs per (sequence, KV head): the grid's splits.
        assert_eq!(plan.grid[2], fastest, "B={batch} s={seq_len}: {plan}");
    }
    // Head dim 128 keeps two CTAs per SM.
    assert_eq!(DeviceProps::gpu_like_for(132, &llama3_8b(1, 4096)).ctas_per_sm, 2);
}

/// The lengths of a ragged batch: `count` sequences of each length, in order.
fn ragged(runs: &[(u32, usize)]) -> Vec<u32> {
    runs.iter().flat_map(|&(len, count)| std::iter::repeat_n(len, count)).collect()
}

#[test]
fn auto_cuts_a_ragged_batch_in_chunks() {
    // One 32k-token sequence beside 63 of 512 (Llama-3-8B). Unsplit, its 8
    // CTAs stream 16 MiB each while the machine idles (418 us on the H200);
    // n splits of every sequence would cut the short ones into crumbs.
    // Chunks of the long one's n-th: it spreads, the short ones stay whole.
    let plan = plan_of(problem(32, 8, ragged(&[(32768, 1), (512, 63)])), &h200());
    assert!(plan.rule.min_tiles_per_split > 1, "{plan}");
    assert!(plan.per_seq[0].active_splits >= 8, "{plan}");
    assert!(plan.per_seq[1..].iter().all(|s| s.active_splits == 1), "{plan}");
    let PolicyDetail::Auto { estimated_us, estimated_unsplit_us } = plan.detail else { panic!("{plan}") };
    assert!(estimated_us < 0.5 * estimated_unsplit_us, "{estimated_us} against {estimated_unsplit_us}");
}

#[test]
fn a_ragged_plan_says_how_many_of_its_pairs_are_active() {
    let plan = plan_of(problem(32, 8, ragged(&[(32768, 1), (512, 63)])), &h200());
    let long = plan.per_seq[0].active_splits as u64;
    assert_eq!(plan.active_pairs(), long + 63, "{plan}");
    let empty = 64 * plan.num_splits as u64 - (long + 63);
    let line = format!(
        "active      {} of the 64 x {} (sequence, split) pairs; {:.1} empty per active one",
        long + 63,
        plan.num_splits,
        empty as f64 / (long + 63) as f64
    );
    assert!(plan.to_string().lines().any(|l| l == line), "no line {line:?} in\n{plan}");
    // Equal lengths: every pair active, no such line.
    let even = plan_of(problem(32, 8, vec![32768; 4]), &h200());
    assert!(even.num_splits > 1, "{even}");
    assert_eq!(even.active_pairs(), 4 * even.num_splits as u64, "{even}");
    assert!(!even.to_string().lines().any(|l| l.starts_with("active")), "{even}");
}

#[test]
fn ragged_chunks_are_near_the_h200_sweep_best() {
    // Split lengths (tokens) that were fastest on the H200 among 512, 1024,
    // 2048, 4096 and 8192, and the ones within 5% of it
    // (docs/measurements/2026-12-02-s8-ragged-call1.txt); `auto` must pick a
    // length between the smallest and the largest of them, or no split
    // where no split was fastest. The third case was measured again with
    // the kernels that write a lone split from its CTA (s26, 1024, 1648,
    // 2048, 2736 and 4096 tokens: 266.0, 262.6, 266.0, 274.4 and 269.8 us;
    // docs/measurements/2026-12-04-s26-call1-spread8b-new.txt): `auto`
    // picks 1648 on the H200, and here since `gpu_like` took the H200's
    // bandwidth figure (at 4500 GB/s it picked 2736, 4.5% behind).
    let cases: [(usize, usize, Vec<u32>, u32, u32); 8] = [
        (32, 8, ragged(&[(32768, 1), (512, 63)]), 2048, 2560),
        (32, 8, ragged(&[(65536, 1), (1024, 15)]), 1024, 2048),
        (32, 8, (0..64).map(|i| 128 + (8192 - 128) * i / 63).collect(), 1024, 2048),
        (32, 8, (0..16).map(|i| 256 + (32768 - 256) * i / 15).collect(), 1024, 2560),
        (32, 8, ragged(&[(16384, 4), (256, 60)]), 1024, 2048),
        (8, 1, ragged(&[(32768, 1), (512, 63)]), 512, 1024),
        (8, 1, ragged(&[(65536, 1), (1024, 15)]), 512, 768),
        (8, 1, (0..64).map(|i| 128 + (8192 - 128) * i / 63).collect(), 512, 1024),
    ];
    for (heads, kv_heads, lens, shortest, longest) in cases {
        let plan = plan_of(problem(heads, kv_heads, lens), &h200());
        let tokens = plan.rule.min_tiles_per_split * TILE_TOKENS;
        assert!((shortest..=longest).contains(&tokens), "{tokens} tokens per split, not {shortest}-{longest}: {plan}");
    }
    // 256 sequences of 64-4096 tokens: no split was fastest, for both models.
    for (heads, kv_heads) in [(32, 8), (8, 1)] {
        let lens: Vec<u32> = (0..256).map(|i| 64 + (4096 - 64) * i / 255).collect();
        let plan = plan_of(problem(heads, kv_heads, lens), &h200());
        assert_eq!(plan.num_splits, 1, "{plan}");
    }
}

#[test]
fn nearly_equal_lengths_are_planned_as_equal_ones() {
    let near: Vec<u32> = (0..32).map(|i| 1000 + 100 * i / 31).collect();
    let near = plan_of(problem(8, 1, near), &h200());
    let equal = plan_of(problem(8, 1, vec![1100; 32]), &h200());
    assert_eq!(near.rule, equal.rule, "{near}\n{equal}");
}

#[test]
fn empty_ctas_are_charged() {
    // 64 one-tile sequences, one KV head: fixed:256 launches 255 empty CTAs
    // per sequence, fixed:64 63. On the H200: 43.6 against 14.8 us.
    let batch = problem(8, 1, vec![16; 64]);
    let estimate = |num_splits| estimate_us(&batch, &h200(), SplitRule::new(num_splits, 1));
    assert!(estimate(256) > estimate(64) + 20.0, "{} against {}", estimate(256), estimate(64));
    let cpu = DeviceProps { empty_cta_us: 0.0, ..h200() };
    assert_eq!(estimate_us(&batch, &cpu, SplitRule::new(256, 1)), estimate_us(&batch, &cpu, SplitRule::new(64, 1)));
}

#[test]
fn auto_gives_each_warp_a_split_where_a_head_keeps_few_partial_rows() {
    // Llama-3-8B B=4 s=1024: 4 CTAs of 16 tiles per (sequence, KV head), 128
    // in all, one per multiprocessor; now each of their 4 warps takes 4
    // consecutive tiles as its own split.
    let small = plan(&llama3_8b(4, 1024), Policy::Auto, &h200()).unwrap();
    assert_eq!((small.grid, small.blocks, small.splits_per_cta), ([4, 8, 4], 128, 4), "{small}");
    assert_eq!((small.num_splits, small.tiles_per_split, small.active_splits), (16, 4, 16), "{small}");
    assert_eq!(small.workspace_bytes, 4 * 32 * 16 * (128 + 2) * 4);
    assert!(small.to_string().contains("4 splits per CTA, one per warp"), "{small}");
    // The CTAs cover the same tiles: CTA z of the plan without warp splits
    // covers tiles [16z, 16z + 16), as do splits 4z .. 4z + 3 here.
    let whole = plan(&llama3_8b(4, 1024), Policy::Auto, &DeviceProps { splits_per_cta: 1, ..h200() }).unwrap();
    assert_eq!((whole.grid, whole.num_splits, whole.splits_per_cta), ([4, 8, 4], 4, 1), "{whole}");
    let (per_cta, per_warp) = (whole.rule.split(1024), small.rule.split(1024));
    for cta in 0..4 {
        let (start, _) = per_warp.token_range(4 * cta);
        let (_, end) = per_warp.token_range(4 * cta + 3);
        assert_eq!(per_cta.token_range(cta), (start, end));
    }
    // One tile per warp (B=1 s=1024: CTAs of 4 tiles), 64 splits per KV
    // head (256 rows per query head), two CTAs per multiprocessor: the warps merge.
    for (what, p) in [
        ("one tile per warp", llama3_8b(1, 1024)),
        ("many rows", problem(8, 1, vec![4096])),
        ("two per SM", llama3_8b(4, 16384)),
    ] {
        let planned = plan(&p, Policy::Auto, &h200()).unwrap();
        assert!(planned.use_split, "{what}: {planned}");
        assert_eq!(planned.splits_per_cta, 1, "{what}: {planned}");
    }
    // Only `auto`: `fixed:4` is 4 splits.
    let fixed = plan(&llama3_8b(4, 1024), "fixed:4".parse().unwrap(), &h200()).unwrap();
    assert_eq!((fixed.num_splits, fixed.splits_per_cta), (4, 1));
    // Unsplit calls and ragged batches (cut by a split length) keep one split per CTA.
    let unsplit = plan(&llama3_8b(64, 4096), Policy::Auto, &h200()).unwrap();
    assert_eq!((unsplit.num_splits, unsplit.splits_per_cta), (1, 1), "{unsplit}");
    let mixed = plan(&problem(32, 8, ragged(&[(32768, 1), (512, 7)])), Policy::Auto, &h200()).unwrap();
    assert_eq!(mixed.splits_per_cta, 1, "{mixed}");
    // The stream kernel's figures (f32, head_dim 192) have no warp splits.
    let f32_problem = DecodeProblem::new(
        AttentionShape::new(32, 8, 128).unwrap(),
        DTypes::uniform(DType::F32),
        KvLayout::block_table(16),
        vec![1024; 4],
    )
    .unwrap();
    let stream = plan(&f32_problem, Policy::Auto, &DeviceProps::gpu_like_for(132, &f32_problem)).unwrap();
    assert_eq!(stream.splits_per_cta, 1, "{stream}");
}

/// A plan of equal lengths carries a cut for the shorter lengths a captured
/// graph replays it at, without changing how the planned lengths themselves
/// are cut.
#[test]
fn auto_cuts_shorter_replays_apart_and_the_planned_lengths_as_before() {
    for (heads, kv_heads) in [(32, 8), (8, 1)] {
        for batch in [1, 4, 16, 64] {
            for seq_len in [1024, 4096, 16384, 65536] {
                let p = problem(heads, kv_heads, vec![seq_len; batch]);
                let device = DeviceProps::gpu_like_for(132, &p);
                let planned = plan(&p, Policy::Auto, &device).unwrap();
                // A batch rule (where the kernel cuts by the batch) cuts the
                // planned lengths with its batch_splits.
                let splits = if planned.rule.is_batch() { planned.rule.batch_splits } else { planned.rule.num_splits };
                let plain = SplitRule::new(splits, 1);
                assert_eq!(planned.rule.split(seq_len), plain.split(seq_len), "{planned}");
                assert!(planned.rule.short_below_tiles <= seq_len.div_ceil(16), "{planned}");
                if (SplitRule { num_splits: splits, batch_splits: 0, ..planned.rule }) != plain {
                    assert!(planned.reason.contains("replay's sequences"), "{planned}");
                }
            }
        }
    }
    // Llama-3-8B at B=1 planned for 65536 tokens: 32 splits; replayed at 1024
    // and 4096 tokens, 16 splits (what plans for those lengths give, as CTAs),
    // not 32 of 2 and 8 tiles.
    let long = plan(&llama3_8b(1, 65536), Policy::Auto, &h200()).unwrap();
    assert_eq!(long.rule.num_splits, 32, "{long}");
    for (len, tiles_per_split) in [(1024, 4), (4096, 16)] {
        let replay = long.rule.split(len);
        assert_eq!((replay.active_splits, replay.tiles_per_split), (16, tiles_per_split), "{len}: {long}");
        let own = plan(&llama3_8b(1, len), Policy::Auto, &h200()).unwrap();
        let cta_tiles = own.rule.split(len).tiles_per_split * own.splits_per_cta;
        assert_eq!(cta_tiles, tiles_per_split, "{own}");
    }
    // Unequal lengths (not how a graph is planned) and other policies: the plain rule.
    let mixed = plan(&problem(32, 8, vec![65536, 60000]), Policy::Auto, &h200()).unwrap();
    assert_eq!(mixed.rule, SplitRule::new(mixed.rule.num_splits, 1), "{mixed}");
    let fixed = plan(&llama3_8b(1, 65536), Policy::Fixed { splits: 32 }, &h200()).unwrap();
    assert_eq!(fixed.rule, SplitRule::new(32, 1), "{fixed}");
}

#[test]
fn short_sequences_take_the_short_split_count_below_the_threshold_only() {
    let rule =
        SplitRule { num_splits: 32, min_tiles_per_split: 2, short_splits: 8, short_below_tiles: 100, batch_splits: 0 };
    // 99 tiles: 8 splits of 13; 100 tiles: 32 splits of 4 (ceil(100 / 32)).
    assert_eq!((rule.split(99 * 16).active_splits, rule.split(99 * 16).tiles_per_split), (8, 13));
    assert_eq!((rule.split(100 * 16).active_splits, rule.split(100 * 16).tiles_per_split), (25, 4));
    // The floor still merges: 9 tiles in splits of at least 2.
    assert_eq!(rule.split(9 * 16).active_splits, 5);
    assert_eq!(rule.split(0).active_splits, 0);
    // Off (0), or not fewer than num_splits: the plain rule.
    for short_splits in [0, 32, 40] {
        let other = SplitRule { short_splits, ..rule };
        assert_eq!(other.split(99 * 16), SplitRule::new(32, 2).split(99 * 16));
    }
    // Every token is covered once, whichever count applies.
    for len in [1, 15, 16, 17, 99 * 16, 100 * 16, 5000] {
        let cut = rule.split(len);
        let covered: u32 = (0..cut.active_splits).map(|j| cut.token_range(j)).map(|(a, b)| b - a).sum();
        assert_eq!(covered, len);
    }
}

#[test]
fn replay_cuts_are_held_to_autos_own_bar() {
    // Llama-3-70B at TP=8, B=4, planned for 65536 tokens: 32 splits. A floor
    // of 4 tiles per split gives the cut of a plan for 1024 tokens (16 splits
    // of 4 tiles) and of 256 (4 of 4); the cost model puts it within 1% of
    // the plain rule on the lengths it weighs, so it is taken, as `auto`
    // takes fewer splits unless more win by 1% (s25, H200, with the kernels
    // of branch s25-direct-single-split around it: 5.67 -> 5.56 us at 1024
    // tokens, 4.98 -> 4.89 at 256).
    let long = problem(8, 1, vec![65536; 4]);
    let planned = plan(&long, Policy::Auto, &h200()).unwrap();
    assert_eq!(planned.rule.num_splits, 32, "{planned}");
    assert_eq!(planned.rule.min_tiles_per_split, 4, "{planned}");
    for (len, own_splits) in [(1024, 16), (256, 4)] {
        assert_eq!(planned.rule.split(len).active_splits, own_splits, "{len}: {planned}");
        let own = plan(&problem(8, 1, vec![len; 4]), Policy::Auto, &h200()).unwrap();
        assert_eq!(own.rule.split(len).active_splits, own_splits, "{own}");
    }
    assert_eq!(planned.rule.split(65536).active_splits, 32, "{planned}");
}

#[test]
fn lone_splits_written_by_their_cta_carry_no_partial_state() {
    // One 32k-token sequence beside 63 of 512: the short ones stay whole, so
    // where their CTAs write the output themselves (the CUDA stream and
    // tensor-core kernels) only the long one's splits go through the
    // workspace; where the reducer merges every split, all of them do.
    let batch = problem(32, 8, ragged(&[(32768, 1), (512, 63)]));
    let direct = plan_of(batch.clone(), &h200());
    let merging = plan(&batch, Policy::Auto, &DeviceProps { reduce_wait_us: None, ..h200() }).unwrap();
    for plan in [&direct, &merging] {
        assert_eq!(plan.splits_per_cta, 1, "{plan}");
        assert!(plan.per_seq[0].active_splits > 1, "{plan}");
        assert!(plan.per_seq[1..].iter().all(|s| s.active_splits == 1), "{plan}");
    }
    let record = 2 * 32 * (128 + 2) * 4;
    let long_rows = direct.per_seq[0].active_splits as u64;
    assert_eq!(direct.partial_traffic_bytes, long_rows * record, "{direct}");
    assert_eq!(merging.partial_traffic_bytes, merging.active_pairs() * record, "{merging}");

    // A split rule under which every sequence has one active split costs the
    // reducer's wait alone where the CTAs write, a whole reduce where not.
    let short = problem(32, 8, vec![512; 4]);
    let lone = SplitRule { min_tiles_per_split: 64, ..SplitRule::new(8, 1) };
    let unsplit_us = estimate_us(&short, &h200(), SplitRule::new(1, 1));
    let wait = h200().reduce_wait_us.unwrap();
    // Plus the 7 empty splits of each of the 32 (sequence, KV head) pairs.
    let empty_us = (32 * 7) as f64 * h200().empty_cta_us / (132 * 2) as f64;
    let lone_us = estimate_us(&short, &h200(), lone);
    assert!((lone_us - unsplit_us - wait - empty_us).abs() < 1e-6, "{lone_us} against {unsplit_us} unsplit");
    let merging = DeviceProps { reduce_wait_us: None, ..h200() };
    // Merging costs a dependent launch and a row per query head instead.
    let merged_us = estimate_us(&short, &merging, lone);
    assert!(merged_us - lone_us > h200().launch_overhead_us - wait, "{merged_us} against {lone_us}");
}

/// A batch rule at equal lengths cuts as the per-sequence rule with
/// `batch_splits` splits (floors and short counts included), so a plan of
/// equal lengths runs its planned lengths as before; at ragged lengths every
/// sequence gets the split length of the mean, and the pairs stay within
/// `num_seqs * (batch_splits + 1)`.
#[test]
fn a_batch_rule_cuts_equal_lengths_as_planned_and_ragged_ones_by_their_mean() {
    proptest::proptest!(|(batch_splits in 1u32..40, floor in 1u32..64, short_splits in 0u32..8,
                          short_below in 0u32..512, extra in 0u32..200, len in 0u32..70000,
                          lens in proptest::collection::vec(0u32..70000, 1..64))| {
        let per_seq = SplitRule { num_splits: batch_splits, min_tiles_per_split: floor, short_splits,
                                  short_below_tiles: short_below, batch_splits: 0 };
        let batch = SplitRule { num_splits: batch_splits + extra, batch_splits, ..per_seq };
        let equal = vec![len; lens.len()];
        proptest::prop_assert_eq!(batch.for_batch(&equal).split(len), per_seq.split(len));
        proptest::prop_assert_eq!(batch.split(len), per_seq.split(len));
        let cut = batch.for_batch(&lens);
        let tiles: u64 = lens.iter().map(|&s| s.div_ceil(16) as u64).sum();
        let mean = tiles.div_ceil(lens.len() as u64) as u32;
        let pairs: u64 = lens.iter().map(|&s| cut.split(s).active_splits as u64).sum();
        for &s in &lens {
            let split = cut.split(s);
            proptest::prop_assert!(split.tiles_per_split >= per_seq.split(mean * 16).tiles_per_split);
            proptest::prop_assert!(split.active_splits <= batch.num_splits);
        }
        proptest::prop_assert!(pairs <= lens.len() as u64 * (batch_splits as u64 + 1), "{pairs} pairs");
        proptest::prop_assert_eq!(batch.batch_pair_bound(lens.len()), lens.len() as u64 * (batch_splits as u64 + 1));
    });
}

/// `auto` cuts a GPU plan of equal lengths by the batch where the kernel can
/// (`cuts_by_batch`) and one split per CTA: not at B = 1, not for ragged
/// problems (planned for their own lengths), not with a split per warp.
#[test]
fn auto_cuts_plans_of_equal_lengths_by_the_batch_where_the_kernel_can() {
    let gpu = DeviceProps { cuts_by_batch: true, ..h200() };
    let graph = plan(&llama3_8b(64, 65536), Policy::Auto, &gpu).unwrap();
    let per_seq = plan(&llama3_8b(64, 65536), Policy::Auto, &h200()).unwrap();
    assert_eq!(graph.rule.batch_splits, per_seq.rule.num_splits.max(1), "{graph}");
    assert_eq!(graph.rule.num_splits, BATCH_ROWS_PER_HEAD / 64, "{graph}");
    assert_eq!(graph.per_seq, per_seq.per_seq, "{graph}");
    assert_eq!((graph.grid, per_seq.grid), ([64, 8, 2], [64, 8, 1]), "{graph}");
    assert!(graph.use_split && graph.workspace_bytes == 64 * 32 * 32 * (128 + 2) * 4, "{graph}");
    // One long sequence among short ones, replayed: the long one is spread.
    let mut lens = vec![512u32; 64];
    lens[0] = 32768;
    let cut = graph.rule.for_batch(&lens);
    assert_eq!(cut.split(32768).active_splits, 32, "{cut:?}");
    assert!(!plan(&llama3_8b(1, 65536), Policy::Auto, &gpu).unwrap().rule.is_batch());
    assert!(!plan(&problem(32, 8, lens), Policy::Auto, &gpu).unwrap().rule.is_batch());
    let warp_split = plan(&llama3_8b(8, 2048), Policy::Auto, &gpu).unwrap();
    assert!(warp_split.splits_per_cta > 1 && !warp_split.rule.is_batch(), "{warp_split}");
    assert!(!plan(&llama3_8b(64, 65536), Policy::Fixed { splits: 4 }, &gpu).unwrap().rule.is_batch());
}

/// A CUDA GPU is planned with at least the H200's figure; a faster memory
/// keeps its own, and a figure that is not a positive number gives the
/// H200's.
#[test]
fn a_gpu_is_planned_with_at_least_the_fits_bandwidth() {
    use crate::{gpu_plan_gbps, GPU_FIT_GBPS};
    assert_eq!(gpu_plan_gbps(3020.0), GPU_FIT_GBPS);
    assert_eq!(gpu_plan_gbps(GPU_FIT_GBPS), GPU_FIT_GBPS);
    assert_eq!(gpu_plan_gbps(8000.0), 8000.0);
    for gbps in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert_eq!(gpu_plan_gbps(gbps), GPU_FIT_GBPS, "{gbps}");
    }
}

/// An H100 (3020 GB/s derived) is planned as an H200. With its own figure
/// `auto` split Llama-3-8B B = 16, s = 4096 in 2 (92.0 us on the H100, s36;
/// 89.0 unsplit) and Falcon-7B B = 32, s = 512 in 4 (20.34 us, s37 call 3;
/// 9.09 unsplit).
#[test]
fn an_h100_is_planned_as_an_h200() {
    let own = DeviceProps { mem_bandwidth_gbps: 3020.0, ..h200() };
    let floored = DeviceProps { mem_bandwidth_gbps: crate::gpu_plan_gbps(3020.0), ..h200() };
    let falcon = |b: usize, s: u32| {
        DecodeProblem::new(
            AttentionShape::new(71, 1, 64).unwrap(),
            DTypes::uniform(DType::Bf16),
            KvLayout::block_table(16),
            vec![s; b],
        )
        .unwrap()
    };
    for (problem, own_splits) in [(llama3_8b(16, 4096), 2), (falcon(32, 512), 4)] {
        let own = plan(&problem, Policy::Auto, &own).unwrap();
        let floored = plan(&problem, Policy::Auto, &floored).unwrap();
        assert_eq!(own.grid[2], own_splits, "{own}");
        assert_eq!(floored.grid[2], 1, "{floored}");
        assert_eq!(floored.grid, plan(&problem, Policy::Auto, &h200()).unwrap().grid);
    }
}

#[test]
fn the_kv_line_says_when_its_product_overflows() {
    let small = plan(&llama3_8b(2, 10), Policy::Auto, &h200()).unwrap();
    let line = "kv          2 * 20 tokens * 8 kv heads * d 128 * 2 B = 81920 B";
    assert!(small.to_string().lines().any(|l| l == line), "no line {line:?} in\n{small}");
    // 65536 KV heads of 65536 sequences of 2^31 - 1 tokens: past u64.
    let huge = DecodeProblem::new(
        AttentionShape::new(65536, 65536, 256).unwrap(),
        DTypes::uniform(DType::Bf16),
        KvLayout::block_table(16),
        vec![i32::MAX as u32; 65536],
    )
    .unwrap();
    let planned = plan(&huge, Policy::Auto, &h200()).unwrap();
    assert_eq!(planned.kv_bytes, u64::MAX);
    let text = planned.to_string();
    let kv = text.lines().find(|l| l.starts_with("kv ")).unwrap();
    assert!(kv.ends_with(&format!("= more than {} B", u64::MAX)), "{kv}");
}
