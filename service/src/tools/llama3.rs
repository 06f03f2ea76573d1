//! Llama 3.1 / 3.2 / 3.3 (`llama3_json`): the whole output is
//! `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`,
//! several separated by `;`. Read by the whole-output machine (`json`).

pub(super) const PYTHON_TAG: &str = "<|python_tag|>";
