//! The byte-level tokenizer that synthetic checkpoints ship, built with the `tokenizers` crate and
//! saved as a real `tokenizer.json`: every byte is a token, the config's special ids carry
//! `<|bos|>`, `<|eos|>`, `<|pad|>`, `<|mask|>`, and the remaining ids are reserved special tokens,
//! so any vocabulary size of at least 256 + specials works.

use std::collections::HashMap;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

use crate::config::LagunaConfig;
use crate::error::{Error, Result};

/// GPT-2's byte-to-character map used by byte-level BPE: printable bytes stand for themselves,
/// the rest are shifted to code points from 256 upwards.
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars: Vec<u32> = printable.clone();
    let mut extra = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            printable.push(b);
            chars.push(256 + extra);
            extra += 1;
        }
    }
    let mut map = vec!['\0'; 256];
    for (b, c) in printable.iter().zip(chars) {
        map[*b as usize] = char::from_u32(c).expect("valid code point");
    }
    map
}

pub fn synthetic_tokenizer_json(cfg: &LagunaConfig, mask_token_id: u32) -> Result<String> {
    let vocab_size = cfg.vocab_size;
    let mut specials: Vec<(u32, String)> = vec![];
    let mut name_once = |id: Option<u32>, name: &str| {
        if let Some(id) = id {
            if !specials.iter().any(|(i, _)| *i == id) {
                specials.push((id, name.to_string()));
            }
        }
    };
    name_once(cfg.bos_token_id, "<|bos|>");
    for (k, &e) in cfg.eos_token_ids.iter().enumerate() {
        name_once(
            Some(e),
            &if k == 0 {
                "<|eos|>".to_string()
            } else {
                format!("<|eos_{k}|>")
            },
        );
    }
    name_once(cfg.pad_token_id, "<|pad|>");
    name_once(Some(mask_token_id), "<|mask|>");
    if vocab_size < 256 + specials.len() {
        return Err(Error::field(
            "vocab_size",
            format!("{vocab_size} is too small for a byte-level tokenizer (256 bytes + specials)"),
        ));
    }
    let mut vocab: Vec<(String, u32)> = Vec::with_capacity(vocab_size);
    let special_ids: HashMap<u32, String> = specials.into_iter().collect();
    let chars = byte_chars();
    let mut next_byte = 0usize;
    let mut added = vec![];
    for id in 0..vocab_size as u32 {
        let tok = if let Some(name) = special_ids.get(&id) {
            added.push(name.clone());
            name.clone()
        } else if next_byte < 256 {
            next_byte += 1;
            chars[next_byte - 1].to_string()
        } else {
            let t = format!("<|reserved_{id}|>");
            added.push(t.clone());
            t
        };
        vocab.push((tok, id));
    }
    let bpe = BPE::builder()
        .vocab_and_merges(
            vocab
                .into_iter()
                .collect::<tokenizers::models::bpe::Vocab>(),
            vec![],
        )
        .build()
        .map_err(|e| Error::Checkpoint(format!("building the synthetic tokenizer: {e}")))?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
    tok.with_decoder(Some(ByteLevelDecoder::default()));
    let added: Vec<AddedToken> = added
        .into_iter()
        .map(|t| AddedToken::from(t, true))
        .collect();
    tok.add_special_tokens(&added);
    tok.to_string(false)
        .map_err(|e| Error::Checkpoint(format!("serialising the synthetic tokenizer: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_tokenizer_round_trips_text_and_places_specials() {
        let p = crate::synth::preset("tiny").unwrap();
        let json = synthetic_tokenizer_json(&p.target, p.drafter.mask_token_id).unwrap();
        let tok: Tokenizer = json.parse().unwrap();
        assert_eq!(tok.get_vocab_size(true), p.target.vocab_size);
        assert_eq!(tok.token_to_id("<|bos|>"), p.target.bos_token_id);
        assert_eq!(tok.token_to_id("<|mask|>"), Some(p.drafter.mask_token_id));
        let text = "Hello, wörld!\n\tfn main() {}";
        let enc = tok.encode(text, false).unwrap();
        assert_eq!(enc.get_ids().len(), text.len(), "one token per byte");
        assert!(enc
            .get_ids()
            .iter()
            .all(|&i| (i as usize) < p.target.vocab_size));
        assert_eq!(tok.decode(enc.get_ids(), true).unwrap(), text);
        // Deterministic output.
        assert_eq!(
            json,
            synthetic_tokenizer_json(&p.target, p.drafter.mask_token_id).unwrap()
        );
    }
}
