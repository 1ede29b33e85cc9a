//! Test doubles for the engine's unit tests: a fake model, a fake backend and a small engine built on them.
//!
//! Owns only test scaffolding (compiled under `cfg(test)`); it must never be used outside the engine's tests
//! or grow logic the tests would then have to trust.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc as tmpsc;

use super::{Chunk, EngineConfig, EngineHandle, Finish, GenRequest, ModelHandle};
use crate::backend::{Backend, BackendError, BatchItem};
use crate::metrics::Metrics;
use crate::model::ModelConfig;
use crate::sampling::SamplingParams;
use crate::scheduler::SchedulerConfig;

/// A fake model: token 3 is "a", token 0 is EOS; context 1000.
struct FakeModel;

impl ModelHandle for FakeModel {
    fn name(&self) -> &str {
        "fake"
    }
    fn context_len(&self) -> usize {
        1000
    }
    fn eos_token_ids(&self) -> &[u32] {
        &[0]
    }
    fn token_bytes(&self, id: u32) -> &[u8] {
        if id == 3 { b"a" } else { b"?" }
    }
    fn is_special(&self, id: u32) -> bool {
        id == 0
    }
    fn encode_prompt(&self, text: &str) -> Vec<u32> {
        text.bytes().map(|_| 5).collect()
    }
    fn encode_chat(&self, text: &str) -> Vec<u32> {
        self.encode_prompt(text)
    }
    fn render_chat(&self, _m: &[(String, String)]) -> Result<String, String> {
        Err("none".into())
    }
}

/// A fake backend whose logits always favour token 3.
struct FakeBackend(ModelConfig);

impl Backend for FakeBackend {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn device_clock(&self) -> llmprof_abi::DeviceClock {
        llmprof_abi::DeviceClock::HostCompute
    }
    fn config(&self) -> &ModelConfig {
        &self.0
    }
    fn forward(&mut self, batch: &[BatchItem<'_>]) -> Result<crate::backend::StepOutput, BackendError> {
        // Some compute time, so requests live long enough to be cancelled.
        std::thread::sleep(Duration::from_millis(1));
        let mut logits = vec![0.0f32; 8];
        logits[3] = 10.0;
        let wanted = batch.iter().filter(|b| b.logits.wanted()).count();
        let full = batch.iter().filter(|b| b.logits.is_full()).count();
        let logprobs = batch
            .iter()
            .filter(|b| b.logits.wants_logprobs())
            .map(|_| crate::sampling::TokenLogprobs {
                logprob: -0.5,
                top: vec![(3, -0.5), (0, -2.0)],
            })
            .collect();
        Ok(crate::backend::StepOutput {
            tokens: vec![3; wanted],
            logprobs,
            logits: vec![logits; full],
            device_start_ns: 1,
            device_end_ns: 2,
            graph_batch: 0,
        })
    }
    fn swap_weights(&mut self, _model: Arc<crate::model::Model>) -> Result<(), BackendError> {
        Ok(())
    }
}

/// An engine on the fake model and backend: 64 KV blocks of 4 slots, 4 sequences, 8 queued requests, and
/// `stream_capacity` messages per client stream.
pub(super) fn engine(stream_capacity: usize) -> Arc<EngineHandle> {
    let cfg = ModelConfig {
        vocab_size: 8,
        n_layers: 1,
        n_heads: 1,
        n_kv_heads: 1,
        head_dim: 2,
        dim: 2,
        ffn_dim: 2,
        context_len: 1000,
        rope_base: 1e4,
        rms_eps: 1e-5,
        bos_token_id: None,
        eos_token_ids: vec![0],
        name: "fake".into(),
    };
    let ecfg = EngineConfig {
        scheduler: SchedulerConfig {
            max_num_seqs: 4,
            max_num_batched_tokens: 64,
        },
        num_blocks: 64,
        block_size: 4,
        max_queue: 8,
        stream_capacity,
        served_model_name: "fake".into(),
    };
    let metrics = Arc::new(Metrics::new("fake", 1000));
    EngineHandle::start(Box::new(FakeBackend(cfg)), Arc::new(FakeModel), ecfg, metrics)
        .expect("the fake engine starts")
}

/// A greedy request of a 3-token prompt for up to `max_tokens` tokens.
pub(super) fn req(max_tokens: usize) -> GenRequest {
    GenRequest {
        prompt: vec![5, 5, 5],
        max_tokens,
        sampling: SamplingParams::greedy(),
        seed: None,
        logprobs: None,
        stop: vec![],
        trace: None,
        x_request_id: None,
        is_chat: false,
        arrival: Instant::now(),
    }
}

/// Reads a stream to its finish: the whole text, the number of messages, the finish.
pub(super) fn drain(rx: &mut tmpsc::Receiver<Chunk>) -> (String, usize, Finish) {
    let mut text = String::new();
    let mut msgs = 0;
    loop {
        let c = rx.blocking_recv().expect("stream ends with a finish");
        msgs += 1;
        text.push_str(&c.text);
        if let Some(f) = c.finish {
            return (text, msgs, f);
        }
    }
}
