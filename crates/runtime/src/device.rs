//! Device selection (`cpu`, `cuda:N`) and the thread-count setting.

use crate::{Error, Result};
use candle_core::Device;
use std::sync::OnceLock;

/// Parses a device string: `cpu` (default) or `cuda:N` (only with the `cuda` feature).
pub fn parse_device(spec: &str) -> Result<Device> {
    let spec_trim = spec.trim();
    if spec_trim.is_empty() || spec_trim.eq_ignore_ascii_case("cpu") {
        return Ok(Device::Cpu);
    }
    let err = |reason: &str| Error::Device {
        spec: spec.to_string(),
        reason: reason.to_string(),
    };
    let ordinal = match spec_trim.strip_prefix("cuda") {
        Some("") => 0,
        Some(rest) => rest
            .strip_prefix(':')
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| err("expected `cuda` or `cuda:N` with N a GPU index"))?,
        None => return Err(err("expected `cpu` or `cuda:N`")),
    };
    if !cfg!(feature = "cuda") {
        return Err(err(
            "this build has no CUDA support; rebuild with `--features cuda`",
        ));
    }
    Device::new_cuda(ordinal).map_err(|e| err(&e.to_string()))
}

static THREADS: OnceLock<usize> = OnceLock::new();

/// Sets the number of CPU threads used by every matmul and attention kernel.
///
/// candle's dense kernels run on rayon's global pool and split work by `RAYON_NUM_THREADS`;
/// its quantized kernels run on a separate persistent pool sized by `CANDLE_NUM_THREADS`
/// (default: physical cores). All three are set here, before either pool exists, so call
/// this before loading a model. A second call with a different count is an error naming the
/// count already in force. `0` means all logical cores.
pub fn set_threads(n: usize) -> Result<usize> {
    let wanted = if n == 0 {
        std::thread::available_parallelism().map_or(1, |p| p.get())
    } else {
        n
    };
    let in_force = *THREADS.get_or_init(|| {
        std::env::set_var("RAYON_NUM_THREADS", wanted.to_string());
        std::env::set_var("CANDLE_NUM_THREADS", wanted.to_string());
        // The global pool may already exist if rayon was used before this call; the
        // environment variable then still governs candle's own splitting.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(wanted)
            .build_global();
        wanted
    });
    if in_force != wanted {
        return Err(Error::Device {
            spec: format!("threads={wanted}"),
            reason: format!("thread count already set to {in_force} in this process"),
        });
    }
    Ok(in_force)
}

/// The thread count in force: the value given to [`set_threads`], else rayon's.
pub fn threads() -> usize {
    THREADS
        .get()
        .copied()
        .unwrap_or_else(rayon::current_num_threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_and_rejects_garbage() {
        assert!(parse_device("cpu").unwrap().is_cpu());
        assert!(parse_device("").unwrap().is_cpu());
        let e = parse_device("tpu:0").unwrap_err().to_string();
        assert!(e.contains("tpu:0"), "{e}");
        let e = parse_device("cuda:x").unwrap_err().to_string();
        assert!(e.contains("cuda:N"), "{e}");
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_feature_names_the_feature() {
        let e = parse_device("cuda:0").unwrap_err().to_string();
        assert!(e.contains("--features cuda"), "{e}");
    }
}
