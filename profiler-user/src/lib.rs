//! llmprof library.
