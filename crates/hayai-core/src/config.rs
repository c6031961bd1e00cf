//! Hugging Face `config.json` access. Generic on purpose: model-specific
//! interpretation lives in hayai-model.

use std::path::Path;

use serde_json::Value;

use crate::FormatError;

/// A parsed `config.json`.
#[derive(Clone, Debug, PartialEq)]
pub struct HfConfig {
    pub raw: Value,
    origin: String,
}

/// Typed read access to one JSON object of a config (the root or a nested
/// sub-config such as `text_config`).
#[derive(Clone, Copy, Debug)]
pub struct ConfigView<'a> {
    value: &'a Value,
    origin: &'a str,
    section: &'static str,
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn as_usize(v: &Value) -> Option<usize> {
    if let Some(u) = v.as_u64() {
        return usize::try_from(u).ok();
    }
    // Some configs write integers as floats (e.g. `10000.0`).
    let f = v.as_f64()?;
    (f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f <= usize::MAX as f64).then_some(f as usize)
}

impl<'a> ConfigView<'a> {
    /// The underlying JSON value.
    pub fn raw(&self) -> &'a Value {
        self.value
    }

    /// Whether this view is a nested sub-config rather than the root.
    pub fn is_nested(&self) -> bool {
        !self.section.is_empty()
    }

    /// A key's value; JSON `null` counts as absent.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.value.get(key).filter(|v| !v.is_null())
    }

    /// Non-negative integer (integral floats accepted).
    pub fn get_usize(&self, key: &str) -> Option<usize> {
        as_usize(self.get(key)?)
    }

    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_i64()
    }

    /// Any JSON number.
    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key)?.as_f64()
    }

    pub fn get_str(&self, key: &str) -> Option<&'a str> {
        self.get(key)?.as_str()
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    /// Array of non-negative integers (e.g. `eos_token_id: [1, 106]`); a
    /// single integer is returned as a one-element vector.
    pub fn get_usize_array(&self, key: &str) -> Option<Vec<usize>> {
        match self.get(key)? {
            Value::Array(a) => a.iter().map(as_usize).collect(),
            v => as_usize(v).map(|x| vec![x]),
        }
    }

    /// Array of strings (e.g. `layer_types`).
    pub fn get_str_array(&self, key: &str) -> Option<Vec<&'a str>> {
        self.get(key)?
            .as_array()?
            .iter()
            .map(Value::as_str)
            .collect()
    }

    /// A nested object.
    pub fn get_object(&self, key: &str) -> Option<ConfigView<'a>> {
        let v = self.get(key)?;
        v.is_object().then_some(ConfigView {
            value: v,
            origin: self.origin,
            section: self.section,
        })
    }

    fn where_(&self) -> String {
        if self.section.is_empty() {
            self.origin.to_string()
        } else {
            format!("{} ({})", self.origin, self.section)
        }
    }

    fn require<T>(
        &self,
        key: &str,
        expected: &str,
        f: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<T, FormatError> {
        let v = self.get(key).ok_or_else(|| FormatError::MissingKey {
            origin: self.where_(),
            key: key.to_string(),
        })?;
        f(v).ok_or_else(|| FormatError::WrongType {
            origin: self.where_(),
            key: key.to_string(),
            expected: expected.to_string(),
            found: format!("{} {v}", json_type(v)),
        })
    }

    pub fn require_usize(&self, key: &str) -> Result<usize, FormatError> {
        self.require(key, "non-negative integer", as_usize)
    }

    pub fn require_f64(&self, key: &str) -> Result<f64, FormatError> {
        self.require(key, "number", Value::as_f64)
    }

    pub fn require_str(&self, key: &str) -> Result<&'a str, FormatError> {
        self.require(key, "string", Value::as_str)
    }

    pub fn require_bool(&self, key: &str) -> Result<bool, FormatError> {
        self.require(key, "bool", Value::as_bool)
    }
}

impl HfConfig {
    /// Loads `config.json` from a model directory, or the given file.
    pub fn load(path: &Path) -> Result<Self, FormatError> {
        let file = if path.is_dir() {
            path.join("config.json")
        } else {
            path.to_path_buf()
        };
        let text = std::fs::read_to_string(&file).map_err(|e| FormatError::io(&file, e))?;
        Self::parse(&text, &file.display().to_string())
    }

    /// Parses config JSON text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, FormatError> {
        let raw: Value = serde_json::from_str(text).map_err(|e| FormatError::Json {
            origin: origin.to_string(),
            source: e,
        })?;
        Self::from_value(raw, origin)
    }

    /// Wraps an already-parsed JSON object.
    pub fn from_value(raw: Value, origin: &str) -> Result<Self, FormatError> {
        if !raw.is_object() {
            return Err(FormatError::Invalid(format!(
                "{origin}: config is a JSON {}, not an object",
                json_type(&raw)
            )));
        }
        if let Some(tc) = raw.get("text_config") {
            if !tc.is_object() && !tc.is_null() {
                return Err(FormatError::WrongType {
                    origin: origin.to_string(),
                    key: "text_config".into(),
                    expected: "object".into(),
                    found: json_type(tc).into(),
                });
            }
        }
        Ok(HfConfig {
            raw,
            origin: origin.to_string(),
        })
    }

    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The root object.
    pub fn root(&self) -> ConfigView<'_> {
        ConfigView {
            value: &self.raw,
            origin: &self.origin,
            section: "",
        }
    }

    /// `text_config` when present (multimodal wrappers such as
    /// `Gemma3ForConditionalGeneration` / `Gemma4ForConditionalGeneration`),
    /// otherwise the root.
    pub fn text_config(&self) -> ConfigView<'_> {
        match self.raw.get("text_config") {
            Some(v) if v.is_object() => ConfigView {
                value: v,
                origin: &self.origin,
                section: "text_config",
            },
            _ => self.root(),
        }
    }

    /// `architectures` (empty if absent).
    pub fn architectures(&self) -> Vec<&str> {
        self.root()
            .get_str_array("architectures")
            .unwrap_or_default()
    }

    /// Root `model_type`.
    pub fn model_type(&self) -> Option<&str> {
        self.root().get_str("model_type")
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.root().get(key)
    }

    pub fn get_usize(&self, key: &str) -> Option<usize> {
        self.root().get_usize(key)
    }

    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.root().get_f64(key)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.root().get_str(key)
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.root().get_bool(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GEMMA4: &str = r#"{
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "eos_token_id": [1, 106],
        "text_config": {
            "hidden_size": 2560,
            "num_hidden_layers": 42,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "head_dim": 256.0,
            "final_logit_softcapping": 30.0,
            "sliding_window": 512,
            "layer_types": ["sliding_attention", "full_attention"],
            "attention_bias": false,
            "hidden_activation": "gelu_pytorch_tanh",
            "rope_scaling": null,
            "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25}}
        },
        "vision_config": {"hidden_size": 768}
    }"#;

    #[test]
    fn nested_text_config() {
        let c = HfConfig::parse(GEMMA4, "config.json").unwrap();
        assert_eq!(c.architectures(), vec!["Gemma4ForConditionalGeneration"]);
        assert_eq!(c.model_type(), Some("gemma4"));
        let t = c.text_config();
        assert!(t.is_nested());
        assert_eq!(t.get_usize("hidden_size"), Some(2560));
        assert_eq!(
            t.get_usize("head_dim"),
            Some(256),
            "integral float accepted"
        );
        assert_eq!(t.get_f64("rms_norm_eps"), Some(1e-6));
        assert_eq!(t.get_f64("rope_theta"), Some(1e6));
        assert_eq!(t.get_str("hidden_activation"), Some("gelu_pytorch_tanh"));
        assert_eq!(t.get_bool("attention_bias"), Some(false));
        assert_eq!(
            t.get_str_array("layer_types").unwrap(),
            vec!["sliding_attention", "full_attention"]
        );
        assert!(t.get("rope_scaling").is_none(), "null is absent");
        let rp = t.get_object("rope_parameters").unwrap();
        let fa = rp.get_object("full_attention").unwrap();
        assert_eq!(fa.get_f64("partial_rotary_factor"), Some(0.25));
        assert_eq!(
            c.root().get_usize_array("eos_token_id").unwrap(),
            vec![1, 106]
        );
        assert_eq!(t.get_usize("rms_norm_eps"), None, "non-integral float");
        assert_eq!(c.get_usize("hidden_size"), None, "root lacks it");
        let e = t.require_usize("vocab_size").unwrap_err().to_string();
        assert!(e.contains("text_config") && e.contains("vocab_size"), "{e}");
        let e = t
            .require_usize("hidden_activation")
            .unwrap_err()
            .to_string();
        assert!(e.contains("expected non-negative integer"), "{e}");
        assert_eq!(t.require_f64("rope_theta").unwrap(), 1e6);
    }

    #[test]
    fn flat_config_is_its_own_text_config() {
        let c = HfConfig::parse(
            r#"{"architectures":["Gemma3ForCausalLM"],"hidden_size":640,"eos_token_id":1}"#,
            "x",
        )
        .unwrap();
        let t = c.text_config();
        assert!(!t.is_nested());
        assert_eq!(t.get_usize("hidden_size"), Some(640));
        assert_eq!(c.get_usize("hidden_size"), Some(640));
        assert_eq!(t.get_usize_array("eos_token_id").unwrap(), vec![1]);
    }

    #[test]
    fn bad_configs_are_errors() {
        assert!(matches!(
            HfConfig::parse("{", "c").unwrap_err(),
            FormatError::Json { .. }
        ));
        assert!(HfConfig::parse("[1]", "c").is_err());
        assert!(HfConfig::parse(r#"{"text_config": 3}"#, "c").is_err());
        let c = HfConfig::parse(r#"{"architectures": "x"}"#, "c").unwrap();
        assert!(c.architectures().is_empty());
    }

    #[test]
    fn load_from_dir_and_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), GEMMA4).unwrap();
        let a = HfConfig::load(dir.path()).unwrap();
        let b = HfConfig::load(&dir.path().join("config.json")).unwrap();
        assert_eq!(a, b);
        assert!(a.origin().ends_with("config.json"));
        let e = HfConfig::load(&dir.path().join("nope")).unwrap_err();
        assert!(matches!(e, FormatError::Io { .. }));
    }
}
