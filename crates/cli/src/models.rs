//! Attention geometry of well-known models, per GPU (after tensor parallelism).

use decode_attn::AttentionShape;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Model {
    pub name: &'static str,
    pub num_q_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub about: &'static str,
}

impl Model {
    pub fn shape(&self) -> AttentionShape {
        AttentionShape { num_q_heads: self.num_q_heads, num_kv_heads: self.num_kv_heads, head_dim: self.head_dim }
    }
}

/// The names `bench_peers.py` uses (llama3-8b, llama3-70b-tp8) come first: the
/// CSV joins on them.
pub const MODELS: &[Model] = &[
    Model { name: "llama3-8b", num_q_heads: 32, num_kv_heads: 8, head_dim: 128, about: "Llama-3(.1)-8B" },
    Model {
        name: "llama3-70b-tp8",
        num_q_heads: 8,
        num_kv_heads: 1,
        head_dim: 128,
        about: "Llama-3-70B, per GPU at tensor parallelism 8",
    },
    Model { name: "llama3-70b", num_q_heads: 64, num_kv_heads: 8, head_dim: 128, about: "Llama-3-70B on one GPU" },
    Model {
        name: "llama3-405b-tp8",
        num_q_heads: 16,
        num_kv_heads: 1,
        head_dim: 128,
        about: "Llama-3.1-405B, per GPU at tensor parallelism 8",
    },
    Model { name: "mistral-7b", num_q_heads: 32, num_kv_heads: 8, head_dim: 128, about: "Mistral-7B" },
    Model { name: "qwen2-7b", num_q_heads: 28, num_kv_heads: 4, head_dim: 128, about: "Qwen2(.5)-7B: group of 7" },
    Model { name: "qwen2-72b", num_q_heads: 64, num_kv_heads: 8, head_dim: 128, about: "Qwen2(.5)-72B on one GPU" },
    Model { name: "gemma2-9b", num_q_heads: 16, num_kv_heads: 8, head_dim: 256, about: "Gemma-2-9B: head dim 256" },
    Model { name: "phi3-mini", num_q_heads: 32, num_kv_heads: 32, head_dim: 96, about: "Phi-3-mini: no GQA, d 96" },
    Model {
        name: "starcoder-15b",
        num_q_heads: 48,
        num_kv_heads: 1,
        head_dim: 128,
        about: "StarCoder-15B: multi-query, a group of 48",
    },
    Model { name: "falcon-7b", num_q_heads: 71, num_kv_heads: 1, head_dim: 64, about: "Falcon-7B: multi-query, d 64" },
];

/// For clap: a model by name, or the list of known names.
pub fn parse_model(name: &str) -> Result<Model, String> {
    MODELS.iter().find(|m| m.name.eq_ignore_ascii_case(name)).copied().ok_or_else(|| {
        format!(
            "unknown model {name:?}; known: {} (or give --heads, --kv-heads and --head-dim)",
            MODELS.iter().map(|m| m.name).collect::<Vec<_>>().join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_model_is_a_valid_shape() {
        for model in MODELS {
            model.shape().validate().unwrap_or_else(|err| panic!("{}: {err}", model.name));
        }
        assert_eq!(parse_model("qwen2-7b").unwrap().shape().group_size(), 7);
        assert!(parse_model("gpt5").unwrap_err().contains("llama3-8b"));
    }
}
