//! llmserve: a GGUF Llama-family inference engine with continuous batching after vLLM's design, a paged KV
//! cache, vLLM-named Prometheus metrics and llmprof probe points.
//!
//! Model side: [`gguf`] (file format), [`quant`] (tensor types and SIMD kernels), [`attention`] (the CPU
//! attention kernel), [`tokenizer`], [`chat_template`], [`model`] (weights + config), [`backend`] (the compute
//! trait; CPU backend). Tiny generated models for tests come from the test crate (`e2e::gguf`), not from here.
//! Serving side: [`block_pool`], [`kv_cache_manager`], [`scheduler`], [`sampling`], [`engine`] (the step loop),
//! [`api`] (OpenAI-compatible HTTP), [`metrics`], [`trace_context`] (W3C traceparent), [`config`],
//! [`usage_stats`] (the optional outbound usage report).

// Model side (owner: engine-model).
pub mod attention;
pub mod backend;
pub mod chat_template;
pub mod gguf;
pub mod model;
pub mod quant;
pub mod tokenizer;

// Serving side (owner: engine-serve).
pub mod api;
pub mod block_pool;
pub mod config;
pub mod engine;
pub mod kv_cache_manager;
pub mod metrics;
pub mod sampling;
pub mod scheduler;
pub mod trace_context;
pub mod usage_stats;
