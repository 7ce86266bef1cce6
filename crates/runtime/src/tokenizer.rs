//! Tokenizers: from `tokenizer.json` when a model ships one, otherwise rebuilt from GGUF
//! metadata (byte-level BPE with the pre-tokenizer named by `tokenizer.ggml.pre`, or
//! SentencePiece-style BPE with byte fallback for `llama`/`gemma` vocabularies).

use crate::config::{md, md_str, md_u32};
use crate::{Error, Result};
use candle_core::quantized::gguf_file::{Content, Value};
use std::path::Path;
use std::sync::OnceLock;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

const REGEX_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const REGEX_LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A tokenizer with the model's special tokens and stop tokens.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eos: Vec<u32>,
    bos: Option<u32>,
    add_bos: bool,
    newline: OnceLock<Vec<bool>>,
    hash_start: OnceLock<Vec<u32>>,
}

fn tok_err(e: impl std::fmt::Display) -> Error {
    Error::Tokenizer(e.to_string())
}

impl Tokenizer {
    /// Loads a `tokenizer.json`. Stop tokens are looked up among the usual end markers.
    pub fn from_file(path: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
        let mut eos = Vec::new();
        for name in [
            "<|im_end|>",
            "<|endoftext|>",
            "</s>",
            "<|eot_id|>",
            "<end_of_turn>",
            "<eos>",
        ] {
            if let Some(id) = inner.token_to_id(name) {
                eos.push(id);
            }
        }
        Ok(Self::wrap(inner, eos, None, false))
    }

    fn wrap(inner: tokenizers::Tokenizer, eos: Vec<u32>, bos: Option<u32>, add_bos: bool) -> Self {
        Self {
            inner,
            eos,
            bos,
            add_bos,
            newline: OnceLock::new(),
            hash_start: OnceLock::new(),
        }
    }

    /// Rebuilds the tokenizer stored in GGUF metadata.
    pub fn from_gguf(ct: &Content) -> Result<Self> {
        let kind = md_str(ct, "tokenizer.ggml.model")?;
        let tokens = string_array(ct, "tokenizer.ggml.tokens")?;
        let types: Vec<i32> = match md(ct, "tokenizer.ggml.token_type") {
            Ok(Value::Array(v)) => v
                .iter()
                .map(|x| match x {
                    Value::I32(t) => *t,
                    Value::U32(t) => *t as i32,
                    _ => 1,
                })
                .collect(),
            _ => vec![1; tokens.len()],
        };
        let mut inner = match kind {
            "gpt2" => {
                let merges = string_array(ct, "tokenizer.ggml.merges")?;
                let pre = md_str(ct, "tokenizer.ggml.pre").unwrap_or("default");
                byte_level_bpe(&tokens, &merges, pre)?
            }
            "llama" | "gemma" => {
                let scores: Vec<f32> = match md(ct, "tokenizer.ggml.scores") {
                    Ok(Value::Array(v)) => v
                        .iter()
                        .map(|x| if let Value::F32(s) = x { *s } else { 0.0 })
                        .collect(),
                    _ => vec![0.0; tokens.len()],
                };
                let prefix_space = !matches!(
                    md(ct, "tokenizer.ggml.add_space_prefix"),
                    Ok(Value::Bool(false))
                );
                sentencepiece_bpe(&tokens, &scores, &types, prefix_space)?
            }
            other => {
                return Err(Error::Tokenizer(format!(
                "GGUF tokenizer model `{other}` is not supported (supported: gpt2, llama, gemma)"
            )))
            }
        };
        add_typed_specials(&mut inner, &tokens, &types)?;
        let id = |key: &str| md_u32(ct, key).ok().map(|x| x as u32);
        let mut eos: Vec<u32> = id("tokenizer.ggml.eos_token_id").into_iter().collect();
        for name in ["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>"] {
            if let Some(t) = inner.token_to_id(name) {
                if !eos.contains(&t) {
                    eos.push(t);
                }
            }
        }
        let add_bos = matches!(
            md(ct, "tokenizer.ggml.add_bos_token"),
            Ok(Value::Bool(true))
        );
        Ok(Self::wrap(
            inner,
            eos,
            id("tokenizer.ggml.bos_token_id"),
            add_bos,
        ))
    }

    /// Encodes text; special-token strings in the text (e.g. `<|im_start|>`) become their ids.
    /// A BOS token is prepended when the model asks for one and `add_bos` is set.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(tok_err)?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if add_bos && self.add_bos {
            if let Some(b) = self.bos {
                ids.push(b);
            }
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Decodes ids to text, keeping special tokens visible.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(tok_err)
    }

    /// The id of a token string, if it is in the vocabulary.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Tokens that end a generation (EOS and end-of-turn markers).
    pub fn eos_tokens(&self) -> &[u32] {
        &self.eos
    }

    /// Whether the decoded text of `id` contains a newline (table built on first use).
    pub fn has_newline(&self, id: u32) -> bool {
        let table = self.newline.get_or_init(|| {
            (0..self.inner.get_vocab_size(true) as u32)
                .map(|t| {
                    self.inner
                        .decode(&[t], false)
                        .is_ok_and(|s| s.contains('\n'))
                })
                .collect()
        });
        table.get(id as usize).copied().unwrap_or(false)
    }

    /// Tokens whose decoded text starts with `#` after optional spaces (markdown heading
    /// openers), ascending (table built on first use).
    pub fn hash_tokens(&self) -> &[u32] {
        self.hash_start.get_or_init(|| {
            (0..self.inner.get_vocab_size(true) as u32)
                .filter(|&t| {
                    self.inner
                        .decode(&[t], false)
                        .is_ok_and(|s| s.trim_start_matches(' ').starts_with('#'))
                })
                .collect()
        })
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Control (3) and user-defined (4) tokens are matched before the model runs.
fn add_typed_specials(
    inner: &mut tokenizers::Tokenizer,
    tokens: &[String],
    types: &[i32],
) -> Result<()> {
    let specials: Vec<AddedToken> = tokens
        .iter()
        .zip(types)
        .filter(|(_, &t)| t == 3 || t == 4)
        .map(|(s, &t)| AddedToken::from(s.clone(), t == 3))
        .collect();
    inner.add_special_tokens(specials).map_err(tok_err)?;
    Ok(())
}

/// The `tokenizer.json` text of a byte-level BPE vocabulary (GGUF token types: 3 = control,
/// 4 = user-defined), as a Hugging Face checkpoint would ship it.
pub fn byte_level_tokenizer_json(
    tokens: &[String],
    merges: &[String],
    types: &[i32],
    pre: &str,
) -> Result<String> {
    let mut t = byte_level_bpe(tokens, merges, pre)?;
    add_typed_specials(&mut t, tokens, types)?;
    t.to_string(false).map_err(tok_err)
}

fn string_array(ct: &Content, key: &str) -> Result<Vec<String>> {
    match md(ct, key)? {
        Value::Array(v) => v
            .iter()
            .map(|x| match x {
                Value::String(s) => Ok(s.clone()),
                other => Err(Error::metadata(
                    key,
                    format!("non-string element {other:?}"),
                )),
            })
            .collect(),
        other => Err(Error::metadata(
            key,
            format!("expected an array, got {other:?}"),
        )),
    }
}

fn split(regex: &str) -> Result<PreTokenizerWrapper> {
    Ok(Split::new(
        SplitPattern::Regex(regex.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(tok_err)?
    .into())
}

/// Token string to id, in vocabulary order.
fn vocab_of(tokens: &[String]) -> tokenizers::models::bpe::Vocab {
    tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect()
}

/// Byte-level BPE; `pre` selects the pre-tokenizer as llama.cpp's `tokenizer.ggml.pre` does.
fn byte_level_bpe(
    tokens: &[String],
    merges: &[String],
    pre: &str,
) -> Result<tokenizers::Tokenizer> {
    let vocab = vocab_of(tokens);
    let merges = merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| Error::Tokenizer(format!("invalid merge `{m}`")))
        })
        .collect::<Result<Vec<_>>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(tok_err)?;
    let mut t = tokenizers::Tokenizer::new(bpe);
    let byte_level_no_regex = ByteLevel::new(false, false, false);
    let pre_tok: PreTokenizerWrapper = match pre {
        "qwen2" | "deepseek-r1-qwen" => {
            t.with_normalizer(Some(NFC)).map_err(tok_err)?;
            PreSequence::new(vec![split(REGEX_QWEN2)?, byte_level_no_regex.into()]).into()
        }
        "llama-bpe" | "llama3" | "smaug-bpe" => {
            PreSequence::new(vec![split(REGEX_LLAMA3)?, byte_level_no_regex.into()]).into()
        }
        "smollm" => PreSequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])
        .into(),
        other => {
            if !matches!(other, "default" | "gpt2" | "gpt-2") {
                tracing::warn!(pre = other, "unknown GGUF pre-tokenizer, using GPT-2 rules");
            }
            ByteLevel::new(false, true, true).into()
        }
    };
    t.with_pre_tokenizer(Some(pre_tok));
    t.with_decoder(Some(ByteLevelDecoder::new(false, true, true)));
    Ok(t)
}

/// SentencePiece vocabularies as BPE with byte fallback. Merges are derived from the vocab:
/// every token that splits into two vocab tokens yields a merge, ranked by the token's score.
fn sentencepiece_bpe(
    tokens: &[String],
    scores: &[f32],
    types: &[i32],
    prefix_space: bool,
) -> Result<tokenizers::Tokenizer> {
    let vocab = vocab_of(tokens);
    let mut ranked: Vec<(f32, u32, (String, String))> = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        if types.get(id).copied().unwrap_or(1) != 1 {
            continue;
        }
        let score = scores.get(id).copied().unwrap_or(0.0);
        for (i, _) in tok.char_indices().skip(1) {
            let (a, b) = tok.split_at(i);
            if let (Some(&ia), Some(&ib)) = (vocab.get(a), vocab.get(b)) {
                ranked.push((score, ia.max(ib), (a.to_string(), b.to_string())));
            }
        }
    }
    ranked.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
    let merges = ranked.into_iter().map(|(_, _, m)| m).collect();
    let unk = tokens
        .iter()
        .zip(types)
        .find(|(_, &t)| t == 2)
        .map(|(s, _)| s.clone());
    let mut b = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(u) = unk {
        b = b.unk_token(u);
    }
    let mut t = tokenizers::Tokenizer::new(b.build().map_err(tok_err)?);
    let mut norm: Vec<NormalizerWrapper> = Vec::new();
    if prefix_space {
        norm.push(Prepend::new("\u{2581}".into()).into());
    }
    norm.push(Replace::new(" ", "\u{2581}").map_err(tok_err)?.into());
    t.with_normalizer(Some(tokenizers::normalizers::Sequence::new(norm)))
        .map_err(tok_err)?;
    let mut dec: Vec<DecoderWrapper> = vec![
        tokenizers::decoders::DecoderWrapper::Replace(
            Replace::new("\u{2581}", " ").map_err(tok_err)?,
        ),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if prefix_space {
        dec.push(Strip::new(' ', 1, 0).into());
    }
    t.with_decoder(Some(DecoderSequence::new(dec)));
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::tiny_vocab;

    fn tiny(pre: &str) -> tokenizers::Tokenizer {
        let (tokens, merges, _) = tiny_vocab();
        byte_level_bpe(&tokens, &merges, pre).unwrap()
    }

    #[test]
    fn byte_level_round_trips_and_merges() {
        for pre in ["qwen2", "smollm", "llama-bpe", "gpt2"] {
            let t = tiny(pre);
            let text = "the cat\n\nsaid: 123 héllo";
            let ids = t.encode(text, false).unwrap();
            assert_eq!(t.decode(ids.get_ids(), false).unwrap(), text, "{pre}");
            // " the" is a single merged token in the tiny vocabulary.
            let ids = t.encode("a the", false).unwrap();
            assert_eq!(ids.len(), 2, "{pre}: {:?}", ids.get_tokens());
        }
    }

    fn splits(pre: &str, text: &str) -> usize {
        use tokenizers::PreTokenizer;
        let mut p = tokenizers::PreTokenizedString::from(text);
        tiny(pre)
            .get_pre_tokenizer()
            .unwrap()
            .pre_tokenize(&mut p)
            .unwrap();
        p.get_splits(
            tokenizers::OffsetReferential::Original,
            tokenizers::OffsetType::Byte,
        )
        .len()
    }

    #[test]
    fn pre_tokenizers_differ_on_digits() {
        // No merges cover digits, so every rule gives five byte tokens; the splits differ.
        assert_eq!(tiny("qwen2").encode("12345", false).unwrap().len(), 5);
        assert_eq!(splits("qwen2", "12345"), 5);
        assert_eq!(splits("smollm", "12345"), 5);
        assert_eq!(splits("llama3", "12345"), 2);
        assert_eq!(splits("gpt2", "12345"), 1);
    }

    #[test]
    fn sentencepiece_round_trips_with_byte_fallback() {
        let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        let mut types = vec![2, 3, 3];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(6);
        }
        for p in [
            "\u{2581}",
            "h",
            "e",
            "l",
            "o",
            "w",
            "r",
            "d",
            "\u{2581}h",
            "el",
            "\u{2581}hel",
            "lo",
            "\u{2581}hello",
        ] {
            tokens.push(p.into());
            types.push(1);
        }
        let scores: Vec<f32> = (0..tokens.len()).map(|i| -(i as f32)).collect();
        let t = sentencepiece_bpe(&tokens, &scores, &types, true).unwrap();
        let enc = t.encode("hello world ü", false).unwrap();
        assert_eq!(enc.get_tokens()[0], "\u{2581}hello");
        assert!(
            enc.get_tokens().iter().any(|s| s.starts_with("<0x")),
            "{:?}",
            enc.get_tokens()
        );
        assert_eq!(t.decode(enc.get_ids(), false).unwrap(), "hello world ü");
    }
}
