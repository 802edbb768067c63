//! `tokenizer.json` through the `tokenizers` crate.

use std::path::{Path, PathBuf};

use fastdecode_model::{Error, Result};

pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

impl TextTokenizer {
    /// Loads `path` for a model of `model_vocab` tokens. A tokenizer with more tokens than the
    /// model is refused: it would encode text into ids the model has no embedding for. One with
    /// fewer is a model whose embedding is padded (common in HF checkpoints): accepted, and
    /// `unknown` tells which generated ids it cannot spell.
    pub fn load(path: &Path, model_vocab: usize) -> Result<Self> {
        let text = fastdecode_model::files::read_text(path)?;
        let inner: tokenizers::Tokenizer = text.parse().map_err(|e| {
            Error::Checkpoint(format!("{}: cannot load tokenizer: {e}", path.display()))
        })?;
        let n = inner.get_vocab_size(true);
        if n > model_vocab {
            return Err(Error::Checkpoint(format!(
                "{}: the tokenizer has {n} tokens, more than the model's vocab_size {model_vocab} \
                 (a tokenizer of another model?)",
                path.display()
            )));
        }
        Ok(TextTokenizer {
            inner,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self
            .inner
            .encode(text, false)
            .map_err(|e| Error::Input(format!("tokenizing the prompt: {e}")))?
            .get_ids()
            .to_vec())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| Error::Input(format!("decoding tokens: {e}")))
    }

    /// How many of `ids` have no token in this tokenizer (decoding drops them silently).
    pub fn unknown(&self, ids: &[u32]) -> usize {
        ids.iter()
            .filter(|&&i| self.inner.id_to_token(i).is_none())
            .count()
    }
}
