//! What this build embeds of kernels/hip (see build.rs), the kernel names the
//! backend launches, and the choice of a code object for a device.

use decode_attn_core::shape::SUPPORTED_HEAD_DIMS;
use decode_attn_core::DType;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/embedded.rs"));
}

/// `(file name, text)` of the kernel source, when kernels/hip had one at build time.
pub fn source() -> Option<(&'static str, &'static str)> {
    embedded::SOURCE
}

/// The headers the source includes, under the names it includes them by.
pub fn headers() -> &'static [(&'static str, &'static str)] {
    embedded::HEADERS
}

/// `(architecture, ELF code object)` compiled at build time; empty without a toolchain.
pub fn code_objects() -> &'static [(&'static str, &'static [u8])] {
    embedded::CODE_OBJECTS
}

/// How the code objects came to be (or why there are none), for messages.
pub fn aot_note() -> &'static str {
    embedded::AOT_NOTE
}

/// Threads per workgroup of both kernels.
pub const THREADS: u32 = 256;

/// Element types the kernels are instantiated for (one type for Q, KV and out).
pub const DTYPES: &[DType] = &[DType::F32, DType::F16, DType::Bf16];

fn dtype_suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        _ => "bf16",
    }
}

/// `decode_kvgrid_<T>_d<D>`: grid `(num_seqs, num_splits, num_kv_heads)`.
pub fn decode_kernel(dtype: DType, head_dim: usize) -> String {
    format!("decode_kvgrid_{}_d{head_dim}", dtype_suffix(dtype))
}

/// `decode_kvgrid_reduce_<T>_d<D>`: grid `(num_seqs, num_q_heads)`, only when split.
pub fn reduce_kernel(dtype: DType, head_dim: usize) -> String {
    format!("decode_kvgrid_reduce_{}_d{head_dim}", dtype_suffix(dtype))
}

/// Every entry point the backend may look up.
pub fn all_kernel_names() -> Vec<String> {
    let mut names = Vec::new();
    for &dtype in DTYPES {
        for &d in SUPPORTED_HEAD_DIMS {
            names.push(decode_kernel(dtype, d));
            names.push(reduce_kernel(dtype, d));
        }
    }
    names
}

/// The processor part of a `gcnArchName`: `gfx942:sramecc+:xnack-` -> `gfx942`.
pub fn processor(arch_name: &str) -> &str {
    arch_name.split(':').next().unwrap_or(arch_name).trim()
}

/// A target feature setting of an architecture name, e.g. `xnack` -> `Some('-')`.
fn feature(arch_name: &str, name: &str) -> Option<char> {
    arch_name.split(':').skip(1).find_map(|f| f.strip_prefix(name)).and_then(|rest| rest.chars().next())
}

/// Whether a code object built for `object_arch` runs on a device reporting
/// `device_arch`: the same processor, and every feature the object pins
/// (`:xnack+`, `:sramecc-`) set the same way on the device. Objects built
/// without feature settings (what build.rs makes) run on either setting.
pub fn compatible(object_arch: &str, device_arch: &str) -> bool {
    if processor(object_arch) != processor(device_arch) || processor(object_arch).is_empty() {
        return false;
    }
    object_arch.split(':').skip(1).all(|pinned| {
        let (name, setting) = pinned.split_at(pinned.len().saturating_sub(1));
        match feature(device_arch, name) {
            Some(device_setting) => setting.starts_with(device_setting),
            None => true,
        }
    })
}

/// The best embedded object for a device: a compatible one, preferring the
/// one that pins the most features.
pub fn select<'a>(device_arch: &str, objects: &'a [(&'a str, &'a [u8])]) -> Option<&'a (&'a str, &'a [u8])> {
    objects.iter().filter(|(arch, _)| compatible(arch, device_arch)).max_by_key(|(arch, _)| arch.matches(':').count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_chosen_by_processor_and_pinned_features() {
        let objects: &[(&str, &[u8])] = &[("gfx90a", b"a"), ("gfx942", b"b"), ("gfx942:xnack+", b"c")];
        assert_eq!(select("gfx942:sramecc+:xnack-", objects).map(|o| o.0), Some("gfx942"));
        assert_eq!(select("gfx942:sramecc+:xnack+", objects).map(|o| o.0), Some("gfx942:xnack+"));
        assert_eq!(select("gfx90a:sramecc-:xnack-", objects).map(|o| o.0), Some("gfx90a"));
        assert_eq!(select("gfx90a", objects).map(|o| o.0), Some("gfx90a"));
        // Another processor never matches, however close its name.
        assert_eq!(select("gfx940:sramecc+:xnack-", objects), None);
        assert_eq!(select("gfx9", objects), None);
        assert_eq!(select("gfx1100", objects), None);
        assert_eq!(select("", objects), None);
        assert_eq!(select("gfx942", &[]), None);
        assert_eq!(processor("gfx942:sramecc+:xnack-"), "gfx942");
    }

    #[test]
    fn kernel_names_follow_the_contract() {
        assert_eq!(decode_kernel(DType::Bf16, 128), "decode_kvgrid_bf16_d128");
        assert_eq!(reduce_kernel(DType::F16, 64), "decode_kvgrid_reduce_f16_d64");
        assert_eq!(decode_kernel(DType::F32, 256), "decode_kvgrid_f32_d256");
        assert_eq!(all_kernel_names().len(), 3 * SUPPORTED_HEAD_DIMS.len() * 2);
    }

    #[test]
    fn embedded_code_objects_are_elf_and_export_every_kernel() {
        // Without a toolchain at build time there is nothing to check: say so.
        if code_objects().is_empty() {
            eprintln!("no embedded HIP code objects ({})", aot_note());
            return;
        }
        for (arch, bytes) in code_objects() {
            assert!(bytes.starts_with(b"\x7fELF"), "{arch}: not ELF");
            // e_machine (offset 18, little-endian) is EM_AMDGPU = 224.
            assert_eq!(u16::from_le_bytes([bytes[18], bytes[19]]), 224, "{arch}: not an AMDGPU object");
            for name in all_kernel_names() {
                let mut needle = name.clone().into_bytes();
                needle.push(0);
                assert!(bytes.windows(needle.len()).any(|w| w == needle.as_slice()), "{arch}: no symbol {name}");
            }
        }
    }

    #[test]
    fn embedded_source_brings_every_header_it_includes() {
        let Some((name, text)) = source() else {
            eprintln!("kernels/hip had no source when this was built");
            return;
        };
        assert!(name.ends_with(".hip"));
        for (header, _) in headers() {
            assert!(!header.is_empty());
        }
        for line in text.lines().filter(|l| l.trim_start().starts_with("#include \"")) {
            let included = line.split('"').nth(1).unwrap();
            assert!(headers().iter().any(|(h, _)| *h == included), "{included} is not embedded");
        }
    }
}
