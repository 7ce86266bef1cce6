//! From flags to settings: the global runtime flags, the engine flags shared by the model
//! commands (`compact`, `bench`, `eval`, `ingest --summarize`), and the command-line value
//! enums (methods, overflow and verification modes) with their mapping onto the engine's and
//! the evaluation's types. Nothing here loads a model (see `load.rs`).

use anyhow::Result;
use clap::builder::{PossibleValue, TypedValueParser};
use clap::ValueEnum;
use speccompact_engine::verify::Verify;
use speccompact_engine::{CompactionConfig, Method, Overflow};
use speccompact_eval::EvalMethod;
use speccompact_runtime::{set_threads, LookupMode, RuntimeSettings};
use std::ffi::OsStr;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};

/// The global flags: runtime settings for every command that runs a model.
#[derive(clap::Args)]
pub struct RuntimeArgs {
    /// Runtime settings file (see configs/runtime.toml); flags below override it.
    #[arg(long, global = true)]
    pub runtime_config: Option<PathBuf>,
    /// CPU threads for every kernel (0 = all cores).
    #[arg(long, global = true)]
    pub threads: Option<usize>,
    /// Device: `cpu` or `cuda:N`.
    #[arg(long, global = true)]
    pub device: Option<String>,
    /// Token lookup in every decode: `auto`, `on` or `off` (see configs/runtime.toml);
    /// `bench` takes a list (`off,on,auto`) and runs each mode in turn.
    #[arg(long, global = true, value_delimiter = ',')]
    pub lookup: Vec<LookupMode>,
}

impl RuntimeArgs {
    /// Runtime settings from `--runtime-config`, with `--threads` / `--device` applied and
    /// the thread pool set.
    pub fn settings(&self) -> Result<RuntimeSettings> {
        if self.lookup.len() > 1 {
            anyhow::bail!(
                "--lookup takes one mode here (auto, on or off); a list such as off,on is for `bench`"
            );
        }
        self.settings_with_lookup(self.lookup.first().copied())
    }

    /// [`Self::settings`] with `lookup` instead of the flag (`None`: as configured).
    pub fn settings_with_lookup(&self, lookup: Option<LookupMode>) -> Result<RuntimeSettings> {
        let mut settings = file_or_default(self.runtime_config.as_deref(), RuntimeSettings::load)?;
        if let Some(t) = self.threads {
            settings.threads = t;
        }
        if let Some(d) = &self.device {
            settings.device = d.clone();
        }
        if let Some(l) = lookup {
            settings.lookup = l;
        }
        set_threads(settings.threads)?;
        Ok(settings)
    }
}

/// The settings `load` reads from `file` when one is given, else `T`'s built-in defaults.
pub fn file_or_default<T: Default, E>(
    file: Option<&Path>,
    load: impl FnOnce(&Path) -> Result<T, E>,
) -> Result<T>
where
    anyhow::Error: From<E>,
{
    Ok(match file {
        Some(p) => load(p)?,
        None => T::default(),
    })
}

/// Model and settings choices shared by `compact` and `bench`.
#[derive(clap::Args)]
pub struct EngineArgs {
    /// Drafter: store name or path (default from the settings: smollm2-135m-instruct).
    #[arg(long)]
    pub drafter: Option<String>,
    /// Target: store name or path (default from the settings: qwen2.5-coder-0.5b-instruct).
    #[arg(long)]
    pub target: Option<String>,
    /// A LoRA adapter on the drafter: a folder in PEFT's layout (`align train` writes one).
    #[arg(long, value_name = "DIR")]
    pub drafter_adapter: Option<PathBuf>,
    /// Acceptance threshold on p_yes / (p_yes + p_no).
    #[arg(long)]
    pub eta: Option<f32>,
    /// Compaction settings file (see configs/compaction.toml); keys given replace the
    /// built-in defaults, flags win over the file.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// A history over the target's context: `stages` (default), `error` or `middle-cut`.
    #[arg(long, hide_possible_values = true)]
    pub overflow: Option<OverflowArg>,
    /// Line verification: `calibrated` (default: the target's calibrated rule over the
    /// verification scores), `ratio` (r >= eta alone) or `exact` (lossless: equals
    /// target-self).
    #[arg(long, hide_possible_values = true)]
    pub verify: Option<VerifyArg>,
}

impl EngineArgs {
    /// The compaction settings: the file (else the built-in defaults), the flags over it,
    /// validated.
    pub fn config(&self) -> Result<CompactionConfig> {
        let mut cfg = file_or_default(self.config.as_deref(), CompactionConfig::load)?;
        if let Some(d) = &self.drafter {
            cfg.drafter = d.clone();
        }
        if let Some(t) = &self.target {
            cfg.target = t.clone();
        }
        if let Some(a) = &self.drafter_adapter {
            cfg.drafter_adapter = Some(a.display().to_string());
        }
        if let Some(e) = self.eta {
            cfg.set_eta(e);
        }
        if let Some(o) = self.overflow {
            cfg.overflow = o.into();
        }
        if let Some(v) = self.verify {
            cfg.verify = v.into();
            cfg.explicit.push("verify".into());
        }
        cfg.validate("command line")?;
        Ok(cfg)
    }
}

/// A compaction method, as spelled on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MethodArg {
    Speculative,
    Sequential,
    TargetSelf,
    DrafterOnly,
}

impl From<MethodArg> for Method {
    fn from(m: MethodArg) -> Self {
        match m {
            MethodArg::Speculative => Method::Speculative,
            MethodArg::Sequential => Method::Sequential,
            MethodArg::TargetSelf => Method::TargetSelf,
            MethodArg::DrafterOnly => Method::DrafterOnly,
        }
    }
}

/// A method under evaluation: a compaction method or a baseline context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum EvalMethodArg {
    Speculative,
    Sequential,
    TargetSelf,
    DrafterOnly,
    TruncateTail,
    Full,
}

impl From<EvalMethodArg> for EvalMethod {
    fn from(m: EvalMethodArg) -> Self {
        let engine = |m: MethodArg| EvalMethod::Engine(m.into());
        match m {
            EvalMethodArg::Speculative => engine(MethodArg::Speculative),
            EvalMethodArg::Sequential => engine(MethodArg::Sequential),
            EvalMethodArg::TargetSelf => engine(MethodArg::TargetSelf),
            EvalMethodArg::DrafterOnly => engine(MethodArg::DrafterOnly),
            EvalMethodArg::TruncateTail => EvalMethod::TruncateTail,
            EvalMethodArg::Full => EvalMethod::Full,
        }
    }
}

/// What to do with a history over the target's context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OverflowArg {
    Stages,
    Error,
    MiddleCut,
}

impl From<OverflowArg> for Overflow {
    fn from(o: OverflowArg) -> Self {
        match o {
            OverflowArg::Stages => Overflow::Stages,
            OverflowArg::Error => Overflow::Error,
            OverflowArg::MiddleCut => Overflow::MiddleCut,
        }
    }
}

/// How drafted lines are verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum VerifyArg {
    Calibrated,
    Ratio,
    Exact,
}

impl From<VerifyArg> for Verify {
    fn from(v: VerifyArg) -> Self {
        match v {
            VerifyArg::Calibrated => Verify::Calibrated,
            VerifyArg::Ratio => Verify::Ratio,
            VerifyArg::Exact => Verify::Exact,
        }
    }
}

/// Parses one item of a comma-separated list of `E` values, ignoring the spaces around it
/// (`--methods "speculative, sequential"`); errors list the possible values.
#[derive(Clone)]
pub struct Trimmed<E>(PhantomData<E>);

/// The [`Trimmed`] parser of `E`.
pub fn trimmed<E>() -> Trimmed<E> {
    Trimmed(PhantomData)
}

impl<E: ValueEnum + Clone + Send + Sync + 'static> TypedValueParser for Trimmed<E> {
    type Value = E;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> std::result::Result<E, clap::Error> {
        let value = value.to_str().map_or(value, |s| OsStr::new(s.trim()));
        clap::builder::EnumValueParser::<E>::new().parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(
            E::value_variants()
                .iter()
                .filter_map(ValueEnum::to_possible_value),
        ))
    }
}

/// `--tail-budget`: `matched` or a positive token count.
pub fn tail_budget(
    s: &str,
) -> std::result::Result<speccompact_eval::TailBudget, speccompact_eval::Error> {
    s.parse()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every command-line spelling names the engine's value of the same name.
    #[test]
    fn value_enums_spell_the_engine_names() {
        for m in MethodArg::value_variants() {
            let name = m.to_possible_value().unwrap().get_name().to_string();
            assert_eq!(Method::from(*m).as_str(), name);
        }
        for m in EvalMethodArg::value_variants() {
            let name = m.to_possible_value().unwrap().get_name().to_string();
            assert_eq!(EvalMethod::from(*m).as_str(), name);
        }
        assert_eq!(EvalMethodArg::value_variants().len(), EvalMethod::ALL.len());
        for o in OverflowArg::value_variants() {
            let name = o.to_possible_value().unwrap().get_name().to_string();
            let toml = toml::to_string(&std::collections::BTreeMap::from([(
                "o",
                Overflow::from(*o),
            )]))
            .unwrap();
            assert_eq!(toml.trim(), format!("o = \"{name}\""));
        }
        for v in VerifyArg::value_variants() {
            let name = v.to_possible_value().unwrap().get_name().to_string();
            assert_eq!(name.parse::<Verify>().unwrap(), Verify::from(*v));
        }
    }
}
