//! Instruction sets and their run-time detection.

/// A kernel family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust; the reference for the others.
    Scalar,
    /// 256-bit integer SIMD (AVX2 + FMA).
    Avx2,
    /// 512-bit integer dot products (AVX-512 F/BW/VNNI).
    Avx512Vnni,
}

impl Isa {
    /// Every kernel family, fastest first.
    pub const ALL: [Isa; 3] = [Isa::Avx512Vnni, Isa::Avx2, Isa::Scalar];

    /// Whether this CPU can run the family.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => {
                Isa::Avx2.available()
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The family's name: `scalar`, `avx2`, `avx512vnni`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512vnni",
        }
    }

    /// The fastest family this CPU runs.
    pub fn best() -> Isa {
        Isa::ALL
            .into_iter()
            .find(|i| i.available())
            .unwrap_or(Isa::Scalar)
    }

    /// The families this CPU runs, fastest first.
    pub fn available_all() -> Vec<Isa> {
        Isa::ALL.into_iter().filter(|i| i.available()).collect()
    }
}
