//! The runtime behind the [`Backend`] seam: one [`Model`] (shared between compactions), a
//! session holding the frozen prefix and one forked sequence per stream.

use crate::backend::{
    Backend, FinishReason, Generated, LineToken, Prefilled, Request, RequestKind, Response,
    Speculated, Verified,
};
use crate::chat_format::ChatFormat;
use crate::{Error, Result};
use candle_core::Device;
use speccompact_runtime::{
    greedy_rows_gated, LineMask, LineVerdict, Model, Prefix, Sequence, StopRules, TokenScore,
    Tokenizer,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// A loaded model as a compaction backend.
#[derive(Debug, Clone)]
pub struct ModelBackend {
    name: String,
    model: Arc<Model>,
    format: ChatFormat,
    prefill_chunk: usize,
    /// Masks that keep lines from opening with `#` other than a level-2 heading.
    heading_masks: Arc<OnceLock<Vec<LineMask>>>,
    /// The last long texts tokenized (with BOS): a prefix is counted to check the fit, then
    /// prefilled, and tokenized only once.
    encoded: Arc<Mutex<Vec<(String, Arc<Vec<u32>>)>>>,
}

/// Texts at least this long are remembered by [`ModelBackend::encode_long`].
const MEMO_MIN_BYTES: usize = 4096;
/// How many long texts are remembered.
const MEMO_ENTRIES: usize = 4;

/// A [`ModelBackend`] session: the prefix, streams' own prefixes, every stream's sequence.
#[derive(Debug)]
pub struct ModelSession {
    prefix: Arc<Prefix>,
    stream_prefixes: HashMap<usize, Arc<Prefix>>,
    streams: HashMap<usize, Sequence>,
    segments: HashMap<String, Vec<u32>>,
    /// Token paths of speculation requests, per stream.
    paths: HashMap<usize, SpecPath>,
}

/// A stream's speculation path: the head it continues and the model's last token, not yet
/// fed (`None` once the path has ended).
#[derive(Debug, Clone)]
struct SpecPath {
    head: Vec<u32>,
    pending: Option<u32>,
}

impl ModelSession {
    /// A stream's sequence, forked from its own prefix (or the session's) on first use.
    fn stream(&mut self, stream: usize) -> &mut Sequence {
        let prefix = self.stream_prefixes.get(&stream).unwrap_or(&self.prefix);
        self.streams.entry(stream).or_insert_with(|| prefix.fork())
    }

    /// Tokens of the shared prefix.
    pub fn prefix_len(&self) -> usize {
        self.prefix.len()
    }
}

impl ModelBackend {
    /// Wraps a loaded model; `prefill_chunk` bounds the tokens per prefill forward.
    pub fn new(name: &str, model: Arc<Model>, prefill_chunk: usize) -> Result<Self> {
        let format = ChatFormat::for_template(model.chat_template.as_ref())?;
        Ok(Self {
            name: name.to_string(),
            model,
            format,
            prefill_chunk: prefill_chunk.max(1),
            heading_masks: Arc::new(OnceLock::new()),
            encoded: Arc::new(Mutex::new(Vec::new())),
        })
    }

    /// `text`'s tokens with BOS (when the model adds one); long texts are remembered, so a
    /// prefix counted for the fit is not tokenized again by its prefill.
    fn encode_long(&self, text: &str) -> Result<Arc<Vec<u32>>> {
        if text.len() < MEMO_MIN_BYTES {
            return Ok(Arc::new(self.model.tokenizer.encode(text, true)?));
        }
        let memo = |f: &mut dyn FnMut(&mut Vec<(String, Arc<Vec<u32>>)>)| {
            // A poisoned memo only loses the memo, never a result.
            if let Ok(mut m) = self.encoded.lock() {
                f(&mut m);
            }
        };
        let mut hit = None;
        memo(&mut |m| {
            if let Some(k) = m.iter().position(|(t, _)| t == text) {
                let e = m.remove(k);
                hit = Some(e.1.clone());
                m.push(e);
            }
        });
        if let Some(t) = hit {
            return Ok(t);
        }
        let tokens = Arc::new(self.model.tokenizer.encode(text, true)?);
        memo(&mut |m| {
            if m.len() == MEMO_ENTRIES {
                m.remove(0);
            }
            m.push((text.to_string(), tokens.clone()));
        });
        Ok(tokens)
    }

    /// The tokens a request is run on: the prefix (with BOS when the model adds one), then
    /// each segment tokenized alone, as the generation path does.
    pub fn prompt_tokens(&self, prefix: &str, segments: &[String]) -> Result<Vec<u32>> {
        let mut out = self.encode_long(prefix)?.as_ref().clone();
        out.extend(self.tokens(&mut HashMap::new(), segments)?);
        Ok(out)
    }

    /// Tokens the model puts before a text (a BOS, or none).
    fn bos_tokens(&self) -> Result<usize> {
        let t = &self.model.tokenizer;
        Ok(t.encode("", true)?.len() - t.encode("", false)?.len())
    }

    /// At a line start every `#`-token but `##` / `## ` is banned; after `##`, every one.
    fn heading_masks(&self) -> &[LineMask] {
        self.heading_masks.get_or_init(|| {
            let tok = &self.model.tokenizer;
            let all = tok.hash_tokens().to_vec();
            let start: Vec<u32> = all
                .iter()
                .copied()
                .filter(|&t| tok.decode(&[t]).map_or(true, |s| s != "##" && s != "## "))
                .collect();
            vec![
                LineMask {
                    line: String::new(),
                    banned: start,
                },
                LineMask {
                    line: "##".into(),
                    banned: all,
                },
            ]
        })
    }

    /// The same backend over the same weights whose decodes use a fresh lookup in `mode`.
    pub fn with_lookup(&self, mode: speccompact_runtime::LookupMode) -> Self {
        Self {
            model: Arc::new(self.model.with_lookup(mode)),
            ..self.clone()
        }
    }

    /// The wrapped model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn err(&self, reason: String) -> Error {
        Error::Backend {
            backend: self.name.clone(),
            reason,
        }
    }

    /// Serves a batch of [`RequestKind::Speculate`] requests: one forward over every
    /// stream's pending token and draft, greedy agreement checked per token.
    fn speculate(&self, session: &mut ModelSession, requests: &[Request]) -> Result<Vec<Response>> {
        struct Plan {
            fed: Vec<u32>,
            draft: Vec<u32>,
            head: Vec<u32>,
            /// Path tokens after the head before this step (the pending token included).
            before: usize,
            max: usize,
        }
        let tok = &self.model.tokenizer;
        let ctx = self.context_length();
        let mut plans = Vec::with_capacity(requests.len());
        for r in requests {
            let (RequestKind::Speculate { max_tokens }, [head, draft]) =
                (r.kind, r.prompt.as_slice())
            else {
                return Err(self.err(format!(
                    "stream {}: a speculation's prompt is [head, draft]",
                    r.stream
                )));
            };
            let head = self.tokens(&mut session.segments, std::slice::from_ref(head))?;
            if head.is_empty() {
                return Err(self.err(format!("stream {}: empty head", r.stream)));
            }
            let mut draft = tok.encode(draft, false)?;
            let path = session.paths.get(&r.stream).cloned();
            let seq = session.stream(r.stream);
            let (fed, before) = match &path {
                Some(SpecPath {
                    head: h,
                    pending: Some(c),
                }) if *h == head && seq.suffix_tokens().starts_with(&head) => {
                    let before = seq.suffix_len() - head.len() + 1;
                    let mut fed = vec![*c];
                    fed.extend_from_slice(&draft);
                    (fed, before)
                }
                Some(SpecPath {
                    head: h,
                    pending: None,
                }) if *h == head => {
                    return Err(self.err(format!("stream {}: its path has ended", r.stream)));
                }
                _ => {
                    let have = seq.suffix_tokens();
                    let common = have
                        .iter()
                        .zip(&head)
                        .take_while(|(a, b)| a == b)
                        .count()
                        .min(head.len() - 1);
                    seq.truncate(seq.prefix_len() + common)?;
                    draft.clear();
                    (head[common..].to_vec(), 0)
                }
            };
            if seq.len() + fed.len() > ctx {
                return Err(self.err(format!(
                    "stream {}: {} positions exceed the context of {ctx}",
                    r.stream,
                    seq.len() + fed.len()
                )));
            }
            plans.push(Plan {
                fed,
                draft,
                head,
                before,
                max: max_tokens,
            });
        }
        // One step forward for every stream: its logits are bitwise those of decoding the
        // same path token by token (step forwards are batch-invariant).
        let at: Vec<Vec<usize>> = plans
            .iter()
            .map(|p| (p.fed.len() - p.draft.len() - 1..p.fed.len()).collect())
            .collect();
        let mut pool: HashMap<usize, &mut Sequence> =
            session.streams.iter_mut().map(|(k, v)| (*k, v)).collect();
        let mut rows = Vec::with_capacity(plans.len());
        for (r, p) in requests.iter().zip(&plans) {
            rows.push(speccompact_runtime::Row {
                seq: pool
                    .remove(&r.stream)
                    .ok_or_else(|| self.err(format!("stream {} lost", r.stream)))?,
                tokens: &p.fed,
            });
        }
        let logits = self
            .model
            .decoder
            .forward(&mut rows, speccompact_runtime::LogitsAt::At(at))?;
        let mut out = Vec::with_capacity(requests.len());
        for ((r, p), l) in requests.iter().zip(plans).zip(logits) {
            let greedy: Vec<u32> = l
                .argmax(candle_core::D::Minus1)
                .and_then(|t| t.to_vec1())
                .map_err(speccompact_runtime::Error::from)?;
            let agree = p
                .draft
                .iter()
                .zip(&greedy)
                .take_while(|(d, g)| d == g)
                .count();
            let room = p.max.saturating_sub(p.before);
            let keep = agree.min(room);
            let (pending, done) = if keep < agree || p.before + keep >= p.max {
                (None, Some(FinishReason::MaxTokens))
            } else {
                let c = greedy[agree];
                if tok.eos_tokens().contains(&c) {
                    (None, Some(FinishReason::Ended))
                } else if p.before + keep + 1 >= p.max {
                    (Some(c), Some(FinishReason::MaxTokens))
                } else {
                    (Some(c), None)
                }
            };
            let seq = session
                .streams
                .get_mut(&r.stream)
                .ok_or_else(|| self.err(format!("stream {} lost", r.stream)))?;
            seq.truncate(seq.len() - (p.draft.len() - keep))?;
            let mut path: Vec<u32> = seq.suffix_tokens()[p.head.len()..].to_vec();
            path.extend(pending);
            let text = tok.decode(&path)?;
            session.paths.insert(
                r.stream,
                SpecPath {
                    head: p.head,
                    pending: pending.filter(|_| done.is_none()),
                },
            );
            out.push(Response::Speculated(Speculated {
                text,
                tokens: path.len(),
                accepted: keep,
                drafted: p.draft.len(),
                done,
            }));
        }
        Ok(out)
    }

    fn tokens(&self, cache: &mut HashMap<String, Vec<u32>>, prompt: &[String]) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        for seg in prompt {
            if let Some(t) = cache.get(seg) {
                out.extend_from_slice(t);
                continue;
            }
            let t = self.model.tokenizer.encode(seg, false)?;
            out.extend_from_slice(&t);
            cache.insert(seg.clone(), t);
        }
        Ok(out)
    }
}

/// Scored tokens with their texts: each token's text is what it adds to the decoded text
/// before it, so the texts concatenate to the line even across multi-byte characters.
fn line_tokens(tok: &Tokenizer, scores: &[TokenScore]) -> Result<Vec<LineToken>> {
    let ids: Vec<u32> = scores.iter().map(|s| s.token).collect();
    let mut out = Vec::with_capacity(scores.len());
    let mut before = String::new();
    for (j, s) in scores.iter().enumerate() {
        let upto = tok.decode(&ids[..=j])?;
        // A token that ends inside a character adds nothing yet: its bytes count with the
        // token that completes the character.
        let pending = upto.ends_with('\u{FFFD}') && j + 1 < ids.len();
        let text = match upto.strip_prefix(before.as_str()) {
            Some(t) if !pending => t.to_string(),
            _ => String::new(),
        };
        if !pending && upto.starts_with(before.as_str()) {
            before = upto;
        }
        out.push(LineToken {
            text,
            logprob: s.logprob,
            rank: s.rank,
        });
    }
    Ok(out)
}

impl Backend for ModelBackend {
    type Session = ModelSession;
    type Prefix = Arc<Prefix>;

    fn name(&self) -> &str {
        &self.name
    }

    fn format(&self) -> &ChatFormat {
        &self.format
    }

    fn context_length(&self) -> usize {
        self.model.decoder.config().context_length
    }

    fn numerics(&self) -> String {
        self.model.decoder.numerics()
    }

    fn lookup(&self) -> Option<speccompact_runtime::LookupCounters> {
        Some(self.model.decoder.lookup().counters())
    }

    fn count_tokens(&self, text: &str) -> Result<usize> {
        if text.len() < MEMO_MIN_BYTES {
            return Ok(self.model.tokenizer.encode(text, false)?.len());
        }
        Ok(self.encode_long(text)?.len() - self.bos_tokens()?)
    }

    fn is_gpu(&self) -> bool {
        !matches!(self.model.decoder.device(), Device::Cpu)
    }

    fn prefill(&self, text: &str, base: Option<&Arc<Prefix>>) -> Result<Prefilled<Arc<Prefix>>> {
        let tokens = self.encode_long(text)?;
        if tokens.is_empty() {
            return Err(self.err("empty prefix".into()));
        }
        let keep = base.map_or(0, |b| {
            b.tokens()
                .iter()
                .zip(tokens.iter())
                .take_while(|(a, b)| a == b)
                .count()
        });
        let prefix = match base {
            Some(b) if keep == tokens.len() => b.truncated(keep)?,
            Some(b) if keep > 0 => {
                let mut seq = b.truncated(keep)?.fork();
                self.model
                    .decoder
                    .extend(&mut seq, &tokens[keep..], self.prefill_chunk)?;
                seq.freeze()?
            }
            _ => self
                .model
                .decoder
                .prefill(&tokens, self.prefill_chunk)?
                .freeze()?,
        };
        Ok(Prefilled {
            prefix,
            tokens: tokens.len(),
            reused: keep,
        })
    }

    fn session(&self, prefix: &Arc<Prefix>) -> ModelSession {
        ModelSession {
            prefix: Arc::clone(prefix),
            stream_prefixes: HashMap::new(),
            streams: HashMap::new(),
            segments: HashMap::new(),
            paths: HashMap::new(),
        }
    }

    fn set_stream_prefix(&self, session: &mut ModelSession, stream: usize, prefix: &Arc<Prefix>) {
        session.streams.remove(&stream);
        session.stream_prefixes.insert(stream, Arc::clone(prefix));
    }

    fn prefix_bytes(&self, prefix: &Arc<Prefix>) -> usize {
        prefix.kv_bytes()
    }

    fn run(&self, session: &mut ModelSession, requests: &[Request]) -> Result<Vec<Response>> {
        let mut seen = std::collections::HashSet::new();
        if let Some(r) = requests.iter().find(|r| !seen.insert(r.stream)) {
            return Err(self.err(format!("stream {} appears twice in one batch", r.stream)));
        }
        let speculative = |r: &Request| matches!(r.kind, RequestKind::Speculate { .. });
        if requests.iter().any(speculative) {
            if !requests.iter().all(speculative) {
                return Err(self.err("speculation requests run in batches of their own".into()));
            }
            return self.speculate(session, requests);
        }
        for r in requests {
            session.paths.remove(&r.stream);
        }
        let tok = &self.model.tokenizer;
        let mut news: Vec<Vec<u32>> = Vec::with_capacity(requests.len());
        let mut rules = Vec::with_capacity(requests.len());
        for r in requests {
            let want = self.tokens(&mut session.segments, &r.prompt)?;
            // A verified line's tokens in `want`; the position before them must be fed.
            let span = match r.kind {
                RequestKind::Verify { line, .. } => {
                    if line == 0 || line >= r.prompt.len() {
                        return Err(self.err(format!(
                            "stream {}: verified segment {line} of a {}-segment prompt (it must follow another)",
                            r.stream,
                            r.prompt.len()
                        )));
                    }
                    let start = self.tokens(&mut session.segments, &r.prompt[..line])?.len();
                    let len = self
                        .tokens(&mut session.segments, &r.prompt[line..=line])?
                        .len();
                    if start == 0 {
                        return Err(self.err(format!(
                            "stream {}: nothing before the verified line",
                            r.stream
                        )));
                    }
                    Some(start..start + len)
                }
                _ => None,
            };
            if want.is_empty() {
                return Err(self.err(format!("stream {}: empty prompt", r.stream)));
            }
            let seq = session.stream(r.stream);
            let have = seq.suffix_tokens();
            let mut common = have.iter().zip(&want).take_while(|(a, b)| a == b).count();
            // At least one token is fed, so the forward yields the next distribution (and the
            // position before a verified line, so its first token is rated).
            common = common.min(want.len() - 1);
            if let Some(span) = &span {
                common = common.min(span.start - 1);
            }
            seq.truncate(seq.prefix_len() + common)?;
            news.push(want[common..].to_vec());
            rules.push(match r.kind {
                RequestKind::Judge { top_k } => StopRules::score().with_top_k(top_k),
                RequestKind::Verify { top_k, .. } => {
                    let span = span.unwrap_or(0..0);
                    StopRules::score_tokens(span.start - common..span.end - common)
                        .with_top_k(top_k)
                }
                RequestKind::Speculate { .. } => StopRules::score(),
                RequestKind::Generate {
                    max_tokens,
                    stop_at_newline,
                } => {
                    let mut s = StopRules::new(tok, max_tokens);
                    s.stop_at_newline = stop_at_newline;
                    s.line_grace = r.lines.grace;
                    if r.lines.no_headings {
                        s.line_masks = self.heading_masks().to_vec();
                    }
                    s
                }
            });
        }
        let mut pool: HashMap<usize, &mut Sequence> =
            session.streams.iter_mut().map(|(k, v)| (*k, v)).collect();
        let mut seqs: Vec<&mut Sequence> = Vec::with_capacity(requests.len());
        for r in requests {
            seqs.push(
                pool.remove(&r.stream)
                    .ok_or_else(|| self.err(format!("stream {} lost", r.stream)))?,
            );
        }
        let prompts: Vec<&[u32]> = news.iter().map(|v| v.as_slice()).collect();
        let mut prior: Vec<Vec<String>> = vec![Vec::new(); requests.len()];
        let outs = greedy_rows_gated(
            &self.model.decoder,
            tok,
            &mut seqs,
            &prompts,
            &rules,
            |_, _| Ok(()),
            |i, line| {
                let verdict = match &requests[i].lines.gate {
                    Some(gate) if !gate(&prior[i], line) => LineVerdict::Stop,
                    _ => LineVerdict::Continue,
                };
                prior[i].push(line.to_string());
                verdict
            },
        )?;
        let mut responses = Vec::with_capacity(requests.len());
        for (r, out) in requests.iter().zip(outs) {
            let top = |out: &speccompact_runtime::Continuation| -> Result<Vec<(String, f32)>> {
                out.top
                    .iter()
                    .map(|&(id, p)| Ok((tok.decode(&[id])?, p)))
                    .collect()
            };
            responses.push(match r.kind {
                RequestKind::Judge { .. } => Response::Judged(top(&out)?),
                RequestKind::Verify { .. } => Response::Verified(Verified {
                    top: top(&out)?,
                    line: line_tokens(tok, &out.scores)?,
                }),
                RequestKind::Generate { .. } | RequestKind::Speculate { .. } => {
                    Response::Generated(Generated {
                        tokens: out.tokens.len() + usize::from(out.stop_token.is_some()),
                        text: out.text,
                        reason: out.reason.into(),
                    })
                }
            });
        }
        Ok(responses)
    }
}
