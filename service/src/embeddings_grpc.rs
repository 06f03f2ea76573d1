//! The `gyre.v1.Embeddings` service over the hosted embedding models: input
//! checks and tokenizing off the async threads, then the model's embedding
//! worker, which batches concurrent calls together. Each call has its
//! `gyre::request` log line and, traced, its span (`observe`).

use std::sync::Arc;

use gyre_api::v1::{
    self, EmbedRequest, EmbedResponse, GetEmbedStatsRequest, embed_request,
    embeddings_server::Embeddings,
};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::access::Caller;
use crate::embeddings::{Inputs, embed_error};
use crate::error::ServiceError;
use crate::grpc::model_metadata;
use crate::observe::RequestObs;
use crate::registry::{Entry, Registry};

#[derive(Clone)]
pub struct EmbeddingsService {
    models: Arc<Registry>,
    draining: watch::Receiver<bool>,
}

impl EmbeddingsService {
    pub fn new(models: Arc<Registry>, draining: watch::Receiver<bool>) -> Self {
        Self { models, draining }
    }

    async fn embed(
        &self,
        req: EmbedRequest,
        caller: Option<Caller>,
    ) -> Result<(EmbedResponse, Arc<Entry>), ServiceError> {
        if *self.draining.borrow() {
            return Err(ServiceError::Draining);
        }
        let (entry, model) = self.models.embedder(&req.model)?;
        if let Some(c) = &caller {
            c.check_model(&entry.card.id, entry.names())?;
        }
        let inputs = match req.inputs {
            Some(embed_request::Inputs::Texts(t)) => Inputs::Texts(t.texts),
            Some(embed_request::Inputs::TokenIds(t)) => {
                Inputs::TokenIds(t.lists.into_iter().map(|l| l.ids).collect())
            }
            None => Inputs::Texts(Vec::new()),
        };
        let (truncate, dims) = (req.truncate_prompt_tokens, req.dimensions);
        let m = model.clone();
        let ids = tokio::task::spawn_blocking(move || m.prepare(inputs, truncate, dims))
            .await
            .map_err(|e| ServiceError::Internal(e.to_string()))??;
        let counts: Vec<u32> = ids.iter().map(|i| i.len() as u32).collect();
        // Embeddings use exactly their input tokens: admitted and settled
        // at that count.
        let tokens = counts.iter().map(|&c| u64::from(c)).sum();
        let _admission = match &caller {
            Some(c) => {
                let a = c.admit(tokens)?;
                a.submitted(tokens);
                Some(a)
            }
            None => None,
        };
        let vectors = model.engine.embed(ids, dims).await.map_err(embed_error)?;
        let total: u32 = counts.iter().sum();
        let response = EmbedResponse {
            model: model.id.clone(),
            embeddings: vectors
                .into_iter()
                .zip(counts)
                .map(|(values, prompt_tokens)| v1::Embedding {
                    values,
                    prompt_tokens,
                })
                .collect(),
            usage: Some(v1::EmbedUsage {
                prompt_tokens: total,
                total_tokens: total,
            }),
        };
        Ok((response, entry))
    }
}

#[tonic::async_trait]
impl Embeddings for EmbeddingsService {
    async fn embed(
        &self,
        request: Request<EmbedRequest>,
    ) -> Result<Response<EmbedResponse>, Status> {
        let caller = Caller::of(&request);
        // Logged (and traced) when the call is answered.
        let obs = RequestObs::start(&request, "gyre.v1.Embeddings/Embed");
        let req = request.into_inner();
        obs.describe("embeddings", &req.model, "");
        let (out, entry) = EmbeddingsService::embed(self, req, caller)
            .await
            .inspect_err(|e| obs.failed_with(e))?;
        let tokens = out.usage.as_ref().map_or(0, |u| u.prompt_tokens);
        obs.embedded(&entry.card.id, tokens);
        let mut response = Response::new(out);
        model_metadata(response.metadata_mut(), &entry);
        Ok(response)
    }

    async fn get_embed_stats(
        &self,
        request: Request<GetEmbedStatsRequest>,
    ) -> Result<Response<v1::EmbedStats>, Status> {
        let (_, model) = self.models.embedder(&request.into_inner().model)?;
        let s = model.engine.stats();
        Ok(Response::new(v1::EmbedStats {
            model: model.id.clone(),
            requests_total: s.requests_total,
            inputs_total: s.inputs_total,
            tokens_total: s.tokens_total,
            steps_total: s.steps_total,
            max_step_requests: s.max_step_requests,
            max_step_inputs: s.max_step_inputs,
            pending: s.pending,
        }))
    }
}
