//! A backend-neutral description of a Gemma text decoder: every architectural fact the forward
//! pass needs, resolved from whatever config format the checkpoint came in. Gemma 3 and Gemma 4
//! are both expressed here; features one of them lacks are simply off.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Gemma3,
    Gemma4,
}

impl Arch {
    pub fn name(&self) -> &'static str {
        match self {
            Arch::Gemma3 => "gemma3",
            Arch::Gemma4 => "gemma4",
        }
    }
}

/// Rotary embedding of one layer type (NeoX / rotate-half convention).
#[derive(Clone, Debug, PartialEq)]
pub struct RopeSpec {
    pub theta: f64,
    /// Denominator of the frequency exponent: `inv_freq[i] = theta^(-2i/dim_base)`. Equal to the
    /// head dim, also for Gemma 4's "proportional" RoPE where only some pairs rotate.
    pub dim_base: usize,
    /// Number of frequency pairs that rotate (pairs `(i, i + head_dim/2)` for `i < rotary_pairs`);
    /// the remaining pairs have frequency 0 and pass through unchanged.
    pub rotary_pairs: usize,
    /// Linear position scaling (positions are divided by this factor).
    pub linear_factor: f64,
}

impl RopeSpec {
    /// Inverse frequencies for the `head_dim / 2` pairs of a head, in f64 then rounded to f32
    /// as the reference implementations do.
    pub fn inv_freq(&self, head_dim: usize) -> Vec<f32> {
        (0..head_dim / 2)
            .map(|i| {
                if i < self.rotary_pairs {
                    let f = self.theta.powf(-((2 * i) as f64) / self.dim_base as f64);
                    (f / self.linear_factor) as f32
                } else {
                    0.0
                }
            })
            .collect()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct LayerSpec {
    /// Sliding-window (local) attention; otherwise full (global).
    pub sliding: bool,
    pub head_dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub intermediate: usize,
    pub rope: RopeSpec,
    /// Index of the layer whose K/V cache this layer attends to. Equal to the layer's own
    /// index when it computes K/V itself (Gemma 4 KV sharing makes later layers read donors).
    pub kv_source: usize,
}

impl LayerSpec {
    pub fn owns_kv(&self, index: usize) -> bool {
        self.kv_source == index
    }
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

/// Per-layer embeddings (Gemma 4 E-series): a second token table giving each layer a small
/// extra input, mixed with a projection of the token embedding.
#[derive(Clone, Debug, PartialEq)]
pub struct PleSpec {
    /// Width per layer (256 for E2B/E4B).
    pub dim: usize,
    pub vocab: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    pub arch: Arch,
    pub hidden: usize,
    pub vocab: usize,
    pub layers: Vec<LayerSpec>,
    pub rms_eps: f32,
    /// Keys visible to a sliding layer, the current one included (positions `p-w+1 ..= p`).
    pub sliding_window: usize,
    /// Multiplier of the token embedding (sqrt(hidden), possibly rounded to the weight dtype).
    pub embed_scale: f32,
    /// Multiplier of q·k (Gemma 3: query_pre_attn_scalar^-0.5; Gemma 4: 1.0).
    pub attn_scale: f32,
    pub attn_softcap: Option<f32>,
    pub final_softcap: Option<f32>,
    /// Gemma 4 normalizes V per head with a weightless RMSNorm.
    pub v_norm: bool,
    /// Gemma 4 multiplies the residual stream by a learned per-layer scalar.
    pub layer_scalar: bool,
    pub ple: Option<PleSpec>,
    pub tie_embeddings: bool,
    pub max_context: usize,
    pub bos_token_id: u32,
    pub eos_token_ids: Vec<u32>,
}

impl ModelSpec {
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Layers that own a KV cache, in order.
    pub fn kv_layers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.layers.len()).filter(|&i| self.layers[i].owns_kv(i))
    }

    /// Internal consistency checks; loaders call this before building a runner.
    pub fn validate(&self) -> Result<(), String> {
        if self.layers.is_empty() {
            return Err("model has no layers".into());
        }
        if self.hidden == 0 || self.vocab == 0 {
            return Err("hidden size and vocabulary must be non-zero".into());
        }
        for (i, l) in self.layers.iter().enumerate() {
            if l.head_dim == 0 || l.head_dim % 2 != 0 {
                return Err(format!("layer {i}: head dim {} must be even", l.head_dim));
            }
            if l.n_heads == 0 || l.n_kv_heads == 0 || l.n_heads % l.n_kv_heads != 0 {
                return Err(format!(
                    "layer {i}: {} heads not divisible into {} kv heads",
                    l.n_heads, l.n_kv_heads
                ));
            }
            if l.kv_source > i {
                return Err(format!("layer {i} reads KV of later layer {}", l.kv_source));
            }
            let src = &self.layers[l.kv_source];
            if !src.owns_kv(l.kv_source) {
                return Err(format!("layer {i}: KV donor {} owns no KV", l.kv_source));
            }
            if src.head_dim != l.head_dim
                || src.n_kv_heads != l.n_kv_heads
                || src.sliding != l.sliding
            {
                return Err(format!(
                    "layer {i}: KV donor {} has a different attention shape",
                    l.kv_source
                ));
            }
            if l.rope.rotary_pairs > l.head_dim / 2 {
                return Err(format!("layer {i}: more rotary pairs than head_dim/2"));
            }
        }
        if self.sliding_window == 0 {
            return Err("sliding window must be at least 1".into());
        }
        Ok(())
    }
}
