//! `tokenizer.json` through the `tokenizers` crate.

use std::path::Path;

use fastdecode_model::{Error, Result};

pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
}

impl TextTokenizer {
    pub fn load(path: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path).map_err(|e| {
            Error::Checkpoint(format!("{}: cannot load tokenizer: {e}", path.display()))
        })?;
        Ok(TextTokenizer { inner })
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
}
