//! Greedy continuation of many rows at once, with stop rules (stop tokens, token budget with
//! an optional grace to finish the current line, first token whose text contains a newline,
//! a caller's verdict on each completed line) and tokens masked at chosen line states.

use crate::cache::Sequence;
use crate::decoder::{argmax, Decoder, LogitsAt, Row};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};
use candle_core::Tensor;

/// When a continuation ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopRules {
    /// Most tokens to generate per row.
    pub max_new_tokens: usize,
    /// Tokens that end a row (not included in the output).
    pub stop_tokens: Vec<u32>,
    /// End a row at the first token whose text contains `\n`; the text before the newline
    /// in that token is kept.
    pub stop_at_newline: bool,
    /// Extra tokens a row may take past `max_new_tokens` to finish the line it is in (the
    /// row then ends at that line's newline); 0 ends it at the budget.
    pub line_grace: usize,
    /// Tokens never generated while the current line's text (after the last newline; the
    /// prompt is taken to end at a line start) equals a mask's `line`.
    pub line_masks: Vec<LineMask>,
    /// Prompt tokens (indices into the row's prompt, starting at 1 or later) to score under
    /// the model: each one's log-probability and rank given the tokens before it, from the
    /// same forward that reads the prompt ([`Continuation::scores`]).
    pub score_span: Option<std::ops::Range<usize>>,
    /// Next-token candidates to return for the position after the prompt, most likely first,
    /// with softmax probabilities ([`Continuation::top`]); 0: none.
    pub top_k: usize,
}

/// How the model rates one given token at its position.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct TokenScore {
    /// The token.
    pub token: u32,
    /// Its log-probability under the model, given the tokens before it.
    pub logprob: f32,
    /// Tokens the model rates strictly higher (0: the token is the model's greedy choice).
    pub rank: u32,
    /// The model's greedy token at this position.
    pub greedy: u32,
}

/// Tokens banned while the current line reads exactly `line` (e.g. `#`-tokens at a line
/// start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineMask {
    /// The current line's text at which the mask applies ("" = a line start).
    pub line: String,
    /// Banned token ids.
    pub banned: Vec<u32>,
}

/// What the caller says of a line a row has just completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineVerdict {
    /// Keep generating.
    Continue,
    /// End the row after this line (its text ends with the line and its newline).
    Stop,
}

impl StopRules {
    /// Stop at the tokenizer's end tokens or after `max_new_tokens`.
    pub fn new(tok: &Tokenizer, max_new_tokens: usize) -> Self {
        Self {
            max_new_tokens,
            stop_tokens: tok.eos_tokens().to_vec(),
            stop_at_newline: false,
            line_grace: 0,
            line_masks: Vec::new(),
            score_span: None,
            top_k: 0,
        }
    }

    /// One forward and no generated token: a scoring request.
    pub fn score() -> Self {
        Self {
            max_new_tokens: 1,
            stop_tokens: Vec::new(),
            stop_at_newline: false,
            line_grace: 0,
            line_masks: Vec::new(),
            score_span: None,
            top_k: 0,
        }
    }

    /// A scoring request that also rates the prompt tokens in `span` (see
    /// [`StopRules::score_span`]).
    pub fn score_tokens(span: std::ops::Range<usize>) -> Self {
        Self {
            score_span: Some(span),
            ..Self::score()
        }
    }

    /// The same rules, also returning the `k` most likely next tokens after the prompt.
    pub fn with_top_k(mut self, k: usize) -> Self {
        self.top_k = k;
        self
    }

    /// The same rules, also stopping at the first newline.
    pub fn line(mut self) -> Self {
        self.stop_at_newline = true;
        self
    }
}

/// Why a row stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A stop token was produced.
    StopToken,
    /// `max_new_tokens` were produced.
    MaxTokens,
    /// A token containing a newline was produced.
    Newline,
    /// The model's context is full.
    Context,
    /// The caller's line verdict ended the row after a completed line.
    LineRejected,
}

/// The result of one row.
#[derive(Debug, Clone, PartialEq)]
pub struct Continuation {
    /// Generated tokens kept (the stop token, if any, is not included).
    pub tokens: Vec<u32>,
    /// Decoded text; for [`StopReason::Newline`] it includes the part of the stopping token
    /// before its newline.
    pub text: String,
    /// The token that ended the row, if a token did.
    pub stop_token: Option<u32>,
    /// Why the row ended.
    pub reason: StopReason,
    /// How many of `tokens` are in the sequence's cache (all but a last one that was never
    /// fed back); the sequence holds prompt + `tokens[..cached]`.
    pub cached: usize,
    /// Scores of the prompt tokens in [`StopRules::score_span`] (empty without one).
    pub scores: Vec<TokenScore>,
    /// The [`StopRules::top_k`] most likely tokens after the prompt with their probabilities
    /// (empty when not asked for).
    pub top: Vec<(u32, f32)>,
}

/// Greedy continuation of `seqs[i]` after appending `prompts[i]` (non-empty) to it. All rows
/// advance together in one batched forward per step; finished rows leave the batch.
pub fn greedy(
    decoder: &Decoder,
    tok: &Tokenizer,
    seqs: &mut [&mut Sequence],
    prompts: &[&[u32]],
    rules: &StopRules,
) -> Result<Vec<Continuation>> {
    let rules = vec![rules.clone(); seqs.len()];
    greedy_rows(decoder, tok, seqs, prompts, &rules, |_, _| Ok(()))
}

/// [`greedy`] with stop rules per row, calling `first(i, logits)` with row `i`'s next-token
/// logits after its prompt (before any token is generated). A row with
/// `max_new_tokens == 1` is a one-forward scoring request batched with the others.
pub fn greedy_rows(
    decoder: &Decoder,
    tok: &Tokenizer,
    seqs: &mut [&mut Sequence],
    prompts: &[&[u32]],
    rules: &[StopRules],
    first: impl FnMut(usize, &Tensor) -> Result<()>,
) -> Result<Vec<Continuation>> {
    greedy_rows_gated(decoder, tok, seqs, prompts, rules, first, |_, _| {
        LineVerdict::Continue
    })
}

/// [`greedy_rows`] that also asks `on_line(i, line)` about every line row `i` completes (the
/// line without its newline); [`LineVerdict::Stop`] ends the row there with
/// [`StopReason::LineRejected`].
pub fn greedy_rows_gated(
    decoder: &Decoder,
    tok: &Tokenizer,
    seqs: &mut [&mut Sequence],
    prompts: &[&[u32]],
    rules: &[StopRules],
    mut first: impl FnMut(usize, &Tensor) -> Result<()>,
    mut on_line: impl FnMut(usize, &str) -> LineVerdict,
) -> Result<Vec<Continuation>> {
    if seqs.len() != prompts.len() || seqs.len() != rules.len() {
        return Err(Error::InvalidRequest(format!(
            "{} sequences, {} prompts and {} rule sets",
            seqs.len(),
            prompts.len(),
            rules.len()
        )));
    }
    for (i, (r, p)) in rules.iter().zip(prompts).enumerate() {
        if let Some(span) = &r.score_span {
            if span.start == 0 || span.start > span.end || span.end > p.len() {
                return Err(Error::InvalidRequest(format!(
                    "row {i}: scored tokens {span:?} must lie in 1..={} of the prompt",
                    p.len()
                )));
            }
        }
    }
    let n = seqs.len();
    let ctx = decoder.config().context_length;
    let mut scores: Vec<Vec<TokenScore>> = vec![Vec::new(); n];
    let mut top: Vec<Vec<(u32, f32)>> = vec![Vec::new(); n];
    let mut gen: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut done: Vec<Option<Ending>> = vec![None; n];
    let mut next: Vec<Vec<u32>> = prompts.iter().map(|p| p.to_vec()).collect();
    // Lines of each row already shown to `on_line`.
    let mut judged_lines: Vec<usize> = vec![0; n];
    for (d, r) in done.iter_mut().zip(rules) {
        if r.max_new_tokens == 0 {
            *d = Some((StopReason::MaxTokens, None, String::new()));
        }
    }
    let lookup = decoder.lookup();
    loop {
        let active: Vec<usize> = (0..n).filter(|&i| done[i].is_none()).collect();
        if active.is_empty() {
            break;
        }
        for &i in &active {
            if seqs[i].len() + next[i].len() > ctx {
                if gen[i].is_empty() {
                    return Err(Error::InvalidRequest(format!(
                        "row {i}: prompt of {} tokens after {} cached positions exceeds the context of {ctx}",
                        next[i].len(),
                        seqs[i].len()
                    )));
                }
                done[i] = Some((StopReason::Context, None, tok.decode(&gen[i])?));
            }
        }
        let active: Vec<usize> = active.into_iter().filter(|&i| done[i].is_none()).collect();
        if active.is_empty() {
            break;
        }
        // Tokens proposed after each decoding row's next token (lookup); none on the first
        // step, whose prompts are read whole.
        let drafts: Vec<(Vec<u32>, usize)> =
            if lookup.active() && active.iter().all(|&i| !gen[i].is_empty()) {
                let contexts: Vec<Vec<u32>> = active
                    .iter()
                    .map(|&i| {
                        let mut c = seqs[i].tokens();
                        c.extend_from_slice(&next[i]);
                        c
                    })
                    .collect();
                let room: Vec<usize> = active
                    .iter()
                    .map(|&i| {
                        let budget = rules[i].max_new_tokens + rules[i].line_grace;
                        let left = budget.saturating_sub(gen[i].len() + 1);
                        left.min(ctx.saturating_sub(seqs[i].len() + next[i].len()))
                    })
                    .collect();
                lookup.propose(&contexts, &room)
            } else {
                vec![(Vec::new(), 0); active.len()]
            };
        let fed: Vec<Vec<u32>> = active
            .iter()
            .zip(&drafts)
            .map(|(&i, (d, _))| [next[i].as_slice(), d].concat())
            .collect();
        let before: Vec<usize> = active.iter().map(|&i| seqs[i].len()).collect();
        let logits = {
            let mut rows: Vec<Row<'_>> = Vec::with_capacity(active.len());
            let mut pool: Vec<Option<&mut Sequence>> =
                seqs.iter_mut().map(|s| Some(&mut **s)).collect();
            for (&i, tokens) in active.iter().zip(&fed) {
                let seq = pool[i]
                    .take()
                    .ok_or_else(|| Error::InvalidRequest("row used twice".into()))?;
                rows.push(Row { seq, tokens });
            }
            // The first step of a scoring row also returns the positions before its scored
            // tokens; a drafted row returns every position.
            let spans: Vec<Option<std::ops::Range<usize>>> = active
                .iter()
                .map(|&i| rules[i].score_span.clone().filter(|_| gen[i].is_empty()))
                .collect();
            let drafted = drafts.iter().any(|d| !d.0.is_empty());
            let at = if spans.iter().any(Option::is_some) || drafted {
                LogitsAt::At(
                    fed.iter()
                        .zip(&spans)
                        .zip(&drafts)
                        .map(|((f, span), (d, _))| {
                            let last = f.len() - 1;
                            let mut ix: Vec<usize> = span
                                .clone()
                                .map_or(Vec::new(), |s| (s.start - 1..s.end - 1).collect());
                            ix.extend(last - d.len()..=last);
                            ix
                        })
                        .collect(),
                )
            } else {
                LogitsAt::Last
            };
            let computed = padded_tokens(&rows);
            let started = std::time::Instant::now();
            let mut out = decoder.forward(&mut rows, at)?;
            lookup.record_forward(computed, started.elapsed().as_secs_f64());
            if drafted {
                lookup.record_draft_forward();
            }
            for ((&i, span), l) in active.iter().zip(&spans).zip(out.iter_mut()) {
                if let Some(span) = span {
                    let k = span.end - span.start;
                    scores[i] = score_tokens(&l.narrow(0, 0, k)?, &next[i][span.clone()])?;
                    let last = l.narrow(0, k, 1)?;
                    *l = last;
                }
            }
            out
        };
        for (slot, (&i, l)) in active.iter().zip(&logits).enumerate() {
            let (draft, matched) = &drafts[slot];
            // Logits positions read: the next token's, then one per drafted token kept.
            let (mut used, mut reached, mut kept) = (0, 0, 0);
            loop {
                let l = if draft.is_empty() {
                    l.clone()
                } else {
                    l.narrow(0, used, 1)?
                };
                used += 1;
                if gen[i].is_empty() {
                    first(i, &l)?;
                    if rules[i].top_k > 0 {
                        top[i] = top_k(&l, rules[i].top_k)?;
                    }
                }
                let t = choose(tok, &rules[i], &gen[i], &l)?;
                let mut judge = |line: &str| on_line(i, line);
                let row = RowText {
                    gen: &mut gen[i],
                    judged_lines: &mut judged_lines[i],
                };
                if let Some(end) = row.take(tok, &rules[i], t, &mut judge)? {
                    done[i] = Some(end);
                    break;
                }
                if used <= draft.len() {
                    reached += 1;
                    if draft[used - 1] == t {
                        // Already fed: its logits are the next position's.
                        kept += 1;
                        continue;
                    }
                }
                next[i] = vec![t];
                break;
            }
            if !draft.is_empty() {
                // The cache keeps the next token and the kept drafted ones.
                seqs[i].truncate(before[slot] + used)?;
                lookup.record_draft(*matched, draft.len(), reached, kept);
            }
        }
    }
    let mut out = Vec::with_capacity(n);
    for (i, d) in done.into_iter().enumerate() {
        let (reason, stop_token, text) =
            d.ok_or_else(|| Error::InvalidRequest("row did not finish".into()))?;
        let tokens = std::mem::take(&mut gen[i]);
        let cached = match reason {
            StopReason::MaxTokens | StopReason::Context | StopReason::LineRejected => {
                tokens.len().saturating_sub(1)
            }
            _ => tokens.len(),
        };
        out.push(Continuation {
            tokens,
            text,
            stop_token,
            reason,
            cached,
            scores: std::mem::take(&mut scores[i]),
            top: std::mem::take(&mut top[i]),
        });
    }
    Ok(out)
}

/// How a row ended: the reason, the token that ended it, its text.
type Ending = (StopReason, Option<u32>, String);

/// The row's greedy token under `logits`, outside the tokens masked at its current line.
fn choose(tok: &Tokenizer, rules: &StopRules, gen: &[u32], logits: &Tensor) -> Result<u32> {
    if rules.line_masks.is_empty() {
        return argmax(logits);
    }
    let text = tok.decode(gen)?;
    let line = text.rsplit('\n').next().unwrap_or("");
    match rules.line_masks.iter().find(|m| m.line == line) {
        Some(m) => masked_argmax(logits, &m.banned),
        None => argmax(logits),
    }
}

/// A row's generated tokens and how many of its lines the caller has judged.
struct RowText<'a> {
    gen: &'a mut Vec<u32>,
    judged_lines: &'a mut usize,
}

impl RowText<'_> {
    /// Applies the stop rules to the row's next token `t`: `Some` when the row ends (the
    /// token is then kept or not as the rule says), `None` when `t` was appended and the
    /// row goes on.
    fn take(
        self,
        tok: &Tokenizer,
        rules: &StopRules,
        t: u32,
        on_line: &mut dyn FnMut(&str) -> LineVerdict,
    ) -> Result<Option<Ending>> {
        let gen = self.gen;
        if rules.stop_tokens.contains(&t) {
            return Ok(Some((StopReason::StopToken, Some(t), tok.decode(gen)?)));
        }
        let newline = tok.has_newline(t);
        if rules.stop_at_newline && newline {
            let mut with = gen.clone();
            with.push(t);
            let full = tok.decode(&with)?;
            let cut = full.split('\n').next().unwrap_or("").to_string();
            return Ok(Some((StopReason::Newline, Some(t), cut)));
        }
        gen.push(t);
        if newline {
            let full = tok.decode(gen)?;
            let lines: Vec<&str> = full.split('\n').collect();
            let complete = lines.len() - 1;
            let stopped =
                (*self.judged_lines..complete).find(|&k| on_line(lines[k]) == LineVerdict::Stop);
            *self.judged_lines = complete;
            if let Some(k) = stopped {
                let mut text = lines[..=k].join("\n");
                text.push('\n');
                return Ok(Some((StopReason::LineRejected, None, text)));
            }
            // Past the budget, a line finished in the grace ends the row.
            if gen.len() >= rules.max_new_tokens {
                return Ok(Some((StopReason::MaxTokens, None, full)));
            }
        }
        if gen.len() >= rules.max_new_tokens {
            let over = gen.len() - rules.max_new_tokens;
            let mid_line = rules.line_grace > over && !tok.decode(gen)?.ends_with('\n');
            if !mid_line {
                return Ok(Some((StopReason::MaxTokens, None, tok.decode(gen)?)));
            }
        }
        Ok(None)
    }
}

/// Positions a batched forward computes: rows sharing a prefix are padded to the longest.
fn padded_tokens(rows: &[Row<'_>]) -> usize {
    let mut groups: Vec<(Option<u64>, usize, usize)> = Vec::new();
    for r in rows {
        let key = r.seq.prefix().map(|p| p.id());
        match groups.iter_mut().find(|g| g.0 == key) {
            Some(g) => {
                g.1 += 1;
                g.2 = g.2.max(r.tokens.len());
            }
            None => groups.push((key, 1, r.tokens.len())),
        }
    }
    groups.iter().map(|g| g.1 * g.2).sum()
}

/// The `k` most likely tokens of a logits vector, most likely first (ties: lower id first),
/// with softmax probabilities over the whole vocabulary.
pub fn top_k(logits: &Tensor, k: usize) -> Result<Vec<(u32, f32)>> {
    let v: Vec<f32> = logits
        .to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1()?;
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let z: f32 = v.iter().map(|x| (x - max).exp()).sum();
    let mut idx: Vec<u32> = (0..v.len() as u32).collect();
    let k = k.min(idx.len());
    if k == 0 {
        return Ok(Vec::new());
    }
    idx.select_nth_unstable_by(k - 1, |&a, &b| v[b as usize].total_cmp(&v[a as usize]));
    idx.truncate(k);
    idx.sort_by(|&a, &b| v[b as usize].total_cmp(&v[a as usize]).then(a.cmp(&b)));
    Ok(idx
        .into_iter()
        .map(|i| (i, (v[i as usize] - max).exp() / z))
        .collect())
}

/// Rates `tokens[j]` under logits row `j` (shape (k, vocab), k = `tokens.len()`): log-softmax
/// gathered at the token, the count of higher logits, the argmax. Computed where the logits
/// are; only 3k numbers leave the device.
fn score_tokens(logits: &Tensor, tokens: &[u32]) -> Result<Vec<TokenScore>> {
    use candle_core::{DType, D};
    if tokens.is_empty() {
        return Ok(Vec::new());
    }
    let logits = logits.to_dtype(DType::F32)?;
    let ids = Tensor::from_slice(tokens, (tokens.len(), 1), logits.device())?;
    let own = logits.gather(&ids, 1)?;
    let logprob: Vec<f32> = candle_nn::ops::log_softmax(&logits, D::Minus1)?
        .gather(&ids, 1)?
        .flatten_all()?
        .to_vec1()?;
    let rank: Vec<f32> = logits
        .broadcast_gt(&own)?
        .to_dtype(DType::F32)?
        .sum(1)?
        .to_vec1()?;
    let greedy: Vec<u32> = logits.argmax(D::Minus1)?.to_vec1()?;
    Ok(tokens
        .iter()
        .enumerate()
        .map(|(j, &token)| TokenScore {
            token,
            logprob: logprob[j],
            rank: rank[j] as u32,
            greedy: greedy[j],
        })
        .collect())
}

/// The most likely token of `logits` outside `banned` (sorted ascending).
fn masked_argmax(logits: &Tensor, banned: &[u32]) -> Result<u32> {
    let v: Vec<f32> = logits
        .to_dtype(candle_core::DType::F32)?
        .flatten_all()?
        .to_vec1()?;
    let mut best: Option<(u32, f32)> = None;
    for (i, &x) in v.iter().enumerate() {
        let id = i as u32;
        if banned.binary_search(&id).is_ok() {
            continue;
        }
        if best.is_none_or(|(_, b)| x > b) {
            best = Some((id, x));
        }
    }
    best.map(|(i, _)| i)
        .ok_or_else(|| Error::InvalidRequest("every token is masked".into()))
}
