//! The runtime behind the [`Backend`] seam: one [`Model`] (shared between compactions), a
//! session holding the frozen prefix and one forked sequence per stream.

use crate::backend::{Backend, Generated, Request, RequestKind, Response};
use crate::prompt::ChatFormat;
use crate::{Error, Result};
use candle_core::{DType, Device};
use speccompact_runtime::{greedy_rows, Model, Prefix, Sequence, StopRules};
use std::collections::HashMap;
use std::sync::Arc;

/// A loaded model as a compaction backend.
#[derive(Debug, Clone)]
pub struct ModelBackend {
    name: String,
    model: Arc<Model>,
    format: ChatFormat,
    prefill_chunk: usize,
}

/// A [`ModelBackend`] session: the prefix and every stream's sequence.
#[derive(Debug)]
pub struct ModelSession {
    prefix: Arc<Prefix>,
    streams: HashMap<usize, Sequence>,
    segments: HashMap<String, Vec<u32>>,
}

impl ModelSession {
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
        })
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

/// The `k` most likely tokens of a logits vector, with softmax probabilities.
fn top_k(logits: &candle_core::Tensor, k: usize) -> Result<Vec<(u32, f32)>> {
    let v: Vec<f32> = logits
        .to_dtype(DType::F32)
        .map_err(speccompact_runtime::Error::from)?
        .flatten_all()
        .map_err(speccompact_runtime::Error::from)?
        .to_vec1()
        .map_err(speccompact_runtime::Error::from)?;
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

impl Backend for ModelBackend {
    type Session = ModelSession;

    fn name(&self) -> &str {
        &self.name
    }

    fn format(&self) -> &ChatFormat {
        &self.format
    }

    fn context_length(&self) -> usize {
        self.model.decoder.config().context_length
    }

    fn count_tokens(&self, text: &str) -> Result<usize> {
        Ok(self.model.tokenizer.encode(text, false)?.len())
    }

    fn is_gpu(&self) -> bool {
        !matches!(self.model.decoder.device(), Device::Cpu)
    }

    fn open(&self, prefix: &str) -> Result<ModelSession> {
        let tokens = self.model.tokenizer.encode(prefix, true)?;
        let seq = self.model.decoder.prefill(&tokens, self.prefill_chunk)?;
        Ok(ModelSession {
            prefix: seq.freeze()?,
            streams: HashMap::new(),
            segments: HashMap::new(),
        })
    }

    fn run(&self, session: &mut ModelSession, requests: &[Request]) -> Result<Vec<Response>> {
        let mut seen = std::collections::HashSet::new();
        if let Some(r) = requests.iter().find(|r| !seen.insert(r.stream)) {
            return Err(self.err(format!("stream {} appears twice in one batch", r.stream)));
        }
        let tok = &self.model.tokenizer;
        let mut news: Vec<Vec<u32>> = Vec::with_capacity(requests.len());
        let mut rules = Vec::with_capacity(requests.len());
        for r in requests {
            let want = self.tokens(&mut session.segments, &r.prompt)?;
            if want.is_empty() {
                return Err(self.err(format!("stream {}: empty prompt", r.stream)));
            }
            let prefix = &session.prefix;
            let seq = session
                .streams
                .entry(r.stream)
                .or_insert_with(|| prefix.fork());
            let have = seq.suffix_tokens();
            let mut common = have.iter().zip(&want).take_while(|(a, b)| a == b).count();
            // At least one token is fed, so the forward yields the next distribution.
            common = common.min(want.len() - 1);
            seq.truncate(seq.prefix_len() + common)?;
            news.push(want[common..].to_vec());
            rules.push(match r.kind {
                RequestKind::Judge { .. } => StopRules {
                    max_new_tokens: 1,
                    stop_tokens: Vec::new(),
                    stop_at_newline: false,
                },
                RequestKind::Generate {
                    max_tokens,
                    stop_at_newline,
                } => {
                    let s = StopRules::new(tok, max_tokens);
                    if stop_at_newline {
                        s.line()
                    } else {
                        s
                    }
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
        let mut judged: Vec<Option<Vec<(String, f32)>>> = vec![None; requests.len()];
        let outs = greedy_rows(
            &self.model.decoder,
            tok,
            &mut seqs,
            &prompts,
            &rules,
            |i, l| {
                if let RequestKind::Judge { top_k: k } = requests[i].kind {
                    let mut c = Vec::with_capacity(k);
                    for (id, p) in top_k(l, k).map_err(|e| match e {
                        Error::Runtime(r) => r,
                        other => speccompact_runtime::Error::InvalidRequest(other.to_string()),
                    })? {
                        c.push((tok.decode(&[id])?, p));
                    }
                    judged[i] = Some(c);
                }
                Ok(())
            },
        )?;
        let mut responses = Vec::with_capacity(requests.len());
        for ((r, out), j) in requests.iter().zip(outs).zip(judged) {
            responses.push(match r.kind {
                RequestKind::Judge { .. } => Response::Judged(
                    j.ok_or_else(|| self.err(format!("stream {}: no distribution", r.stream)))?,
                ),
                RequestKind::Generate { .. } => Response::Generated(Generated {
                    tokens: out.tokens.len() + usize::from(out.stop_token.is_some()),
                    text: out.text,
                    reason: out.reason,
                }),
            });
        }
        Ok(responses)
    }
}
