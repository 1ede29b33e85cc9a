//! (placeholder: being written)
pub struct Model; pub struct ModelConfig;
