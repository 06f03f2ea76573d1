//! What L1 needs to know of a GGUF file without loading it: its tensors'
//! names, shapes, types and stored sizes, read from the header alone.
//!
//! From those come the two per-token figures of L1's ceilings: the bytes a
//! decode step must read (every weight but the token-embedding table, which a
//! step reads one row of, unless the same table is the output projection) and
//! the parameters a token's forward pass multiplies (the same tensors, 2-D
//! and up: norms' vectors are left out). A tensor's stored size is the gap to
//! the next tensor's offset (the last one: to the end of the file), so no
//! table of block sizes per type is needed; alignment padding (under 32 bytes
//! a tensor) is counted with it.

use std::collections::BTreeMap;
use std::io::{BufReader, Read};
use std::path::Path;

use anyhow::{Context as _, bail, ensure};
use serde::Serialize;

/// One tensor of the file.
#[derive(Debug, Clone, Serialize)]
pub struct Tensor {
    pub name: String,
    /// GGUF order: the fastest-varying dimension first.
    pub dims: Vec<u64>,
    /// The ggml type id.
    pub ggml_type: u32,
    /// Bytes stored, from the tensor's offset to the next one's.
    pub bytes: u64,
}

impl Tensor {
    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A GGUF file's tensors.
#[derive(Debug, Clone, Serialize)]
pub struct GgufInfo {
    pub tensors: Vec<Tensor>,
    pub file_bytes: u64,
}

impl GgufInfo {
    /// Reads the header of the GGUF file at `path`.
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let file =
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let file_bytes = file.metadata()?.len();
        Self::parse(BufReader::new(file), file_bytes)
            .with_context(|| format!("reading the GGUF header of {}", path.display()))
    }

    /// Parses a header from `r`, of a file `file_bytes` long.
    pub fn parse(r: impl Read, file_bytes: u64) -> anyhow::Result<Self> {
        let mut r = Reader { r, pos: 0 };
        ensure!(&r.bytes(4)? == b"GGUF", "not a GGUF file");
        let version = r.u32()?;
        ensure!(version >= 2, "GGUF version {version} is not supported");
        let (n_tensors, n_kv) = (r.u64()?, r.u64()?);
        let mut alignment = 32u64;
        for _ in 0..n_kv {
            let key = r.string()?;
            let ty = r.u32()?;
            if key == "general.alignment" && ty == 4 {
                alignment = u64::from(r.u32()?).max(1);
            } else {
                r.skip_value(ty)?;
            }
        }
        let mut tensors = Vec::new();
        let mut offsets = Vec::new();
        for _ in 0..n_tensors {
            let name = r.string()?;
            let n_dims = r.u32()?;
            ensure!(n_dims <= 8, "tensor {name} has {n_dims} dimensions");
            let dims = (0..n_dims).map(|_| r.u64()).collect::<Result<_, _>>()?;
            let ggml_type = r.u32()?;
            offsets.push(r.u64()?);
            tensors.push(Tensor {
                name,
                dims,
                ggml_type,
                bytes: 0,
            });
        }
        let data_start = r.pos.div_ceil(alignment) * alignment;
        let data_bytes = file_bytes
            .checked_sub(data_start)
            .context("the file ends inside its header")?;
        let mut ends: Vec<u64> = offsets.clone();
        ends.push(data_bytes);
        ends.sort_unstable();
        for (t, &offset) in tensors.iter_mut().zip(&offsets) {
            let next = ends.iter().find(|&&e| e > offset).copied();
            t.bytes = next.context("a tensor starts past the end of the file")? - offset;
        }
        Ok(Self {
            tensors,
            file_bytes,
        })
    }

    /// The tensors a decode step reads whole: all but `token_embd.weight`
    /// when a separate `output.weight` exists.
    fn per_token(&self) -> impl Iterator<Item = &Tensor> {
        let untied = self.tensors.iter().any(|t| t.name == "output.weight");
        self.tensors
            .iter()
            .filter(move |t| !(untied && t.name == "token_embd.weight"))
    }

    /// Bytes of weights a decode step reads (see the module comment).
    pub fn bytes_per_token(&self) -> u64 {
        self.per_token().map(|t| t.bytes).sum()
    }

    /// Parameters a token's forward pass multiplies (matrices only).
    pub fn params_per_token(&self) -> u64 {
        self.per_token()
            .filter(|t| t.dims.len() >= 2)
            .map(Tensor::elements)
            .sum()
    }

    /// Parameters of the output head (`output.weight`, or the embedding
    /// when the file ties them): the part of a token's matrices a prompt
    /// position other than the last does not need.
    pub fn head_params(&self) -> u64 {
        ["output.weight", "token_embd.weight"]
            .iter()
            .find_map(|name| self.tensors.iter().find(|t| t.name == *name))
            .map_or(0, Tensor::elements)
    }

    /// The vocabulary size: `token_embd.weight`'s second dimension.
    pub fn vocab_size(&self) -> Option<u64> {
        let t = self
            .tensors
            .iter()
            .find(|t| t.name == "token_embd.weight")?;
        t.dims.get(1).copied()
    }

    /// Bytes stored per ggml type name, matrices only.
    pub fn bytes_by_type(&self) -> BTreeMap<&'static str, u64> {
        let mut out = BTreeMap::new();
        for t in self.tensors.iter().filter(|t| t.dims.len() >= 2) {
            *out.entry(type_name(t.ggml_type)).or_default() += t.bytes;
        }
        out
    }

    /// The types holding at least 1% of the matrices' bytes, most
    /// first, for a label: "F32", or a mixed file's "Q4_1 + Q8_0".
    pub fn type_mix(&self) -> String {
        let by_type = self.bytes_by_type();
        let total: u64 = by_type.values().sum();
        let mut types: Vec<(&str, u64)> = by_type
            .into_iter()
            .filter(|&(_, b)| b * 100 >= total)
            .collect();
        types.sort_by_key(|&(_, b)| std::cmp::Reverse(b));
        let names: Vec<&str> = types.into_iter().map(|(n, _)| n).collect();
        if names.is_empty() {
            "?".into()
        } else {
            names.join(" + ")
        }
    }

    /// The type holding most of the matrices' bytes (e.g. "Q4_1").
    pub fn main_type(&self) -> &'static str {
        self.bytes_by_type()
            .into_iter()
            .max_by_key(|(_, b)| *b)
            .map_or("?", |(name, _)| name)
    }
}

/// The name of ggml type `id` (those GGUF files of Llama-family models use).
pub fn type_name(id: u32) -> &'static str {
    match id {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        6 => "Q5_0",
        7 => "Q5_1",
        8 => "Q8_0",
        10 => "Q2_K",
        11 => "Q3_K",
        12 => "Q4_K",
        13 => "Q5_K",
        14 => "Q6_K",
        15 => "Q8_K",
        30 => "BF16",
        _ => "other",
    }
}

/// Little-endian reads that count the bytes consumed.
struct Reader<R> {
    r: R,
    pos: u64,
}

impl<R: Read> Reader<R> {
    fn bytes(&mut self, n: usize) -> anyhow::Result<Vec<u8>> {
        let mut buf = vec![0; n];
        self.r.read_exact(&mut buf).context("truncated header")?;
        self.pos += n as u64;
        Ok(buf)
    }

    fn array<const N: usize>(&mut self) -> anyhow::Result<[u8; N]> {
        let mut buf = [0; N];
        self.r.read_exact(&mut buf).context("truncated header")?;
        self.pos += N as u64;
        Ok(buf)
    }

    fn u32(&mut self) -> anyhow::Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> anyhow::Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn string(&mut self) -> anyhow::Result<String> {
        let len = self.u64()?;
        ensure!(len < 1 << 24, "a header string of {len} bytes");
        Ok(String::from_utf8_lossy(&self.bytes(len as usize)?).into_owned())
    }

    /// Skips a metadata value of type `ty`.
    fn skip_value(&mut self, ty: u32) -> anyhow::Result<()> {
        match ty {
            8 => {
                self.string()?;
            }
            9 => {
                let (item, n) = (self.u32()?, self.u64()?);
                match scalar_size(item) {
                    Some(size) => self.skip(n * size)?,
                    None => {
                        for _ in 0..n {
                            self.skip_value(item)?;
                        }
                    }
                }
            }
            _ => {
                let size = scalar_size(ty).with_context(|| format!("metadata type {ty}"))?;
                self.skip(size)?;
            }
        }
        Ok(())
    }

    fn skip(&mut self, n: u64) -> anyhow::Result<()> {
        let skipped = std::io::copy(&mut (&mut self.r).take(n), &mut std::io::sink())?;
        if skipped != n {
            bail!("truncated header");
        }
        self.pos += n;
        Ok(())
    }
}

/// Bytes of a scalar metadata type; None for strings and arrays.
fn scalar_size(ty: u32) -> Option<u64> {
    match ty {
        0 | 1 | 7 => Some(1),
        2 | 3 => Some(2),
        4..=6 => Some(4),
        10..=12 => Some(8),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A GGUF file: `kv` (key, type, value bytes), then `tensors` (name,
    /// dims, type, data bytes), laid out as llama.cpp's writer does.
    fn gguf(kv: &[(&str, u32, Vec<u8>)], tensors: &[(&str, &[u64], u32, usize)]) -> Vec<u8> {
        let string = |s: &str| {
            [
                (s.len() as u64).to_le_bytes().to_vec(),
                s.as_bytes().to_vec(),
            ]
            .concat()
        };
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((tensors.len() as u64).to_le_bytes());
        out.extend((kv.len() as u64).to_le_bytes());
        for (key, ty, value) in kv {
            out.extend(string(key));
            out.extend(ty.to_le_bytes());
            out.extend(value);
        }
        let mut offset = 0u64;
        for (name, dims, ty, bytes) in tensors {
            out.extend(string(name));
            out.extend((dims.len() as u32).to_le_bytes());
            dims.iter().for_each(|d| out.extend(d.to_le_bytes()));
            out.extend(ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += (*bytes as u64).div_ceil(32) * 32;
        }
        out.resize(out.len().div_ceil(32) * 32, 0);
        for (_, _, _, bytes) in tensors {
            out.resize(out.len() + bytes.div_ceil(32) * 32, 7);
        }
        out
    }

    fn info(bytes: &[u8]) -> GgufInfo {
        GgufInfo::parse(bytes, bytes.len() as u64).expect("parses")
    }

    #[test]
    fn reads_sizes_past_every_kind_of_metadata() {
        let strings = [
            8u32.to_le_bytes().to_vec(),
            2u64.to_le_bytes().to_vec(),
            1u64.to_le_bytes().to_vec(),
            b"a".to_vec(),
            2u64.to_le_bytes().to_vec(),
            b"bc".to_vec(),
        ]
        .concat();
        let floats = [
            6u32.to_le_bytes().to_vec(),
            3u64.to_le_bytes().to_vec(),
            vec![0; 12],
        ]
        .concat();
        let kv = [
            (
                "general.name",
                8,
                [4u64.to_le_bytes().to_vec(), b"tiny".to_vec()].concat(),
            ),
            ("tokenizer.ggml.tokens", 9, strings),
            ("tokenizer.ggml.scores", 9, floats),
            ("llama.context_length", 4, 2048u32.to_le_bytes().to_vec()),
            ("llama.rope.freq_base", 6, 1e4f32.to_le_bytes().to_vec()),
            ("general.flag", 7, vec![1]),
            ("general.big", 10, 5u64.to_le_bytes().to_vec()),
        ];
        // Q4_1 blocks: 20 bytes per 32 values; F32 4 bytes a value.
        let file = gguf(
            &kv,
            &[
                ("token_embd.weight", &[64, 100], 3, 100 * 2 * 20),
                ("blk.0.attn_norm.weight", &[64], 0, 64 * 4),
                ("blk.0.attn_q.weight", &[64, 64], 3, 64 * 2 * 20),
            ],
        );
        let info = info(&file);
        let bytes: Vec<u64> = info.tensors.iter().map(|t| t.bytes).collect();
        assert_eq!(bytes, vec![4000, 256, 2560]);
        assert_eq!(info.vocab_size(), Some(100));
        assert_eq!(info.main_type(), "Q4_1");
        // Tied: the embedding table is the output projection, read whole.
        assert_eq!(info.bytes_per_token(), 4000 + 256 + 2560);
        assert_eq!(info.params_per_token(), 6400 + 4096);
        assert_eq!(info.head_params(), 6400);
    }

    #[test]
    fn an_untied_embedding_table_is_not_read_per_token() {
        let file = gguf(
            &[("general.alignment", 4, 32u32.to_le_bytes().to_vec())],
            &[
                ("token_embd.weight", &[8, 10], 0, 320),
                ("output.weight", &[8, 10], 0, 320),
                ("output_norm.weight", &[8], 0, 32),
            ],
        );
        let info = info(&file);
        assert_eq!(info.bytes_per_token(), 320 + 32);
        assert_eq!(info.params_per_token(), 80);
        assert_eq!(info.head_params(), 80);
        assert_eq!(info.main_type(), "F32");
    }

    #[test]
    fn a_mixed_file_is_labelled_by_its_types_largest_first() {
        let t = |name: &str, ggml_type: u32, bytes: u64| Tensor {
            name: name.into(),
            dims: vec![32, 4],
            ggml_type,
            bytes,
        };
        let info = GgufInfo {
            tensors: vec![
                t("a", 8, 700),
                t("b", 6, 250),
                t("c", 12, 45),
                t("d", 14, 5),
                Tensor {
                    name: "norm".into(),
                    dims: vec![1 << 18],
                    ggml_type: 0,
                    bytes: 1 << 20,
                },
            ],
            file_bytes: 0,
        };
        // The 1-d norm does not count; Q6_K's 0.5% is left out.
        assert_eq!(info.type_mix(), "Q8_0 + Q5_0 + Q4_K");
        assert_eq!(info.main_type(), "Q8_0");
        let one = GgufInfo {
            tensors: vec![t("a", 0, 10)],
            file_bytes: 0,
        };
        assert_eq!(one.type_mix(), "F32");
    }

    #[test]
    fn rejects_what_is_not_gguf() {
        assert!(GgufInfo::parse(&b"GGML\x03\0\0\0"[..], 8).is_err());
        let file = gguf(&[], &[("a", &[4], 0, 16)]);
        assert!(GgufInfo::parse(&file[..30], 30).is_err());
    }
}
