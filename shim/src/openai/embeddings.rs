//! `/v1/embeddings`: the request body as OpenAI (and vLLM) define it, read
//! with a precise `param` for every mistake, and the `CreateEmbeddingResponse`
//! it is answered with (vectors as JSON floats or base64 of little-endian
//! float32).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::int;
use crate::error::ApiError;
use crate::extract::{fields, require};

/// The inputs of a request: texts or token-id lists.
#[derive(Debug, Clone, PartialEq)]
pub enum EmbeddingInput {
    Texts(Vec<String>),
    TokenIds(Vec<Vec<u32>>),
}

/// How vectors are sent back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodingFormat {
    Float,
    Base64,
}

/// A parsed `/v1/embeddings` body.
#[derive(Debug, Clone)]
pub struct EmbeddingRequest {
    pub model: String,
    pub input: EmbeddingInput,
    pub encoding_format: EncodingFormat,
    pub dimensions: Option<u32>,
    pub truncate_prompt_tokens: Option<i32>,
}

#[derive(Deserialize)]
struct Params {
    model: String,
    encoding_format: Option<String>,
    #[serde(default, deserialize_with = "int::opt")]
    dimensions: Option<u32>,
    #[serde(default, deserialize_with = "int::opt")]
    truncate_prompt_tokens: Option<i32>,
    /// Accepted and ignored, as OpenAI's end-user id.
    #[serde(rename = "user")]
    _user: Option<String>,
}

fn bad_input(message: &str) -> ApiError {
    ApiError::invalid_request(message, Some("input"))
}

/// A token id: a whole number in u32's range.
fn token(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|u| u32::try_from(u).ok())
}

/// `input`: a string, a list of strings, a list of token ids, or a list of
/// token-id lists. Emptiness and the count are the service's to check (it
/// says which input); only the shape is checked here.
fn input(v: &Value) -> Result<EmbeddingInput, ApiError> {
    const SHAPE: &str = "'input' must be a string, a list of strings, a list of token ids, or a list of token-id lists.";
    match v {
        Value::String(s) => Ok(EmbeddingInput::Texts(vec![s.clone()])),
        Value::Array(items) => {
            let Some(first) = items.first() else {
                return Ok(EmbeddingInput::Texts(Vec::new()));
            };
            match first {
                Value::String(_) => items
                    .iter()
                    .map(|i| {
                        i.as_str()
                            .map(str::to_owned)
                            .ok_or_else(|| bad_input(SHAPE))
                    })
                    .collect::<Result<_, _>>()
                    .map(EmbeddingInput::Texts),
                Value::Number(_) => items
                    .iter()
                    .map(|i| {
                        token(i).ok_or_else(|| {
                            bad_input("Token ids must be integers from 0 to 4294967295.")
                        })
                    })
                    .collect::<Result<_, _>>()
                    .map(|ids| EmbeddingInput::TokenIds(vec![ids])),
                Value::Array(_) => items
                    .iter()
                    .map(|list| match list {
                        Value::Array(ids) => ids
                            .iter()
                            .map(|i| {
                                token(i).ok_or_else(|| {
                                    bad_input("Token ids must be integers from 0 to 4294967295.")
                                })
                            })
                            .collect::<Result<Vec<u32>, _>>(),
                        _ => Err(bad_input(SHAPE)),
                    })
                    .collect::<Result<_, _>>()
                    .map(EmbeddingInput::TokenIds),
                _ => Err(bad_input(SHAPE)),
            }
        }
        _ => Err(bad_input(SHAPE)),
    }
}

impl EmbeddingRequest {
    pub fn from_body(body: &Value) -> Result<Self, ApiError> {
        require(body, &["model", "input"])?;
        let p: Params = fields(body)?;
        let encoding_format = match p.encoding_format.as_deref() {
            None | Some("float") => EncodingFormat::Float,
            Some("base64") => EncodingFormat::Base64,
            Some(other) => {
                return Err(ApiError::invalid_request(
                    format!(
                        "Invalid 'encoding_format': `{}`; supported: float, base64.",
                        gyre_api::clip(other)
                    ),
                    Some("encoding_format"),
                ));
            }
        };
        if p.dimensions == Some(0) {
            return Err(ApiError::invalid_request(
                "'dimensions' must be at least 1.",
                Some("dimensions"),
            ));
        }
        Ok(Self {
            model: p.model,
            input: input(&body["input"])?,
            encoding_format,
            dimensions: p.dimensions,
            truncate_prompt_tokens: p.truncate_prompt_tokens,
        })
    }
}

/// One vector: floats, or base64 of their little-endian float32 bytes.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Vector {
    Float(Vec<f32>),
    Base64(String),
}

impl Vector {
    pub fn new(values: Vec<f32>, format: EncodingFormat) -> Self {
        match format {
            EncodingFormat::Float => Self::Float(values),
            EncodingFormat::Base64 => {
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                Self::Base64(base64(&bytes))
            }
        }
    }
}

#[derive(Debug, Serialize)]
pub struct Embedding {
    pub object: &'static str,
    pub index: usize,
    pub embedding: Vector,
}

#[derive(Debug, Serialize)]
pub struct EmbeddingUsage {
    pub prompt_tokens: u32,
    pub total_tokens: u32,
}

/// `CreateEmbeddingResponse`.
#[derive(Debug, Serialize)]
pub struct EmbeddingList {
    pub object: &'static str,
    pub data: Vec<Embedding>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

/// Standard base64 (RFC 4648, with padding).
pub fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ABC[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (raw, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(raw.as_bytes()), enc);
        }
        assert_eq!(base64(&[0xff, 0xfe, 0xfd]), "//79");
    }

    #[test]
    fn input_takes_each_openai_shape() {
        let parse = |v: Value| input(&v);
        assert_eq!(
            parse(json!("hi")).ok(),
            Some(EmbeddingInput::Texts(vec!["hi".into()]))
        );
        assert_eq!(
            parse(json!(["a", "b"])).ok(),
            Some(EmbeddingInput::Texts(vec!["a".into(), "b".into()]))
        );
        assert_eq!(
            parse(json!([1, 2])).ok(),
            Some(EmbeddingInput::TokenIds(vec![vec![1, 2]]))
        );
        assert_eq!(
            parse(json!([[1], [2, 3]])).ok(),
            Some(EmbeddingInput::TokenIds(vec![vec![1], vec![2, 3]]))
        );
        for bad in [
            json!(["a", 1]),
            json!([1, "a"]),
            json!([-1]),
            json!([1.5]),
            json!({"a": 1}),
            json!(7),
            json!([[1], 2]),
            json!([null]),
        ] {
            let e = parse(bad.clone()).expect_err("refused");
            assert_eq!(e.body()["error"]["param"], "input", "{bad}");
        }
    }
}
