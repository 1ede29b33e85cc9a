//! llmserve library.
