//! Software prefetch of the weight stream, shared by the SIMD kernels.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};

/// Lines ahead of the weight stream fetched in software. The hardware prefetcher alone left
/// out-of-cache one-row matmuls at half the memory bandwidth (a 151936 × 1536 Q6_K logits
/// projection: 19 ms on one thread against candle's 8 ms); two units ahead keeps the
/// stream in flight while the unit in hand is computed.
const PREFETCH_UNITS: usize = 2;

/// Step `i` of `steps` through a unit of `unit` bytes at `b`: prefetches its share of the
/// unit [`PREFETCH_UNITS`] ahead (a prefetch past the buffer's end is harmless).
///
/// # Safety
/// Only an address is formed (`wrapping_add`); prefetches never fault.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn prefetch_ahead(b: *const u8, unit: usize, i: usize, steps: usize) {
    let lines = unit.div_ceil(64);
    let per = lines.div_ceil(steps);
    let ahead = b.wrapping_add(PREFETCH_UNITS * unit);
    for l in i * per..((i + 1) * per).min(lines) {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * l) as *const i8);
    }
}
