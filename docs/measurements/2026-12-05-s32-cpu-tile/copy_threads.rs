// Copy bandwidth (read + write counted) of 256 MiB with 1 and 2 threads, median of 15.
use std::time::Instant;
fn main() {
    let bytes = 256usize << 20;
    let src: Vec<u8> = (0..bytes).map(|i| i as u8).collect();
    let mut dst = vec![0u8; bytes];
    dst.copy_from_slice(&src);
    for threads in [1usize, 2, 1, 2] {
        let mut times = Vec::new();
        for _ in 0..15 {
            let start = Instant::now();
            std::thread::scope(|s| {
                let chunk = bytes / threads;
                for (d, sr) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
                    s.spawn(move || d.copy_from_slice(std::hint::black_box(sr)));
                }
            });
            times.push(start.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        println!("{threads} thread(s): median {:.1} GB/s, best {:.1} GB/s", 2.0 * bytes as f64 / times[7] / 1e9, 2.0 * bytes as f64 / times[0] / 1e9);
    }
}
