//! A request's beam-search parameters (`Request.beam`), checked against
//! what beam search cannot be combined with at the service's level; the
//! engine checks the rest (`gyre_engine::BeamSearch`).

use gyre_api::v1;

use crate::error::ServiceError;

/// A request's beam search, checked against what beam search cannot be
/// combined with at this level (sampling and stop strings; the engine
/// checks the rest). None: sampling.
pub(crate) fn beam(req: &v1::Request) -> Result<Option<gyre_engine::BeamSearch>, ServiceError> {
    use gyre_engine::{BeamSearch, EarlyStopping};
    let Some(b) = &req.beam else {
        return Ok(None);
    };
    let refuse = |field: &str, what: &str| {
        Err(ServiceError::invalid(
            field.to_string(),
            "UNSUPPORTED_WITH_BEAM_SEARCH",
            format!("beam search is deterministic and cannot be combined with {what}"),
        ))
    };
    let s = req.sampling.clone().unwrap_or_default();
    if s.temperature.is_some_and(|t| t != 0.0) {
        return refuse(
            "sampling.temperature",
            "a non-zero temperature (beam sampling is not supported)",
        );
    }
    let sampled = [
        ("sampling.top_p", s.top_p.is_some_and(|p| p != 1.0), "top_p"),
        ("sampling.top_k", s.top_k.is_some_and(|k| k != 0), "top_k"),
        ("sampling.min_p", s.min_p.is_some_and(|p| p != 0.0), "min_p"),
        ("sampling.seed", s.seed.is_some(), "a seed"),
        (
            "sampling.presence_penalty",
            s.presence_penalty.is_some_and(|p| p != 0.0),
            "presence_penalty",
        ),
        (
            "sampling.frequency_penalty",
            s.frequency_penalty.is_some_and(|p| p != 0.0),
            "frequency_penalty",
        ),
        (
            "sampling.repetition_penalty",
            s.repetition_penalty.is_some_and(|p| p != 1.0),
            "repetition_penalty",
        ),
        (
            "sampling.logit_bias",
            !s.logit_bias.is_empty(),
            "logit_bias",
        ),
    ];
    if let Some((field, _, what)) = sampled.iter().find(|x| x.1) {
        return refuse(field, what);
    }
    if !req.stop.is_empty() {
        return refuse("stop", "stop strings (stop_token_ids are supported)");
    }
    let early_stopping = match v1::EarlyStopping::try_from(b.early_stopping) {
        Ok(v1::EarlyStopping::Always) => EarlyStopping::Always,
        Ok(v1::EarlyStopping::Never) => EarlyStopping::Never,
        _ => EarlyStopping::Heuristic,
    };
    Ok(Some(BeamSearch {
        width: b.width,
        length_penalty: b.length_penalty.unwrap_or(1.0),
        early_stopping,
    }))
}
