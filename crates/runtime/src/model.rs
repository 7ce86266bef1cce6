//! A loaded model: decoder, tokenizer and chat template, from one GGUF file (with an
//! optional `tokenizer.json` / `tokenizer_config.json` beside it taking precedence) or from a
//! Hugging Face folder (config.json, safetensors, tokenizer.json, tokenizer_config.json).

use crate::chat::ChatTemplate;
use crate::config::md_str;
use crate::decoder::{Decoder, LoadOptions};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};
use candle_core::quantized::gguf_file::Content;
use candle_core::Device;
use std::path::{Path, PathBuf};

/// Decoder + tokenizer + chat template of one model.
#[derive(Debug, Clone)]
pub struct Model {
    /// The network.
    pub decoder: Decoder,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// Its chat template, if the files carry one.
    pub chat_template: Option<ChatTemplate>,
    /// Where it was loaded from.
    pub path: PathBuf,
}

/// Opens and parses a GGUF header; errors name the file and what is wrong with it.
pub fn read_gguf(path: &Path) -> Result<(Content, std::fs::File)> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    let ct = Content::read(&mut f).map_err(|e| Error::CorruptGguf {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    // Every tensor must lie inside the file: catches truncated downloads up front.
    let size = f
        .metadata()
        .map_err(|e| Error::Io {
            path: path.to_path_buf(),
            source: e,
        })?
        .len();
    for (name, info) in &ct.tensor_infos {
        let elems = info.shape.elem_count();
        let bytes = elems / info.ggml_dtype.block_size() * info.ggml_dtype.type_size();
        let end = ct.tensor_data_offset + info.offset + bytes as u64;
        if end > size {
            return Err(Error::CorruptGguf {
                path: path.to_path_buf(),
                reason: format!(
                    "tensor `{name}` ends at byte {end}, past the end of the file ({size} bytes)"
                ),
            });
        }
    }
    Ok((ct, f))
}

impl Model {
    /// The same model (weights shared) whose decodes use a fresh lookup in `mode`.
    pub fn with_lookup(&self, mode: crate::LookupMode) -> Model {
        Model {
            decoder: self.decoder.with_lookup(mode),
            ..self.clone()
        }
    }

    /// The same model with a LoRA adapter on its decoder ([`Decoder::with_adapter`]; weights
    /// shared with this one).
    pub fn with_adapter(&self, adapter: &crate::Adapter) -> Result<Model> {
        Ok(Model {
            decoder: self.decoder.with_adapter(adapter)?,
            ..self.clone()
        })
    }

    /// Loads a model from a GGUF file or a Hugging Face model folder.
    pub fn load(path: &Path, device: &Device, opts: LoadOptions) -> Result<Self> {
        if path.is_dir() {
            return Self::load_hf_dir(path, device, opts);
        }
        let (ct, mut f) = read_gguf(path)?;
        let decoder = Decoder::from_gguf(&ct, &mut f, device, opts)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let tok_json = dir.join("tokenizer.json");
        let tokenizer = if tok_json.is_file() {
            Tokenizer::from_file(&tok_json)?
        } else {
            Tokenizer::from_gguf(&ct)?
        };
        let cfg_json = dir.join("tokenizer_config.json");
        let chat_template = if cfg_json.is_file() {
            ChatTemplate::from_tokenizer_config(&cfg_json)?
        } else {
            None
        };
        let chat_template = match chat_template {
            Some(t) => Some(t),
            None => match md_str(&ct, "tokenizer.chat_template") {
                Ok(src) => {
                    let name = |key: &str| {
                        crate::config::md_u32(&ct, key)
                            .ok()
                            .and_then(|id| tokenizer.inner().id_to_token(id as u32))
                            .unwrap_or_default()
                    };
                    Some(ChatTemplate::new(
                        src,
                        &name("tokenizer.ggml.bos_token_id"),
                        &name("tokenizer.ggml.eos_token_id"),
                    )?)
                }
                Err(_) => None,
            },
        };
        Ok(Self::loaded(decoder, tokenizer, chat_template, path))
    }

    /// Loads a Hugging Face folder: config.json, safetensors, tokenizer.json and (for the chat
    /// template) tokenizer_config.json.
    pub fn load_hf_dir(dir: &Path, device: &Device, opts: LoadOptions) -> Result<Self> {
        let decoder = Decoder::from_safetensors(dir, device, opts)?;
        let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"))?;
        let cfg_json = dir.join("tokenizer_config.json");
        let chat_template = if cfg_json.is_file() {
            ChatTemplate::from_tokenizer_config(&cfg_json)?
        } else {
            None
        };
        Ok(Self::loaded(decoder, tokenizer, chat_template, dir))
    }

    fn loaded(
        decoder: Decoder,
        tokenizer: Tokenizer,
        chat_template: Option<ChatTemplate>,
        path: &Path,
    ) -> Self {
        tracing::info!(
            path = %path.display(),
            arch = ?decoder.config().arch,
            layers = decoder.config().num_layers,
            "model loaded"
        );
        Self {
            decoder,
            tokenizer,
            chat_template,
            path: path.to_path_buf(),
        }
    }
}
