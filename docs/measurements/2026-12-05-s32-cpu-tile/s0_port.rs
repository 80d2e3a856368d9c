use std::arch::x86_64::*;
const D: usize = 128;
const T: usize = 16;
#[repr(align(64))]
struct K([u16; T * D]);
#[repr(align(64))]
struct Q([f32; 8 * D]);

#[inline(always)]
unsafe fn even(p: *const u16) -> __m256 { _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_loadu_si256(p as *const __m256i))) }
#[inline(always)]
unsafe fn odd(p: *const u16, mask: __m256i) -> __m256 { _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256(p as *const __m256i), mask)) }
#[inline(always)]
unsafe fn tsum(a: [__m256; 8]) -> __m256 {
    let t0 = _mm256_hadd_ps(a[0], a[1]); let t1 = _mm256_hadd_ps(a[2], a[3]);
    let t2 = _mm256_hadd_ps(a[4], a[5]); let t3 = _mm256_hadd_ps(a[6], a[7]);
    let u0 = _mm256_hadd_ps(t0, t1); let u1 = _mm256_hadd_ps(t2, t3);
    _mm256_add_ps(_mm256_permute2f128_ps::<0x20>(u0, u1), _mm256_permute2f128_ps::<0x31>(u0, u1))
}
#[inline(never)]
#[target_feature(enable = "avx2,fma")]
unsafe fn s0(k: &K, q: *const f32, out: &mut [f32; 8 * T], mask: __m256i) {
    for g in (0..8).step_by(4) {
        for r in (0..T).step_by(2) {
            let mut a = [[_mm256_setzero_ps(); 2]; 4];
            let mut c = 0;
            while c < D {
                let k0 = k.0.as_ptr().add(r * D + c); let k1 = k.0.as_ptr().add((r + 1) * D + c);
                let (k0e, k1e) = (even(k0), even(k1));
                for h in 0..4 { let qq = _mm256_loadu_ps(q.add((g + h) * D + c)); a[h][0] = _mm256_fmadd_ps(qq, k0e, a[h][0]); a[h][1] = _mm256_fmadd_ps(qq, k1e, a[h][1]); }
                let (k0o, k1o) = (odd(k0, mask), odd(k1, mask));
                for h in 0..4 { let qq = _mm256_loadu_ps(q.add((g + h) * D + c + 8)); a[h][0] = _mm256_fmadd_ps(qq, k0o, a[h][0]); a[h][1] = _mm256_fmadd_ps(qq, k1o, a[h][1]); }
                c += 16;
            }
            let s = tsum([a[0][0], a[0][1], a[1][0], a[1][1], a[2][0], a[2][1], a[3][0], a[3][1]]);
            _mm256_storeu_ps(out.as_mut_ptr().add(g * T + r * 4), s);
        }
    }
}
fn main() {
    let mut k = Box::new(K([0; T * D]));
    for (i, x) in k.0.iter_mut().enumerate() { *x = 0x3f80 + (i & 7) as u16; }
    let mut q = Box::new(Q([0.0; 8 * D]));
    for (i, x) in q.0.iter_mut().enumerate() { *x = 1e-3 * (i % D) as f32; }
    let off: usize = std::env::args().nth(1).map(|a| a.parse().unwrap()).unwrap_or(0);
    let mut qv = vec![0.0f32; 8 * D + 16];
    let base = qv.as_ptr().align_offset(64);
    qv[base + off..base + off + 8 * D].copy_from_slice(&q.0);
    let qp = unsafe { qv.as_ptr().add(base + off) };
    let mut out = [0.0f32; 8 * T];
    let mask = unsafe { _mm256_set1_epi32(std::hint::black_box(0xffff0000u32) as i32) };
    let mut best = f64::MAX;
    for _ in 0..9 {
        let t0 = std::time::Instant::now();
        for _ in 0..20000 { unsafe { s0(&k, std::hint::black_box(qp), &mut out, mask) }; std::hint::black_box(&out); }
        best = best.min(t0.elapsed().as_secs_f64() * 1e9 / 20000.0);
    }
    println!("rust S0 (q +{} floats): {best:.0} ns per 2048 FMAs ({:.3})", off, out[5]);
}
