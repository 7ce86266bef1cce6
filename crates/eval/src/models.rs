//! The model parts of the evaluation, over any [`Backend`]: the reader (answers each question
//! from a context, greedy, one line) and the one-token judges (next-step agreement and the
//! five slot-adequacy criteria), which score yes/no with the verification rule
//! (p_yes / (p_yes + p_no) against η). Prompts come from `configs/eval.toml`.

use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use speccompact_engine::{score, Backend, CompactionConfig, Request, RequestKind, Response};

/// The built-in evaluation settings (`configs/eval.toml`).
pub const DEFAULT_EVAL_CONFIG: &str = include_str!("../configs/eval.toml");

/// One slot-adequacy criterion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Criterion {
    /// Short name (report column).
    pub name: String,
    /// The yes/no question asked after the section.
    pub question: String,
}

/// Reader, judge and bootstrap settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalPrompts {
    /// The reader's instructions.
    pub reader_system: String,
    /// One question (`{question}`).
    pub reader_question: String,
    /// Most tokens per answer.
    pub reader_max_tokens: usize,
    /// The judges' instructions.
    pub judge_system: String,
    /// Next-step question (`{next_steps}`, `{continuation}`).
    pub next_step: String,
    /// A section shown to the adequacy judge (`{title}`, `{contract}`, `{text}`).
    pub section: String,
    /// The adequacy criteria (five by default).
    #[serde(rename = "criterion")]
    pub criteria: Vec<Criterion>,
    /// Bootstrap resamples.
    pub bootstrap_iterations: usize,
    /// Bootstrap seed.
    pub seed: u64,
}

impl EvalPrompts {
    /// Parses a settings text over the built-in values; `origin` names it in errors.
    pub fn overlay(text: &str, origin: &str) -> Result<Self> {
        let err = |reason: String| Error::Config {
            origin: origin.to_string(),
            reason,
        };
        let p: Self = speccompact_settings::overlay(DEFAULT_EVAL_CONFIG, text, origin)
            .map_err(|e| err(e.reason()))?
            .value;
        if p.criteria.is_empty() || p.reader_max_tokens == 0 {
            return Err(err(
                "needs at least one criterion and reader_max_tokens > 0".into(),
            ));
        }
        for (key, text, holes) in [
            ("reader_question", &p.reader_question, &["{question}"][..]),
            (
                "next_step",
                &p.next_step,
                &["{next_steps}", "{continuation}"][..],
            ),
            ("section", &p.section, &["{text}"][..]),
        ] {
            if let Some(h) = holes.iter().find(|h| !text.contains(*h)) {
                return Err(err(format!("`{key}` must contain {h}")));
            }
        }
        Ok(p)
    }
}

impl Default for EvalPrompts {
    fn default() -> Self {
        // The embedded file is checked by a unit test; failing here would be a build defect.
        Self::overlay("", "built-in").unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Streams the evaluation's batched calls run on (as many as the summary's slots).
pub const STREAMS: usize = 6;

/// Runs queued items on the streams of one session, one queue per stream: each round takes
/// the next item of every queue that has one, as one batch, so consecutive items of a queue
/// share that stream's cache. `take` gets every item with its response, in batch order.
pub(crate) fn run_queues<B: Backend, T>(
    b: &B,
    session: &mut B::Session,
    queues: &[Vec<T>],
    request: impl Fn(usize, &T) -> Request,
    mut take: impl FnMut(&T, Response) -> Result<()>,
) -> Result<()> {
    let mut pos = vec![0usize; queues.len()];
    loop {
        let batch: Vec<(usize, &T)> = queues
            .iter()
            .enumerate()
            .filter_map(|(s, q)| q.get(pos[s]).map(|t| (s, t)))
            .collect();
        if batch.is_empty() {
            return Ok(());
        }
        for &(s, _) in &batch {
            pos[s] += 1;
        }
        let reqs: Vec<Request> = batch.iter().map(|&(s, t)| request(s, t)).collect();
        for (&(_, t), r) in batch.iter().zip(b.run(session, &reqs)?) {
            take(t, r)?;
        }
    }
}

fn generated(b: &impl Backend, r: Response) -> Result<String> {
    Ok(r.into_generated(b.name())?.text.trim().to_string())
}

/// Answers each question from `context` alone: the context is prefilled once, questions run
/// six at a time.
pub fn answer<B: Backend>(
    b: &B,
    p: &EvalPrompts,
    context: &str,
    questions: &[&str],
) -> Result<Vec<String>> {
    if questions.is_empty() {
        return Ok(Vec::new());
    }
    let f = b.format();
    let prefix = format!(
        "{}{}{}<context>\n{}\n</context>\n",
        f.open,
        p.reader_system,
        f.system_to_user,
        context.trim_end()
    );
    let mut session = b.open(&prefix)?;
    let mut out = Vec::with_capacity(questions.len());
    for chunk in questions.chunks(STREAMS) {
        let reqs: Vec<Request> = chunk
            .iter()
            .enumerate()
            .map(|(i, q)| Request {
                stream: i,
                prompt: vec![format!(
                    "\n{}{}",
                    p.reader_question.replace("{question}", q),
                    f.user_to_assistant
                )],
                kind: RequestKind::Generate {
                    max_tokens: p.reader_max_tokens,
                    stop_at_newline: true,
                },
                lines: Default::default(),
            })
            .collect();
        for r in b.run(&mut session, &reqs)? {
            out.push(generated(b, r)?);
        }
    }
    Ok(out)
}

/// What one judgment asks: a shared first segment (kept in the stream's cache) and the
/// question after it.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    /// Shown before the question (a section, or Next Steps with the continuation).
    pub shown: String,
    /// The yes/no question.
    pub question: String,
}

/// Judges every ask against the session's record with one token each; returns r per ask.
/// The record is prefilled once; asks sharing `shown` should be adjacent so the stream's
/// cache keeps it.
pub fn judge<B: Backend>(
    b: &B,
    p: &EvalPrompts,
    cfg: &CompactionConfig,
    transcript: &str,
    asks: &[Ask],
) -> Result<Vec<f32>> {
    if asks.is_empty() {
        return Ok(Vec::new());
    }
    let f = b.format();
    let prefix = format!(
        "{}{}{}The record of the session:\n<record>\n{}\n</record>\n",
        f.open,
        p.judge_system,
        f.system_to_user,
        transcript.trim_end()
    );
    let mut session = b.open(&prefix)?;
    // Runs of asks with the same shown text stay on one stream.
    let mut queues: Vec<Vec<usize>> = vec![Vec::new(); STREAMS];
    let mut stream = 0;
    for i in 0..asks.len() {
        if i > 0 && asks[i].shown != asks[i - 1].shown {
            stream = (stream + 1) % STREAMS;
        }
        queues[stream].push(i);
    }
    let mut out = vec![0.0f32; asks.len()];
    run_queues(
        b,
        &mut session,
        &queues,
        |s, &i| Request {
            stream: s,
            prompt: vec![
                format!("\n{}\n", asks[i].shown.trim_end()),
                format!("{}{}", asks[i].question, f.user_to_assistant),
            ],
            kind: RequestKind::Judge { top_k: cfg.top_k },
            lines: Default::default(),
        },
        |&i, r| {
            let top = r.into_judged(b.name())?;
            out[i] = score(&top, &cfg.positive_labels, &cfg.negative_labels).r;
            Ok(())
        },
    )?;
    Ok(out)
}

/// The five adequacy asks of one section.
pub fn section_asks(p: &EvalPrompts, title: &str, contract: &str, text: &str) -> Vec<Ask> {
    let body = if text.trim().is_empty() {
        "(empty)"
    } else {
        text.trim_end()
    };
    let shown = p
        .section
        .replace("{title}", title)
        .replace("{contract}", contract)
        .replace("{text}", body);
    p.criteria
        .iter()
        .map(|c| Ask {
            shown: shown.clone(),
            question: c.question.clone(),
        })
        .collect()
}

/// The next-step ask: the summary's Next Steps against the real continuation.
pub fn next_step_ask(p: &EvalPrompts, next_steps: &str, continuation: &str) -> Ask {
    let body = if next_steps.trim().is_empty() {
        "(empty)"
    } else {
        next_steps.trim_end()
    };
    let full = p
        .next_step
        .replace("{next_steps}", body)
        .replace("{continuation}", continuation.trim_end());
    // The question is the last line; everything before it is shown.
    match full.trim_end().rsplit_once('\n') {
        Some((shown, q)) => Ask {
            shown: shown.to_string(),
            question: q.to_string(),
        },
        None => Ask {
            shown: String::new(),
            question: full,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_settings_parse_and_bad_overlays_are_named() {
        let p = EvalPrompts::default();
        assert_eq!(p.criteria.len(), 5);
        assert!(p.reader_question.contains("{question}"));
        let e = EvalPrompts::overlay("next_step = \"no holes\"", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("x.toml") && e.contains("{next_steps}"), "{e}");
        let e = EvalPrompts::overlay("readr_max_tokens = 3", "y.toml")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("y.toml") && e.contains("readr_max_tokens"),
            "{e}"
        );
        let p = EvalPrompts::overlay("seed = 5", "z").unwrap();
        assert_eq!((p.seed, p.criteria.len()), (5, 5));
    }

    #[test]
    fn asks_carry_the_section_and_the_continuation() {
        let p = EvalPrompts::default();
        let a = section_asks(&p, "Goal", "What the user wants.", "- Fix bug 42");
        assert_eq!(a.len(), 5);
        assert!(a
            .iter()
            .all(|x| x.shown.contains("- Fix bug 42") && x.shown == a[0].shown));
        let n = next_step_ask(&p, "1. Run the tests", "[assistant]\npytest -x");
        assert!(n.shown.contains("1. Run the tests") && n.shown.contains("pytest -x"));
        assert!(n.question.ends_with("Answer Yes or No."), "{}", n.question);
    }
}
