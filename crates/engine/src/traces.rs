//! Greedy traces (`assets/traces/*.json`, written by `tools/train/traces.py`) as prompts: what
//! `bench --prompts` and the GPU's DFlash test decode.

/// The token ids of each prompt of the traces `text` (`prompts[].prompt_ids`), in order.
pub fn prompt_ids(text: &str) -> serde_json::Result<Vec<Vec<u32>>> {
    #[derive(serde::Deserialize)]
    struct Prompt {
        prompt_ids: Vec<u32>,
    }
    #[derive(serde::Deserialize)]
    struct Traces {
        prompts: Vec<Prompt>,
    }
    let t: Traces = serde_json::from_str(text)?;
    Ok(t.prompts.into_iter().map(|p| p.prompt_ids).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundled_traces_give_their_prompts_in_order() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../assets/traces/laguna-tiny-hf-greedy.json"
        );
        let prompts = prompt_ids(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(prompts.len(), 20);
        assert_eq!(prompts[0].len(), 60);
        assert_eq!(prompts[0][..4], [0, 6, 3526, 2587]);
        assert!(prompt_ids(r#"{"prompts": [{"ids": [1]}]}"#).is_err());
    }
}
